"""Random, self-checking draft-step problems: weights, paged caches, inputs, dense context.

What the reference tests, kernel tests and benchmarks feed both implementations. A problem is
deterministic in its seed and built to expose mistakes:

- Weights are *fp8-exact*: every matrix is ``decode(code) * s`` with one ``+-max`` code in each
  quantization group (a row, or a row of one rank's slice for o and down) and scales of 16
  significant bits, so ``pack`` must reproduce the very codes and scales (a wrong row order or
  group changes them) and the float32 matrices are at once the model and its dequantization.
- Physical blocks are a random permutation; the block table is a column slice of a wider
  tensor (``stride(0) != size(1)``), with extra rows, and every entry a request does not need
  is garbage (out of range, negative, or a block full of NaN codes).
- Every cache byte that is not a valid pre-step position of some request is a NaN code, so a
  read past ``seq_lens`` or through the wrong block poisons the output.
- ``positions``, ``slots`` and ``seq_lens`` carry garbage tails past the launch's rows, as the
  runner's ``positions[a:]`` views do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from mono_aot.reference.dense import DenseConfig, DenseDrafter, DenseRequest, KVTransform
from mono_aot.reference.fp8 import (
    E8M0_BIAS,
    E8M0_NAN,
    FP8Format,
    decode,
    encode,
    quantize_dequantize,
    resolve_format,
)
from mono_aot.reference.kvcache import encode_kv, fp32_scale
from mono_aot.reference.step import StepInputs
from mono_aot.reference.weights import (
    MX_CODE_FORMAT,
    NORM_NAMES,
    LayerWeights,
    RankWeights,
    dequantize_mx,
    gemv_shapes,
    pack_model,
    scale_spec,
    unshard,
)
from mono_aot.spec.errors import BadInput
from mono_aot.spec.layouts import Layout
from mono_aot.spec.util import ceil_div

_ROW_CHUNK_ELEMS = 1 << 22


def rope_cache(max_pos: int, rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    """vLLM's ``cos_sin`` cache: bf16 ``[max_pos, rotary_dim]``, cos half then sin half."""
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(torch.bfloat16)


