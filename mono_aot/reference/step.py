"""The draft step of one TP rank in torch on the CPU: the oracle every kernel is judged against.

``rank_step`` is one rank's step exactly as the README's "The draft step in torch" defines it, computed from the same tensors
the kernels receive (the runner's ``packed`` GEMV tensors, bf16 norm weights, fp32 K/V scales,
the bf16 ``cos_sin`` cache, the paged uint8 caches, block table, positions, slots, seq_lens).
It is a generator: at each of a layer's two all-reduces it yields ``(layer, phase, partial)``
and expects the all-reduced sum back (``send``). ``run_tp`` drives every rank in lockstep and
exchanges the partials; ``step_rank`` runs one rank against other ranks' partials given up
front (a single-GPU kernel test can pre-fill the peer mailboxes with the same values).

Per layer (``n`` tokens, request ``i`` owns token rows ``i*qpr..(i+1)*qpr-1``):

1. ``h = norm(x, w_in)``, Gemma RMSNorm ``x * rsqrt(mean(x^2) + eps) * (1 + w)``.
2. ``qkv = (h @ decode(qkv_w)^T) * qkv_s``; rows: the rank's q heads, K head(s), V head(s).
   (mxfp8 weights: ``h @ W^T`` with ``W`` the dequantized blocks, ``weights.dequantize_mx``;
   likewise in steps 6 and 7.)
   (Computed as ``rsqrt(mean(x^2) + eps) * ((x * (1 + w)) @ decode(W)^T) * s``, the kernels'
   factorisation: the same value in float64.)
3. Gemma norm of each q head (``w_q``) and each K head (``w_k``) over ``head_dim``; NeoX RoPE
   on the first ``rotary_dim`` dims: ``x1 = x[:r/2]``, ``x2 = x[r/2:r]``, ``out1 = x1*cos -
   x2*sin``, ``out2 = x2*cos + x1*sin`` with ``cos = cos_sin[pos, :r/2]``, ``sin = cos_sin[pos,
   r/2:]``; the dims past ``rotary_dim`` pass through. V is neither normed nor rotated.
4. Cache bytes ``encode(k / k_scale) | encode(v / v_scale)`` (round to nearest even, saturating
   at +-fp8 max) are written at each token's slot; slot ``-1`` writes nothing (the bytes are
   still computed and returned).
5. Attention of every token of request ``i`` over the cached positions ``j < seq_lens[i]`` of
   request ``i`` (read back through the block table after step 4, dequantized with the scales)
   that its window admits (``key_window``: with ``model.window``, ``j > position - window``;
   non-causal unless ``model.causal``), scale ``1/sqrt(head_dim)``, local q head ``j`` using
   local KV head ``j // (q_heads_per_rank / kv_heads_per_rank)``. A token that attends
   nothing (a request with ``seq_lens[i] == 0``) gets zeros. Nothing outside those positions
   is read (the tests fill everything else with NaN codes, and leave the block-table entries
   of blocks below the window garbage).
6. ``x += allreduce((attn @ decode(o_w)^T) * o_s)``, summed in rank order ``0..tp-1``.
7. ``h = norm(x, w_post)``; ``[g | u] = (h @ decode(gu_w)^T) * gu_s``; ``gc = min(g, limit)``;
   ``a = gc * sigmoid(alpha * gc) * (clamp(u, -limit, limit) + 1)``;
   ``x += allreduce((a @ decode(d_w)^T) * d_s)``.

After the last layer ``out = norm(x, final_norm)``.

Rounding (``numerics``):

- ``"float64"`` (default): every value above is computed and kept in float64; nothing is
  rounded to bf16 or fp32 anywhere and the output stays float64. The only roundings are those
  the step itself defines: the fp8 weight codes (data), and the fp8 K/V cache (step 4), whose
  bytes attention reads back (step 5), so this step's own K/V reach attention as
  ``decode(encode(k / k_scale)) * k_scale``. The inputs ``x`` (bf16), norm weights (bf16) and
  ``cos_sin`` (bf16) are used exactly as given. The dense model is compared with this mode to
  1e-10.
- ``"kernel"``: the kernels' storage points, as ``mono_aot.spec.abi`` lays them out (README:
  fp32 math, bf16 storage of activations). Arithmetic between two storage points is float64
  (more accurate than any fp32 summation order, so it is the value every correct kernel
  approximates) and each stored value is rounded to its storage dtype:

  * residual ``x``: fp32 (``fp32(bf16 x)`` at the start, again after each all-reduce add);
  * norm -> GEMV (scratch ``h``): the GEMV input is ``bf16(fp32(x * fp32(1 + w)))``, *not yet
    normalised*; the GEMV epilogue multiplies by ``rsqrt(mean(x^2) + eps)`` of the fp32 ``x``
    (float64 here; the kernels' fp32 sum of squares, atomically added in varying order,
    differs by about an fp32 ulp);
  * ``qkv`` and the gate/up outputs: fp32; q and k after norm + RoPE: fp32;
  * K/V bytes: ``encode(fp32(k / k_scale))`` with k the fp32 value after norm + RoPE (v straight
    from ``qkv``), one correctly rounded fp32 division (the kernels divide, they do not multiply
    by a reciprocal), saturated to +-max before the cvt (the kernels clamp);
  * attention output (scratch ``attn``): bf16; SwiGLU output (scratch ``act``): bf16;
  * each all-reduce partial (peer mailbox blocks): ``bf16(fp32(.))``, for every rank including
    the own one, so every rank adds the same four values;
  * ``out``: ``bf16(fp32(.))``.

  Register-level roundings inside a phase (the attention phases' bf16 MFMA operands for q and
  the probabilities) are not modelled: they are the kernel's business and change the bf16
  attention output by about one bf16 ulp.
- ``"stock"``: a model of vLLM 0.34's own layers for this model (``MiniMaxM3DSparkModel`` in
  ``vllm/models/minimax_m3/common/dspark.py``): every activation is stored in the model's
  bf16 (residual, norm outputs, ``qkv``, q and k after norm + RoPE, attention and SwiGLU
  outputs, partials, ``out``), and each projection's input is quantised to MXFP8 first
  (``mx_quantize``), as its linear layers' dynamic MXFP8 input quantisation does. The K/V
  bytes follow the same rule as above. It is not judged against; ``judge`` in
  ``mono_aot/selftest/cases.py`` reports how far it and the kernels land from the float64
  step, so the README can say how the kernels' bf16 activations compare with the stock path.

What a kernel can be held to. The step is chaotic at the storage level: one bf16 flip of an
attention output moves that token's residual by ~1e-4, and a value on an fp8 rounding midpoint
moves a cached K/V by a whole code (~6%). So:

- K/V bytes of layer 0 are exact: its inputs are exactly the kernel's, and only values within
  ~1e-5 (relative) of an fp8 rounding midpoint may encode one code apart -- no reference can
  predict which way an fp32 summation order rounds those. ``kv_prequant`` holds the pre-encode
  values, ``kv_agreement`` counts the differences that are *not* so explained.
- Later layers' bytes agree for the vast majority (> 95%) and within an fp8 spacing at the
  top of their range; ``force_kv`` stores the kernel's own bytes instead of the reference's,
  so attention sees the cache the kernel saw.
- Outputs: judged against the float64 step run on the kernel's own K/V bytes (``force_kv``;
  ``mono_aot/selftest/cases.py``, ``judge``). Free-running, two legal executions drift apart
  through the fp8 cache: on the shipped MXFP8 geometry the kernel-numerics reference lands
  6.8e-2 (norm-wise, ``norm_rel_error``) from the float64 one after 5 layers, but 6.7e-3 from
  the float64 step given the same K/V bytes (2.1e-2 and 5.5e-3 on the small layout).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from mono_aot.reference.fp8 import (
    FP8Format,
    boundary_distance,
    boundary_gap,
    code_distance,
    decode,
    encode,
    resolve_format,
)
from mono_aot.reference.kvcache import check_cache, check_slots, fp32_scale, gather_codes
from mono_aot.reference.weights import RankWeights, check_rank_weights, dequantize_weight
from mono_aot.spec.errors import BadInput
from mono_aot.spec.layouts import Layout

Numerics = Literal["float64", "kernel", "stock"]
NUMERICS: tuple[str, ...] = ("float64", "kernel", "stock")
PHASES: tuple[str, ...] = ("attn", "mlp")  # the two all-reduces of a layer, in order


@dataclass(frozen=True)
class StepInputs:
    """One launch's inputs, as the runner passes them to ``_launch``.

    ``x`` (inputs_embeds) ``[n, hidden]`` (bf16 for the kernels); ``positions`` int64 and
    ``slots`` int64 with at least ``n`` entries (the runner passes tails ``positions[a:]``; only
    the first ``n`` are read); ``block_table`` int32 ``[>= reqs, max_blocks]``, any strides (a
    view such as ``bt[r0:]``); ``seq_lens`` int32 with at least ``reqs = n // qpr`` entries;
    ``cos_sin`` bf16 ``[max_pos, rotary_dim]`` (cos half, then sin half).
    """

    x: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    cos_sin: torch.Tensor


@dataclass(frozen=True)
class StepResult:
    """What one rank's step produced.

    ``out``: float64 ``[n, hidden]`` (bf16 with ``numerics="kernel"``). ``kv``: uint8
    ``[layers, n, kv_heads_per_rank, 2*head_dim]``, every token's cache bytes (written where
    ``written``). ``kv_prequant``: float64, same shape, ``k/k_scale | v/v_scale`` before
    encoding. ``written``: bool ``[n]``, slot != -1. ``partials``: float64 ``[layers, 2, n,
    hidden]``, this rank's contribution to each all-reduce (phase 0 attention, 1 MLP).
    """

    out: torch.Tensor
    kv: torch.Tensor
    kv_prequant: torch.Tensor
    written: torch.Tensor
    partials: torch.Tensor


@dataclass(frozen=True)
class TPResult:
    """Every rank's ``StepResult`` and all partials ``[layers, 2, tp, n, hidden]`` (float64)."""

    ranks: list[StepResult]
    partials: torch.Tensor

    @property
    def out(self) -> torch.Tensor:
        """The step's output (identical on every rank)."""
        return self.ranks[0].out


class _Store:
    """Rounding to a storage dtype, or none (float64 mode); the stock mode's MXFP8 activations."""

    def __init__(self, numerics: str) -> None:
        if numerics not in NUMERICS:
            raise BadInput(f"numerics {numerics!r}: expected one of {', '.join(NUMERICS)}")
        self.kernel = numerics == "kernel"
        self.stock = numerics == "stock"

    def f32(self, t: torch.Tensor) -> torch.Tensor:
        """A value the kernels keep in fp32 (vLLM's stock path: in the model's bf16)."""
        if self.stock:
            return self.bf16(t)
        return t.to(torch.float32).to(torch.float64) if self.kernel else t

    def bf16(self, t: torch.Tensor) -> torch.Tensor:
        """fp32 then bf16, as the kernels convert their fp32 registers."""
        if not (self.kernel or self.stock):
            return t
        return t.to(torch.float32).to(torch.bfloat16).to(torch.float64)

    def projection_input(self, t: torch.Tensor, mx_block: int) -> torch.Tensor:
        """What a projection reads of its (already stored) input: the stock path quantises it
        to MXFP8 first (``mx_quantize``); the kernels read it as it is."""
        return mx_quantize(t, mx_block) if self.stock and mx_block else t

    def normed_gemv(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        eps: float,
        codes: torch.Tensor,
        scales: torch.Tensor,
        layout: Layout,
        fmt: FP8Format,
    ) -> torch.Tensor:
        """``gemma_norm(x, w) @ W^T`` as stored before the product: the kernels store
        ``bf16(fp32(x * fp32(1 + w)))``, *not yet normalised*, and multiply the product by
        ``rsqrt(mean(x^2) + eps)`` of the fp32 ``x`` (float64 here); the stock path stores the
        normed value in bf16 and quantises it (``projection_input``)."""
        if self.stock:
            h = self.projection_input(self.bf16(gemma_norm(x, w, eps)), layout.weights.scale_block)
            return _gemv(h, codes, scales, layout, fmt)
        one_w = self.f32(1.0 + w.to(torch.float64))
        hp = self.bf16(self.f32(x * one_w))
        ms = x.square().mean(dim=-1, keepdim=True)
        return _gemv(hp, codes, scales, layout, fmt) * torch.rsqrt(ms + eps)