@torch.no_grad()
def exact_codes(
    rows: int, cols: int, groups: int, fmt: FP8Format, gen: torch.Generator, gain: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The codes (uint8 ``[rows, cols]``) and scales (fp32 ``[rows, groups]``) of an fp8-exact
    matrix: ``decode(code) * s`` is a matrix that per-row absmax quantization reproduces exactly.

    ``groups`` equal column groups each get their own scale (``tp`` for row-parallel matrices).
    Codes follow a quantized Gaussian; each (row, group) holds one ``+-max``; scales have 16
    significant bits so ``decode(code) * s`` is exact in float32. RMS is about
    ``gain / sqrt(cols)``.
    """
    if cols % groups:
        raise BadInput(f"{cols} columns do not split into {groups} groups")
    table, rms = _gaussian_codes(fmt)
    target = (
        gain
        / (rms * math.sqrt(cols))
        * (0.5 + torch.rand(rows, groups, generator=gen, dtype=torch.float64))
    )
    mant, ex = torch.frexp(target)
    scales = torch.ldexp(torch.round(mant * 2.0**16), ex - 16).to(torch.float32)
    return _draw_codes(rows, cols, groups, table, fmt, gen), scales


def _gaussian_codes(fmt: FP8Format) -> tuple[torch.Tensor, float]:
    """256 equiprobable codes of a Gaussian with sigma = max/3.5, and their RMS value."""
    u = (torch.arange(256, dtype=torch.float64) + 0.5) / 256
    table = encode(torch.special.ndtri(u) * (fmt.max / 3.5), fmt, saturate=True)
    return table, float(decode(table, fmt, torch.float64).square().mean().sqrt())


def _draw_codes(
    rows: int,
    cols: int,
    groups: int,
    table: torch.Tensor,
    fmt: FP8Format,
    gen: torch.Generator,
    every: torch.Tensor | None = None,
) -> torch.Tensor:
    """uint8 ``[rows, cols]`` drawn from ``table``, with one ``+-max`` in each of a row's
    ``groups`` equal column groups (so each group's absmax is the format's max). ``every``:
    codes each row also holds, in its first columns, rotated by the row index (any the
    ``+-max`` lands on excepted)."""
    width = cols // groups
    out = torch.empty(rows, cols, dtype=torch.uint8)
    step = max(1, _ROW_CHUNK_ELEMS // cols)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        idx = torch.randint(0, 256, (r1 - r0, cols), generator=gen, dtype=torch.int32)
        codes = table.index_select(0, idx.reshape(-1)).reshape(r1 - r0, groups, width)
        if every is not None:
            k = every.numel()
            turn = (torch.arange(k)[None, :] + torch.arange(r0, r1)[:, None]) % k
            codes.view(r1 - r0, cols)[:, :k] = every[turn]
        at = torch.randint(0, width, (r1 - r0, groups, 1), generator=gen)
        sign = torch.randint(0, 2, (r1 - r0, groups, 1), generator=gen, dtype=torch.uint8) << 7
        codes.scatter_(2, at, sign | fmt.max_code)
        out[r0:r1] = codes.reshape(r1 - r0, cols)
    return out


# the 254 e4m3fn codes that are not NaN (0x7F, 0xFF): what a checkpoint's weights may hold
MX_FINITE_CODES = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)


@torch.no_grad()
def exact_mx_codes(
    rows: int, cols: int, block: int, gen: torch.Generator, gain: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The e4m3fn codes (uint8 ``[rows, cols]``) and E8M0 scale bytes (uint8 ``[rows, cols /
    block]``) of an mxfp8-exact matrix: OCP MX quantization (``weights.quantize_mx``) of
    ``dequantize_mx(codes, bytes)`` gives back these very codes and bytes.

    Codes follow a quantized Gaussian with one ``+-448`` in each block (so the block's absmax
    fixes its exponent); each row's bytes sit around the power of two that gives an RMS of
    about ``gain / sqrt(cols)``, each block one of three neighbouring powers. Every row also
    holds each finite e4m3fn code (``MX_FINITE_CODES``, -0 among them), so a kernel that
    misreads any code, as gfx942's e4m3fnuz reading of -0 as NaN would, fails the check.
    """
    if cols % block:
        raise BadInput(f"{cols} columns do not split into {block}-input blocks")
    f, nb = MX_CODE_FORMAT, cols // block
    table, rms = _gaussian_codes(f)
    base = round(math.log2(gain / (rms * math.sqrt(cols))))
    jitter = torch.randint(-1, 2, (rows, nb), generator=gen, dtype=torch.int32)
    scales = (E8M0_BIAS + base + jitter).clamp(0, E8M0_NAN - 1).to(torch.uint8)
    every = MX_FINITE_CODES if cols >= 2 * MX_FINITE_CODES.numel() else None
    return _draw_codes(rows, cols, nb, table, f, gen, every), scales


def _exact_matrix(
    layout: Layout,
    f: FP8Format,
    rows: int,
    cols: int,
    groups: int,
    gen: torch.Generator,
    gain: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``exact_codes`` (fp8-row, ``groups`` scale columns) or ``exact_mx_codes`` (mxfp8)."""
    if layout.weights.format == "mxfp8":
        return exact_mx_codes(rows, cols, layout.weights.block, gen, gain)
    return exact_codes(rows, cols, groups, f, gen, gain)


@torch.no_grad()
def exact_weight(
    rows: int, cols: int, groups: int, fmt: FP8Format, gen: torch.Generator, gain: float = 1.0
) -> torch.Tensor:
    """The float32 ``[rows, cols]`` matrix of ``exact_codes`` (same arguments, same draws)."""
    codes, scales = exact_codes(rows, cols, groups, fmt, gen, gain)
    out = torch.empty(rows, cols, dtype=torch.float32)
    step = max(1, _ROW_CHUNK_ELEMS // cols)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        vals = decode(codes[r0:r1].reshape(r1 - r0, groups, -1), fmt, torch.float32)
        out[r0:r1] = (vals * scales[r0:r1, :, None]).reshape(r1 - r0, cols)
    return out


def _norm_weight(
    n: int, gen: torch.Generator, spread: float = 0.2, offset: float = 0.0
) -> torch.Tensor:
    return (torch.randn(n, generator=gen, dtype=torch.float64) * spread + offset).to(torch.bfloat16)


# The q norm's weight, about 2 (Gemma's ``1 + w`` then scales every normed q head by about 3):
# attention logits of spread about 3 instead of 1, so each query's attention is peaked, not
# near uniform. Measured on the small layout's wide step (contexts 255 and 256): the largest
# probability of a query head is 0.5-0.6 on average, about 10 of 263 keys carry the weight
# (158 at offset 0), and V rows shifted by one position move the float64 output by 66 % (9 %
# at offset 0), so a wrong position or index cannot hide in an average
# (``tests/reference/test_problem.py``).
_QUERY_NORM_OFFSET = 2.0


def _query_norm_weight(n: int, gen: torch.Generator) -> torch.Tensor:
    return _norm_weight(n, gen, offset=_QUERY_NORM_OFFSET)


# a matrix of the model by (name, rows, cols, scale groups, gain), in the order they are drawn
def _matrices(layout: Layout) -> list[tuple[str, int, int, int, float]]:
    m, tp = layout.model, layout.parallel.tp
    qd, kvd = m.heads * m.head_dim, m.kv_heads * m.head_dim
    return [
        ("q", qd, m.hidden, 1, 1.0),
        ("k", kvd, m.hidden, 1, 1.0),
        ("v", kvd, m.hidden, 1, 1.0),
        ("o", m.hidden, qd, tp, 0.5),
        ("gate", m.mlp, m.hidden, 1, 1.5),
        ("up", m.mlp, m.hidden, 1, 1.5),
        ("down", m.hidden, m.mlp, tp, 0.5),
    ]


def _kv_scales(f: FP8Format, gen: torch.Generator) -> tuple[float, float]:
    """A layer's K/V scales (fp32 values): normed k has RMS about 1 and tails near 4, so 4
    lands near the format's max."""
    ks = float(4.0 / f.max * (0.8 + 0.4 * torch.rand((), generator=gen)))
    vs = float(4.0 / f.max * (0.8 + 0.4 * torch.rand((), generator=gen)))
    return (
        float(torch.tensor(ks, dtype=torch.float32)),
        float(torch.tensor(vs, dtype=torch.float32)),
    )


@torch.no_grad()
def random_model(
    layout: Layout, fmt: FP8Format | str, seed: int = 0, exact: bool = True
) -> tuple[list[LayerWeights], torch.Tensor]:
    """Random draft-model weights (float32 matrices, bf16 norms, fp32 K/V scales) and final norm.

    ``exact``: fp8-exact matrices (see ``exact_weight``); otherwise plain Gaussian matrices,
    which packing rounds (compare against ``unshard(pack_model(...))`` then).
    """
    f = resolve_format(fmt)
    gen = torch.Generator().manual_seed(seed)
    m = layout.model
    layers = []
    for _ in range(m.layers):
        ks, vs = _kv_scales(f, gen)
        mats = {}
        for name, rows, cols, groups, gain in _matrices(layout):
            if exact and layout.weights.format == "mxfp8":
                codes, scales = exact_mx_codes(rows, cols, layout.weights.block, gen, gain)
                mats[name] = dequantize_mx(codes, scales, torch.float32)
            elif exact:
                mats[name] = exact_weight(rows, cols, groups, f, gen, gain)
            else:
                mats[name] = torch.randn(rows, cols, generator=gen) * (gain / math.sqrt(cols))
        layers.append(
            LayerWeights(
                **mats,
                w_in=_norm_weight(m.hidden, gen),
                w_post=_norm_weight(m.hidden, gen),
                w_q=_query_norm_weight(m.head_dim, gen),
                w_k=_norm_weight(m.head_dim, gen),
                k_scale=ks,
                v_scale=vs,
            )
        )
    return layers, _norm_weight(m.hidden, gen)


@torch.no_grad()
def random_packed_model(layout: Layout, fmt: FP8Format | str, seed: int = 0) -> list[RankWeights]:
    """``pack_model(*random_model(layout, fmt, seed), layout, fmt)``, bit for bit, generated
    straight from the codes and scales: the model is never held at higher precision.

    Why: the shipped layout's model is 1.67 G weights; in float32 (and packed again) it took
    8.4 GB of an emulation's 14 GB (README, "Emulator"). The packed tensors are what the
    kernels read and what ``run_tp`` computes from, so nothing else is needed; ``Problem.layers``
    rebuilds the float model when a test asks for it.
    """
    f = resolve_format(fmt)
    gen = torch.Generator().manual_seed(seed)
    m, tp, L = layout.model, layout.parallel.tp, layout.model.layers
    qr, kr, mr = layout.q_rows_per_rank, layout.kv_rows_per_rank, layout.mlp_per_rank

    def empty(shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
        return [torch.empty((L, *shape), dtype=dtype) for _ in range(tp)]

    packed: dict[str, list[torch.Tensor]] = {}
    for name, (rows, cols) in gemv_shapes(layout).items():
        packed[f"{name}_w"] = empty((rows, cols), torch.uint8)
        packed[f"{name}_s"] = empty(*scale_spec(layout, rows, cols))
    mx = layout.weights.format == "mxfp8"
    blk = layout.weights.block
    norms: dict[str, list[torch.Tensor]] = {n: [] for n in NORM_NAMES}
    k_scales, v_scales = [], []
    for li in range(L):
        ks, vs = _kv_scales(f, gen)
        k_scales.append(ks)
        v_scales.append(vs)
        mats = {
            name: _exact_matrix(layout, f, rows, cols, groups, gen, gain)
            for name, rows, cols, groups, gain in _matrices(layout)
        }
        for r in range(tp):
            # the row order of weights.shard_layer: this rank's q heads, then its K and V heads
            col = {
                "qkv": [(mats["q"], r * qr, qr), (mats["k"], r * kr, kr), (mats["v"], r * kr, kr)],
                "gu": [(mats["gate"], r * mr, mr), (mats["up"], r * mr, mr)],
            }
            for name, parts in col.items():
                at = 0
                for (codes, scales), lo, n in parts:
                    packed[f"{name}_w"][r][li, at : at + n] = codes[lo : lo + n]
                    packed[f"{name}_s"][r][li, at : at + n] = (
                        scales[lo : lo + n] if mx else scales[lo : lo + n, 0]
                    )
                    at += n
            # row-parallel: this rank's slice of the input dim, with that slice's own scales
            for name, src, n in (("o", "o", qr), ("d", "down", mr)):
                codes, scales = mats[src]
                packed[f"{name}_w"][r][li] = codes[:, r * n : (r + 1) * n]
                packed[f"{name}_s"][r][li] = (
                    scales[:, r * n // blk : (r + 1) * n // blk] if mx else scales[:, r]
                )
        del mats
        norms["w_in"].append(_norm_weight(m.hidden, gen))
        norms["w_post"].append(_norm_weight(m.hidden, gen))
        norms["w_q"].append(_query_norm_weight(m.head_dim, gen))
        norms["w_k"].append(_norm_weight(m.head_dim, gen))
    final_norm = _norm_weight(m.hidden, gen)
    stacked = {n: torch.stack(ws).contiguous() for n, ws in norms.items()}
    return [
        RankWeights(
            packed={n: t[r] for n, t in packed.items()},
            norms={n: t.clone() for n, t in stacked.items()},
            k_scale=torch.tensor(k_scales, dtype=torch.float32),
            v_scale=torch.tensor(v_scales, dtype=torch.float32),
            final_norm=final_norm.clone(),
        )
        for r in range(tp)
    ]


@dataclass(frozen=True)
class RequestSpec:
    """One request of a launch.

    ``context``: position of its first draft token (= cached positions before the block).
    ``written``: per draft token, whether it has a slot (``False``: slot -1); default all.
    ``seq_len``: positions attended; default ``context + qpr``. Every attended position that
    the step does not write holds valid pre-step K/V; everything else is NaN codes. With a
    window (``model.window``), positions below it hold NaN codes and the block-table entries of
    blocks wholly below it are garbage. A padded request (vLLM's FULL graph replay pads 9
    requests to 10) is ``RequestSpec(0, (False,) * qpr, seq_len=0)``.
    """

    context: int
    written: tuple[bool, ...] | None = None
    seq_len: int | None = None


@dataclass(frozen=True)
class _Req:
    context: int
    written: tuple[bool, ...]
    seq_len: int
    blocks: list[int]
    pre_positions: list[int]  # valid before the step and attended
    first_block: int = 0  # the first block the window reads (block-table entries before: garbage)


@dataclass
class Problem:
    """A launch ready for ``run_tp``/``step_rank`` and for the dense model.

    ``ranks`` is the model (every rank's packed weights); ``layers`` is the same model at full
    precision, rebuilt from them on first use unless the caller gave it (``make_problem``).
    """

    layout: Layout
    fmt: FP8Format
    ranks: list[RankWeights]
    inputs: StepInputs
    requests: list[_Req]
    context_codes: list[
        list[torch.Tensor]
    ]  # [layer][req]: uint8 [len(pre_positions), kv_heads, 2D]
    num_blocks: int
    _initial: list[list[torch.Tensor]] = field(repr=False)
    _layers: list[LayerWeights] | None = field(default=None, repr=False)

    @property
    def final_norm(self) -> torch.Tensor:
        return self.ranks[0].final_norm

    @property
    def layers(self) -> list[LayerWeights]:
        """The model at full precision (float64 when rebuilt from ``ranks``: equal values, as
        the weights are fp8-exact or were packed from these)."""
        if self._layers is None:
            self._layers = unshard(self.ranks, self.layout, self.fmt)[0]
        return self._layers

    def kv_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s K and V scales as the kernels hold them (``fp32_scale``)."""
        w = self.ranks[0]
        return fp32_scale(w.k_scale[layer]), fp32_scale(w.v_scale[layer])

    def caches(self) -> list[list[torch.Tensor]]:
        """Fresh copies of every rank's pre-step caches (``[rank][layer]``)."""
        return [[c.clone() for c in rank] for rank in self._initial]

    def kv_roundtrip(self) -> KVTransform:
        """The fp8 store-then-load of K/V, with each layer's scales (for the dense model)."""
        scales = [self.kv_scales(li) for li in range(self.layout.model.layers)]
        fmt = self.fmt

        def rt(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            ks, vs = scales[layer]
            return quantize_dequantize(k / ks, fmt) * ks, quantize_dequantize(v / vs, fmt) * vs

        return rt

    def dense_requests(self) -> list[DenseRequest]:
        qpr, D = self.layout.serving.qpr, self.layout.model.head_dim
        out = []
        for i, r in enumerate(self.requests):
            L = self.layout.model.layers
            ks = [self.kv_scales(li)[0] for li in range(L)]
            vs = [self.kv_scales(li)[1] for li in range(L)]
            codes = [self.context_codes[li][i] for li in range(L)]
            visible = torch.tensor(
                [w and r.context + t < r.seq_len for t, w in enumerate(r.written)], dtype=torch.bool
            )
            out.append(
                DenseRequest(
                    rows=slice(i * qpr, (i + 1) * qpr),
                    context_k=[
                        decode(c[..., :D], self.fmt, torch.float64) * s
                        for c, s in zip(codes, ks, strict=True)
                    ],
                    context_v=[
                        decode(c[..., D:], self.fmt, torch.float64) * s
                        for c, s in zip(codes, vs, strict=True)
                    ],
                    own_visible=visible,
                    context_positions=torch.tensor(r.pre_positions, dtype=torch.int64),
                )
            )
        return out

    def dense(self, layers: Sequence[LayerWeights] | None = None) -> torch.Tensor:
        """The dense model's output (float64) for this launch, with the fp8 K/V round trip."""
        model = DenseDrafter(
            DenseConfig.from_layout(self.layout), layers or self.layers, self.final_norm
        )
        return model.forward(
            self.inputs.x,
            self.inputs.positions,
            self.inputs.cos_sin,
            self.dense_requests(),
            self.kv_roundtrip(),
        )


@torch.no_grad()
def make_problem(
    layout: Layout,
    fmt: FP8Format | str,
    requests: Sequence[RequestSpec],
    seed: int = 0,
    model: tuple[list[LayerWeights], torch.Tensor] | Sequence[RankWeights] | None = None,
    spare_blocks: int = 3,
) -> Problem:
    """Build a launch of ``requests`` (see the module doc).

    ``model``: ``(layers, final_norm)`` (packed here), every rank's packed weights
    (``random_packed_model``: used as they are, not copied), or by default ``random_model``.
    """
    f = resolve_format(fmt)
    m, qpr, B = layout.model, layout.serving.qpr, layout.serving.kv_block
    tp, K, D = layout.parallel.tp, layout.kv_heads_per_rank, m.head_dim
    if not requests:
        raise BadInput("a problem needs at least one request")
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    if model is None:
        model = random_model(layout, f, seed)
    if isinstance(model, tuple) and len(model) == 2 and isinstance(model[1], torch.Tensor):
        layers: list[LayerWeights] | None = list(model[0])
        ranks = pack_model(layers, model[1], layout, f)
    else:
        layers, ranks = None, list(model)
        if len(ranks) != tp:
            raise BadInput(f"the model has {len(ranks)} ranks' weights, the layout's tp is {tp}")

    # ---- requests and their physical blocks ----
    specs = []
    for i, r in enumerate(requests):
        written = tuple(r.written) if r.written is not None else (True,) * qpr
        if len(written) != qpr:
            raise BadInput(f"request {i}: written has {len(written)} entries, qpr is {qpr}")
        seq = r.seq_len if r.seq_len is not None else r.context + qpr
        if r.context < 0 or seq < 0:
            raise BadInput(f"request {i}: negative context or seq_len")
        specs.append((r.context, written, seq))
    need = [ceil_div(max(seq, ctx + qpr), B) for ctx, _, seq in specs]
    total = sum(need) + spare_blocks
    perm = torch.randperm(total, generator=gen).tolist()
    spare = perm[sum(need) :]
    reqs: list[_Req] = []
    at = 0
    for (ctx, written, seq), nb in zip(specs, need, strict=True):
        mine = perm[at : at + nb]
        at += nb
        fresh = {ctx + t for t, w in enumerate(written) if w}
        lo = max(0, ctx - m.window + 1) if m.window else 0  # the first key the window admits
        pre = [p for p in range(lo, seq) if p not in fresh]
        reqs.append(_Req(ctx, written, seq, mine, pre, lo // B))

    nreq = len(reqs)
    cols = max(need) + 2
    garbage = torch.tensor([*spare, total + 7, 1 << 30, -3], dtype=torch.int32)
    wide = garbage[torch.randint(0, len(garbage), (nreq + 2, cols + 3), generator=gen)]
    bt = wide[:, 1 : 1 + cols]
    for i, r in enumerate(reqs):
        # the blocks wholly below the window are never read: their entries stay garbage
        bt[i, r.first_block : len(r.blocks)] = torch.tensor(
            r.blocks[r.first_block :], dtype=torch.int32
        )

    n = nreq * qpr
    positions = torch.full((n + 3,), 1 << 40, dtype=torch.int64)
    slots = torch.full((n + 3,), 0, dtype=torch.int64)
    for i, r in enumerate(reqs):
        for t, w in enumerate(r.written):
            p = r.context + t
            positions[i * qpr + t] = p
            slots[i * qpr + t] = r.blocks[p // B] * B + p % B if w else -1
    seq_lens = torch.tensor([r.seq_len for r in reqs] + [1 << 30, 5], dtype=torch.int32)
    max_pos = max(r.context + qpr for r in reqs) + 5
    inputs = StepInputs(
        x=torch.randn(n, m.hidden, generator=gen).to(torch.bfloat16),
        positions=positions,
        slots=slots,
        block_table=bt,
        seq_lens=seq_lens,
        cos_sin=rope_cache(max_pos, m.rotary_dim),
    )

    # ---- caches: NaN codes everywhere except each request's valid pre-step positions ----
    caches = [
        [torch.full((total, K, B, 2 * D), f.nan_code, dtype=torch.uint8) for _ in range(m.layers)]
        for _ in range(tp)
    ]
    context_codes: list[list[torch.Tensor]] = []
    for li in range(m.layers):
        k_scale, v_scale = float(ranks[0].k_scale[li]), float(ranks[0].v_scale[li])
        per_req = []
        for r in reqs:
            P = len(r.pre_positions)
            k = torch.randn(P, m.kv_heads, D, generator=gen, dtype=torch.float64)
            v = torch.randn(P, m.kv_heads, D, generator=gen, dtype=torch.float64)
            codes = encode_kv(k, v, k_scale, v_scale, f)
            per_req.append(codes)
            pp = torch.tensor(r.pre_positions, dtype=torch.int64)
            blk = torch.tensor(r.blocks, dtype=torch.int64)[pp // B] if P else pp
            for rank in range(tp):
                caches[rank][li][blk, :, pp % B, :] = codes[:, rank * K : (rank + 1) * K, :]
        context_codes.append(per_req)

    return Problem(
        layout=layout,
        fmt=f,
        ranks=ranks,
        inputs=inputs,
        requests=reqs,
        context_codes=context_codes,
        num_blocks=total,
        _initial=caches,
        _layers=layers,
    )


__all__ = [
    "Problem",
    "RequestSpec",
    "exact_codes",
    "exact_mx_codes",
    "exact_weight",
    "make_problem",
    "random_model",
    "random_packed_model",
    "rope_cache",
]