def mx_quantize(t: torch.Tensor, block: int) -> torch.Tensor:
    """MXFP8 activation quantisation as vLLM's stock linear layers do it, returned as the
    values it decodes to (float64): per ``block`` inputs one power-of-two scale
    ``2^(ceil(log2(amax / 448)))`` (biased exponent clamped to 0..254), the values divided by
    it and rounded to e4m3fn (``_mxfp8_e4m3_quantize_torch`` in
    ``vllm/model_executor/layers/quantization/utils/mxfp8_utils.py``; fp32 arithmetic there,
    as here)."""
    from mono_aot.reference.fp8 import E4M3FN

    n, k = t.shape
    if k % block:
        raise BadInput(f"mx_quantize: {k} inputs are not whole blocks of {block}")
    x = t.to(torch.float32).reshape(n, k // block, block)
    amax = x.abs().amax(dim=-1).clamp(min=torch.finfo(torch.float32).tiny)
    biased = (torch.ceil(torch.log2(amax / E4M3FN.max)) + 127.0).clamp(0, 254)
    descale = torch.exp2(biased - 127.0)
    codes = encode(x / descale[..., None], E4M3FN, saturate=True)
    vals = decode(codes, E4M3FN, torch.float64) * descale.to(torch.float64)[..., None]
    return vals.reshape(n, k)


def gemma_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * (1 + w)`` over the last dim, float64."""
    x = x.to(torch.float64)
    return (
        x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps) * (1.0 + w.to(torch.float64))
    )


def neox_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int
) -> torch.Tensor:
    """NeoX RoPE of ``x`` ``[n, heads, head_dim]`` on its first ``rotary_dim`` dims.

    ``cos``/``sin``: ``[n, rotary_dim/2]``, one row per token.
    """
    half = rotary_dim // 2
    x1, x2, rest = x[..., :half], x[..., half:rotary_dim], x[..., rotary_dim:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


def clamped_swiglu(g: torch.Tensor, u: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    gc = torch.clamp(g, max=limit)
    return gc * torch.sigmoid(alpha * gc) * (torch.clamp(u, -limit, limit) + 1.0)


def _gemv(
    h: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, layout: Layout, fmt: FP8Format
) -> torch.Tensor:
    """fp8-row: ``(h @ decode(codes)^T) * s``, the scale per output row applied after the dot
    product; mxfp8: ``h @ W^T`` with ``W`` the exactly dequantized blocks (``weights.py``)."""
    if layout.weights.format == "mxfp8":
        return h @ dequantize_weight(codes, scales, layout, fmt).T
    return (h @ decode(codes, fmt, torch.float64).T) * scales.to(torch.float64)


def key_window(layout: Layout, positions: torch.Tensor, seq_len: int) -> tuple[int, torch.Tensor]:
    """``(start, visible)`` of one request: the first cached position any of its queries at
    ``positions`` attends, and bool ``[len(positions), seq_len - start]``, which keys of
    ``start..seq_len-1`` each query attends.

    vLLM 0.34's rule: ``_resolve_layer_attention`` (``vllm/model_executor/models/
    qwen3_dflash.py``) resolves each DSpark layer's ``sliding_window`` and ``causal``, and its
    own drafter kernels (``window`` in ``vllm/models/minimax_m3/amd/mono/drafter/
    attention.py``) read keys from ``max(p0 - (window - 1), 0)`` to ``seq_len - 1``: a query at
    ``qp`` attends ``kp`` when ``kp < seq_len``, ``kp > qp - window`` (with a window) and
    ``kp <= qp`` (causal). A padded request (``seq_len`` 0) attends nothing.
    """
    m = layout.model
    qp = positions.to(torch.int64)
    start = max(0, int(qp.min()) - m.window + 1) if m.window and qp.numel() else 0
    start = min(start, seq_len)
    kp = torch.arange(start, seq_len, dtype=torch.int64)
    visible = torch.ones((qp.numel(), kp.numel()), dtype=torch.bool)
    if m.window:
        visible &= kp[None, :] > qp[:, None] - m.window
    if m.causal:
        visible &= kp[None, :] <= qp[:, None]
    return start, visible


def _check_int(t: object, what: str, dtype: torch.dtype, dims: int, min_len: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise BadInput(f"{what}: expected a {dtype} tensor, got {type(t).__name__}")
    if t.dtype != dtype or t.dim() != dims:
        raise BadInput(f"{what}: {t.dtype} with {t.dim()} dims, expected {dtype} with {dims}")
    if t.shape[0] < min_len:
        raise BadInput(f"{what}: {t.shape[0]} rows, the launch needs at least {min_len}")
    return t


def _validate(
    layout: Layout,
    rank: int,
    weights: RankWeights,
    caches: Sequence[torch.Tensor],
    inputs: StepInputs,
) -> tuple[int, int]:
    m, qpr = layout.model, layout.serving.qpr
    if not 0 <= rank < layout.parallel.tp:
        raise BadInput(f"rank {rank} is outside 0..{layout.parallel.tp - 1}")
    x = inputs.x
    if (
        not isinstance(x, torch.Tensor)
        or x.dim() != 2
        or x.shape[1] != m.hidden
        or not x.is_floating_point()
    ):
        raise BadInput(f"x: expected a float tensor [n, {m.hidden}], got {getattr(x, 'shape', x)}")
    n = int(x.shape[0])
    if n == 0 or n % qpr:
        raise BadInput(f"x: {n} tokens, expected a positive multiple of qpr={qpr}")
    reqs = n // qpr
    _check_int(inputs.positions, "positions", torch.int64, 1, n)
    _check_int(inputs.slots, "slots", torch.int64, 1, n)
    _check_int(inputs.block_table, "block_table", torch.int32, 2, reqs)
    _check_int(inputs.seq_lens, "seq_lens", torch.int32, 1, reqs)
    cs = inputs.cos_sin
    if (
        not isinstance(cs, torch.Tensor)
        or cs.dtype != torch.bfloat16
        or cs.dim() != 2
        or cs.shape[1] != m.rotary_dim
    ):
        raise BadInput(
            f"cos_sin: expected torch.bfloat16 [max_pos, {m.rotary_dim}], got "
            f"{getattr(cs, 'dtype', type(cs).__name__)} {list(getattr(cs, 'shape', []))}"
        )
    pos = inputs.positions[:n]
    if int(pos.min()) < 0 or int(pos.max()) >= cs.shape[0]:
        raise BadInput(f"positions: must lie in 0..{cs.shape[0] - 1} (the rope cache's rows)")
    seq = inputs.seq_lens[:reqs]
    if int(seq.min()) < 0:
        raise BadInput(f"seq_lens: negative entry {int(seq.min())}")
    check_rank_weights(weights, layout)
    if len(caches) != m.layers:
        raise BadInput(f"caches: {len(caches)} given, the layout has {m.layers} layers")
    blocks = [check_cache(c, layout, f"caches[{i}]") for i, c in enumerate(caches)]
    for i, b in enumerate(blocks):
        if b != blocks[0]:
            raise BadInput(f"caches[{i}]: {b} blocks, caches[0] has {blocks[0]}")
    check_slots(inputs.slots[:n], blocks[0], layout.serving.kv_block, "slots")
    return n, reqs


def rank_step(
    layout: Layout,
    fmt: FP8Format | str,
    rank: int,
    weights: RankWeights,
    caches: Sequence[torch.Tensor],
    inputs: StepInputs,
    numerics: Numerics = "float64",
    force_kv: torch.Tensor | None = None,
) -> Generator[tuple[int, str, torch.Tensor], torch.Tensor, StepResult]:
    """One rank's draft step (see the module doc); writes the K/V bytes into ``caches`` in place.

    ``fmt``: the fp8 format, its name, or the target arch. Yields ``(layer, phase, partial)``
    (float64 ``[n, hidden]``) at each all-reduce; send back the sum over all ranks.

    ``force_kv`` (uint8 ``[layers, n, kv_heads_per_rank, 2*head_dim]``, e.g. the bytes a
    kernel wrote): store these instead of the computed bytes, so attention -- and every later
    layer -- sees the same cache as the kernel did. The step is chaotic at the fp8 level (a
    value on a rounding midpoint flips a code by one, ~6%, and the change propagates): with it,
    each layer's computed bytes (``StepResult.kv``) are compared given the same cache history
    (the residual still carries bf16-level differences; see "What a kernel can be held to").
    """
    f = resolve_format(fmt)
    st = _Store(numerics)
    n, reqs = _validate(layout, rank, weights, caches, inputs)
    m, qpr = layout.model, layout.serving.qpr
    if force_kv is not None:
        want = (m.layers, n, layout.kv_heads_per_rank, layout.kv_entry_bytes)
        if force_kv.dtype != torch.uint8 or tuple(force_kv.shape) != want:
            raise BadInput(
                f"force_kv: {force_kv.dtype} {list(force_kv.shape)}, expected torch.uint8 {list(want)}"
            )
    D, R, eps = m.head_dim, m.rotary_dim, m.norm_eps
    Q, K = layout.q_heads_per_rank, layout.kv_heads_per_rank
    G = Q // K
    qr, kr, mr = layout.q_rows_per_rank, layout.kv_rows_per_rank, layout.mlp_per_rank
    L = m.layers

    x = st.f32(inputs.x.to(torch.float64))
    pos = inputs.positions[:n]
    slots = inputs.slots[:n]
    cs = inputs.cos_sin[pos].to(torch.float64)
    cos, sin = cs[:, : R // 2], cs[:, R // 2 :]
    seq = [int(s) for s in inputs.seq_lens[:reqs]]
    written = slots != -1
    wslots = slots[written]
    B = layout.serving.kv_block
    scale = 1.0 / math.sqrt(D)
    mx = layout.weights.scale_block  # the stock model's activation blocks (fp8-row: none)

    kv_all = torch.empty((L, n, K, 2 * D), dtype=torch.uint8)
    pre_all = torch.empty((L, n, K, 2 * D), dtype=torch.float64)
    partials = torch.empty((L, 2, n, m.hidden), dtype=torch.float64)
    for li in range(L):
        w = weights.layer(li)
        cache = caches[li]
        ks, vs = fp32_scale(w["k_scale"]), fp32_scale(w["v_scale"])

        qkv = st.f32(st.normed_gemv(x, w["w_in"], eps, w["qkv_w"], w["qkv_s"], layout, f))
        q = qkv[:, :qr].reshape(n, Q, D)
        k = qkv[:, qr : qr + kr].reshape(n, K, D)
        v = qkv[:, qr + kr :].reshape(n, K, D)
        q = st.f32(neox_rope(gemma_norm(q, w["w_q"], eps), cos, sin, R))
        k = st.f32(neox_rope(gemma_norm(k, w["w_k"], eps), cos, sin, R))

        pre = torch.cat([st.f32(k / ks), st.f32(v / vs)], dim=-1)
        codes = encode(pre, f, saturate=True)
        kv_all[li], pre_all[li] = codes, pre
        store = codes if force_kv is None else force_kv[li]
        cache[wslots // B, :, wslots % B, :] = store[written]

        attn = torch.zeros((n, Q, D), dtype=torch.float64)
        for i in range(reqs):
            rows = slice(i * qpr, (i + 1) * qpr)
            start, visible = key_window(layout, pos[rows], seq[i])
            if not bool(visible.any()):
                continue  # nothing attended (a padded request: seq_len 0): zeros
            c = gather_codes(cache, inputs.block_table, i, seq[i], layout, start)  # [len, K, 2D]
            kc = decode(c[..., :D], f, torch.float64) * ks
            vc = decode(c[..., D:], f, torch.float64) * vs
            qi = q[rows].reshape(qpr, K, G, D)
            logits = torch.einsum("tkgd,jkd->tkgj", qi, kc) * scale
            logits = logits.masked_fill(~visible[:, None, None, :], -math.inf)
            # a row that sees no key (only a causal or windowed row can) gets zeros
            p = torch.softmax(logits, dim=-1).nan_to_num(0.0)
            attn[rows] = torch.einsum("tkgj,jkd->tkgd", p, vc).reshape(qpr, Q, D)
        attn = st.bf16(attn.reshape(n, qr))

        part = st.bf16(_gemv(st.projection_input(attn, mx), w["o_w"], w["o_s"], layout, f))
        partials[li, 0] = part
        total = yield (li, "attn", part)
        x = st.f32(x + total)

        gu = st.f32(st.normed_gemv(x, w["w_post"], eps, w["gu_w"], w["gu_s"], layout, f))
        a = st.bf16(clamped_swiglu(gu[:, :mr], gu[:, mr:], m.swiglu_alpha, m.swiglu_limit))
        part = st.bf16(_gemv(st.projection_input(a, mx), w["d_w"], w["d_s"], layout, f))
        partials[li, 1] = part
        total = yield (li, "mlp", part)
        x = st.f32(x + total)

    out = gemma_norm(x, weights.final_norm, eps)
    if st.kernel or st.stock:
        out = out.to(torch.float32).to(torch.bfloat16)
    return StepResult(out=out, kv=kv_all, kv_prequant=pre_all, written=written, partials=partials)


def allreduce(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The sum of the ranks' partials, added in rank order (the order every rank uses)."""
    total = parts[0].clone()
    for p in parts[1:]:
        total = total + p
    return total


def run_tp(
    layout: Layout,
    fmt: FP8Format | str,
    weights: Sequence[RankWeights],
    caches: Sequence[Sequence[torch.Tensor]],
    inputs: StepInputs,
    numerics: Numerics = "float64",
    force_kv: Sequence[torch.Tensor | None] | None = None,
) -> TPResult:
    """Every rank's step in lockstep, exchanging the partials of each all-reduce.

    ``weights[r]``/``caches[r]`` are rank ``r``'s; all ranks share ``inputs`` (as on the GPUs).
    Each rank's caches are updated in place. ``force_kv[r]``: see ``rank_step``.
    """
    tp = layout.parallel.tp
    if len(weights) != tp or len(caches) != tp:
        raise BadInput(
            f"run_tp needs {tp} ranks' weights and caches, got {len(weights)} and {len(caches)}"
        )
    forced = list(force_kv) if force_kv is not None else [None] * tp
    if len(forced) != tp:
        raise BadInput(f"force_kv: {len(forced)} entries, expected one per rank ({tp})")
    gens = [
        rank_step(layout, fmt, r, weights[r], caches[r], inputs, numerics, forced[r])
        for r in range(tp)
    ]
    msgs = [next(g) for g in gens]
    L = layout.model.layers
    n = inputs.x.shape[0]
    every = torch.empty((L, 2, tp, n, layout.model.hidden), dtype=torch.float64)
    results: list[StepResult | None] = [None] * tp
    while True:
        tags = {(li, ph) for li, ph, _ in msgs}
        if len(tags) != 1:  # every rank runs the same code: a mismatch is a bug here
            raise AssertionError(f"ranks out of step: {sorted(tags)}")
        li, ph, _ = msgs[0]
        parts = [p for _, _, p in msgs]
        every[li, PHASES.index(ph)] = torch.stack(parts)
        total = allreduce(parts)
        nxt = []
        for r, g in enumerate(gens):
            try:
                nxt.append(g.send(total))
            except StopIteration as stop:
                results[r] = stop.value
        if len(nxt) == 0:
            break
        if len(nxt) != tp:
            raise AssertionError("some ranks finished before others")
        msgs = nxt
    ranks = [r for r in results if r is not None]
    return TPResult(ranks=ranks, partials=every)


def step_rank(
    layout: Layout,
    fmt: FP8Format | str,
    rank: int,
    weights: RankWeights,
    caches: Sequence[torch.Tensor],
    inputs: StepInputs,
    peer_partials: torch.Tensor,
    numerics: Numerics = "float64",
    force_kv: torch.Tensor | None = None,
) -> StepResult:
    """Rank ``rank``'s step alone, with the other ranks' partials given up front.

    ``peer_partials``: ``[layers, 2, tp, n, hidden]`` (``TPResult.partials`` of a run with the
    same inputs); the rank's own entries are ignored and replaced by what it computes.
    """
    L, tp, h = layout.model.layers, layout.parallel.tp, layout.model.hidden
    n = inputs.x.shape[0]
    want = (L, 2, tp, n, h)
    if tuple(peer_partials.shape) != want:
        raise BadInput(f"peer_partials: shape {list(peer_partials.shape)}, expected {list(want)}")
    g = rank_step(layout, fmt, rank, weights, caches, inputs, numerics, force_kv)
    msg = next(g)
    while True:
        li, ph, part = msg
        parts = [
            part if r == rank else peer_partials[li, PHASES.index(ph), r].to(torch.float64)
            for r in range(tp)
        ]
        try:
            msg = g.send(allreduce(parts))
        except StopIteration as stop:
            return stop.value


@dataclass(frozen=True)
class KVAgreement:
    """How one layer's K/V bytes of an implementation agree with the reference's.

    ``exact``: fraction of bytes equal. ``max_steps``: the largest ``code_distance``.
    ``value_err``: ``max|decode(got) - decode(ref)| / max|decode(ref)|`` over the layer (K and
    V separately, the larger). ``unexplained``: bytes that differ although the reference's
    pre-encode value is farther than ``rtol`` (relative) from every fp8 rounding boundary.
    """

    layer: int
    exact: float
    max_steps: int
    value_err: float
    unexplained: int


def kv_agreement(
    got: torch.Tensor, ref: StepResult, fmt: FP8Format | str, rtol: float = 1e-5
) -> list[KVAgreement]:
    """Per layer, ``got`` (uint8 ``[layers, n, kv_heads, 2*head_dim]``, e.g. a kernel's bytes
    gathered at the step's slots) against ``ref.kv``; only rows with a slot are compared.

    What to expect from a correct kernel (see the module doc): layer 0 has ``unexplained == 0``
    at ``rtol`` around 1e-5 (its inputs are exactly the kernel's). Later layers inherit
    bf16-level differences of the residual (one bf16 flip of an attention output moves a whole
    token's residual by ~1e-4), so a few bytes differ, small values by several codes: expect
    ``exact`` above ~0.95 and ``value_err`` within an fp8 spacing at the top (~1/16), not
    equality.
    """
    f = resolve_format(fmt)
    if got.shape != ref.kv.shape or got.dtype != torch.uint8:
        raise BadInput(
            f"K/V bytes: {got.dtype} {list(got.shape)}, expected torch.uint8 {list(ref.kv.shape)}"
        )
    out = []
    w = ref.written
    D = ref.kv.shape[-1] // 2
    for li in range(ref.kv.shape[0]):
        a, b = got[li][w], ref.kv[li][w]
        near = boundary_distance(ref.kv_prequant[li][w], f) <= rtol
        diff = a != b
        if not diff.numel():
            out.append(KVAgreement(li, 1.0, 0, 0.0, 0))
            continue
        va, vb = decode(a, f, torch.float64), decode(b, f, torch.float64)
        errs = [
            float((va[..., s] - vb[..., s]).abs().max())
            / max(float(vb[..., s].abs().max()), 1e-300)
            for s in (slice(0, D), slice(D, None))
        ]
        out.append(
            KVAgreement(
                layer=li,
                exact=float((~diff).double().mean()),
                max_steps=int(code_distance(a, b, f).max()),
                value_err=max(errs),
                unexplained=int((diff & ~near).sum()),
            )
        )
    return out


def max_rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``max|got - want| / max|want|`` in float64 (the 1e-10 check is stated in it)."""
    g, w = got.to(torch.float64), want.to(torch.float64)
    denom = float(w.abs().max())
    return float((g - w).abs().max()) / (denom if denom > 0 else 1.0)


def norm_rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``||got - want|| / ||want||`` (Frobenius), float64: the steadier metric for kernels,
    whose bf16 and fp8 storage make the 5-layer step chaotic at the 1e-2 level elementwise.
    A non-finite value anywhere in ``got`` (a poisoned output left unwritten) gives inf."""
    g, w = got.to(torch.float64), want.to(torch.float64)
    if not bool(torch.isfinite(g).all()):
        return math.inf
    denom = float(w.norm())
    return float((g - w).norm()) / (denom if denom > 0 else 1.0)


# Layer 0: the reference's inputs equal the kernel's there, so a kernel's K/V code may differ
# from the reference's only by fp32 summation order, and only where the pre-encode value lies
# that close to an fp8 rounding boundary: within ``KV_BOUNDARY_TOL`` of the value itself, or
# within ``KV_ENTRY_BOUNDARY_TOL`` of its entry's scale (the RMS of the token's K, or V, values
# in that head). The second bound is for values near zero: the error of a projection's sum is
# set by the magnitude of the terms it sums (unit roundoff times about the square root of its
# length, relative to its entry's scale), not by the result, so a near-zero result of a
# cancelling sum may sit relatively far from its reference (a multi-launch step on the
# emulator met one: 3.9e-6 from a boundary, 8.8e-4 of the value, 6e-8 of its entry's RMS).
# Later layers read the hidden state the kernel computed with its own roundings, which moves
# codes near any boundary, so there a layer's written K/V values are judged as a whole: their
# norm-relative error against the kernel-numerics reference's, at most the larger of
# ``KV_LATER_LAYER_TOL`` and ``KV_SPREAD_FACTOR`` times that layer's spread (``kv_spread``: the
# same distance between the float64 and the kernel-numerics references, two legal rounding
# histories of the same step). Why the spread: the distance grows with depth and width, and on
# the shipped layout (5 layers of hidden 6144) the float64 reference itself sits 2.03-2.61 %
# from the kernel-numerics one at layer 4, so an exact kernel would fail a fixed 2e-2 (README,
# "What has run"). A kernel's own roundings are independent of the reference's, so it may sit
# up to about sqrt(2) spreads away; the factor 2 leaves room for that. A misplaced row or
# position is still an error of order 1; an unwritten byte must still be exact.
KV_BOUNDARY_TOL = 1e-4
KV_ENTRY_BOUNDARY_TOL = 1e-5
KV_LATER_LAYER_TOL = 2e-2
KV_SPREAD_FACTOR = 2.0


def near_boundary(prequant: torch.Tensor, fmt: FP8Format | str) -> torch.Tensor:
    """Which pre-encode K/V values (``[..., 2*head_dim]``: K then V) a correct layer-0 kernel
    may encode one code away from the reference: ``KV_BOUNDARY_TOL`` and
    ``KV_ENTRY_BOUNDARY_TOL`` (see there)."""
    gap = boundary_gap(prequant, fmt)
    x = prequant.to(torch.float64).nan_to_num(0.0, 0.0, 0.0)
    D = x.shape[-1] // 2
    halves = x.unflatten(-1, (2, D))
    rms = halves.square().mean(-1, keepdim=True).sqrt().expand_as(halves).flatten(-2)
    return (gap < KV_BOUNDARY_TOL * x.abs()) | (gap < KV_ENTRY_BOUNDARY_TOL * rms)


KV_FINDINGS_PER_LAYER = 8  # bad bytes described per layer (the rest are counted)


def kv_spread(a: StepResult, b: StepResult, fmt: FP8Format | str) -> list[float]:
    """Per layer, the norm-relative distance between the written K/V values of two results of
    one rank's step (the float64 and kernel-numerics references: ``compare_caches``)."""
    f = resolve_format(fmt)
    w = a.written
    return [
        norm_rel_error(decode(x[w], f, torch.float64), decode(y[w], f, torch.float64))
        for x, y in zip(a.kv, b.kv, strict=True)
    ]


def later_layer_bound(spread: float) -> float:
    """The largest norm-relative error a later layer's written K/V values may have against the
    kernel-numerics reference's, given that layer's ``kv_spread`` (see ``KV_SPREAD_FACTOR``)."""
    return max(KV_LATER_LAYER_TOL, KV_SPREAD_FACTOR * spread)


def compare_caches(
    layout: Layout,
    fmt: FP8Format | str,
    got: Sequence[torch.Tensor],
    want: Sequence[torch.Tensor],
    slots: torch.Tensor,
    prequant: Sequence[torch.Tensor],
    findings: list[dict[str, Any]] | None = None,
    spread: Sequence[float] | None = None,
) -> tuple[int, int]:
    """Every cache byte of every layer equals the reference's, except written codes: in layer
    0 those whose pre-encode value lies as near an fp8 rounding boundary as ``near_boundary``
    allows, in later layers all of a layer's written codes when their values are within
    ``later_layer_bound`` of the reference's as a whole (``spread``: each layer's
    ``kv_spread``; none given, ``KV_LATER_LAYER_TOL``). Returns ``(bad bytes, tolerated
    differences)``; ``findings``, when given, receives one record per layer with a bad byte:
    the counts, the layer's K/V error and the first ``KV_FINDINGS_PER_LAYER`` bad bytes (block,
    position, head, byte, half, codes, pre-encode value and its distance to a boundary)."""
    f = resolve_format(fmt)
    B = layout.serving.kv_block
    bad = tolerated = 0
    written = slots >= 0
    ws = slots[written]
    for li, (g, w) in enumerate(zip(got, want, strict=True)):
        diff = g != w
        if not bool(diff.any()):
            continue
        rows = torch.zeros(diff.shape[:-1], dtype=torch.bool)  # [blocks, K, B]
        rows[ws // B, :, ws % B] = True
        in_rows = diff & rows[..., None]
        outside = diff & ~rows[..., None]
        layer_bad = int(outside.sum())
        record: dict[str, Any] = {"layer": li, "unwritten_bytes_changed": layer_bad}
        if li == 0:
            near = near_boundary(prequant[li][written], f)
            allowed = torch.zeros_like(diff)
            allowed[ws // B, :, ws % B, :] = near
            wrong = in_rows & ~allowed
            layer_bad += int(wrong.sum())
            tolerated += int((in_rows & allowed).sum())
        else:
            gv = decode(g[rows], f, torch.float64)
            wv = decode(w[rows], f, torch.float64)
            record["written_norm_rel_error"] = norm_rel_error(gv, wv)
            record["bound"] = later_layer_bound(spread[li] if spread is not None else 0.0)
            if record["written_norm_rel_error"] <= record["bound"]:
                tolerated += int(in_rows.sum())
                wrong = torch.zeros_like(diff)
            else:
                layer_bad += int(in_rows.sum())
                wrong = in_rows
        bad += layer_bad
        if findings is not None and layer_bad:
            record["bad_bytes"] = layer_bad
            record["first"] = _bad_bytes(
                g, w, wrong | outside, slots, prequant[li], f, B, KV_FINDINGS_PER_LAYER
            )
            findings.append(record)
    return bad, tolerated


def _bad_bytes(
    got: torch.Tensor,
    want: torch.Tensor,
    bad: torch.Tensor,
    slots: torch.Tensor,
    prequant: torch.Tensor,
    fmt: FP8Format,
    block: int,
    limit: int,
) -> list[dict[str, Any]]:
    """The first ``limit`` bad bytes of one layer's cache ``[blocks, kv_heads, block, 2D]``,
    with the step's token (its row), pre-encode value and distance to a rounding boundary
    where the byte is one the step wrote (``slots``: the step's, -1 for none)."""
    D = got.shape[-1] // 2
    token_of = {int(s): i for i, s in enumerate(slots.tolist()) if s >= 0}
    gaps = boundary_gap(prequant, fmt)
    out = []
    for blk, head, pos, byte in bad.nonzero()[:limit].tolist():
        rec: dict[str, Any] = {
            "block": blk,
            "kv_head": head,
            "position_in_block": pos,
            "byte": byte % D,
            "half": "K" if byte < D else "V",
            "got": int(got[blk, head, pos, byte]),
            "want": int(want[blk, head, pos, byte]),
        }
        t = token_of.get(blk * block + pos)
        if t is not None:
            rec["token"] = t
            rec["prequant"] = float(prequant[t, head, byte])
            rec["boundary_gap"] = float(gaps[t, head, byte])
        out.append(rec)
    return out


__all__ = [
    "NUMERICS",
    "PHASES",
    "Numerics",
    "StepInputs",
    "StepResult",
    "TPResult",
    "KVAgreement",
    "KV_BOUNDARY_TOL",
    "KV_ENTRY_BOUNDARY_TOL",
    "KV_LATER_LAYER_TOL",
    "KV_SPREAD_FACTOR",
    "allreduce",
    "compare_caches",
    "kv_spread",
    "later_layer_bound",
    "clamped_swiglu",
    "gemma_norm",
    "kv_agreement",
    "max_rel_error",
    "near_boundary",
    "norm_rel_error",
    "neox_rope",
    "rank_step",
    "run_tp",
    "step_rank",
]
