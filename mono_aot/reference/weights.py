"""Draft-layer weights -> one TP rank's packed kernel inputs, and back.

The runner calls this at serving time (so it imports only torch and mono_aot's plain modules,
never FlyDSL); the reference step and the tests read the same tensors. Per layer, per rank
(``r`` is the rank, ``D`` the head dim, ``Q``/``K`` the q/KV heads per rank):

- ``qkv_w`` uint8 ``[qkv_rows_per_rank, hidden]``, row-major fp8 codes. Rows: this rank's ``Q``
  query heads (full-model q head ``h`` is q rows ``h*D..h*D+D-1``; rank ``r`` owns q heads
  ``r*Q..r*Q+Q-1``), then its ``K`` KV heads' K rows, then the same heads' V rows (rank ``r``
  owns KV heads ``r*K..r*K+K-1``; the shipped layout has ``Q=16, K=1``).
  ``qkv_s`` fp32 ``[qkv_rows_per_rank]``: one scale per output row, ``w ~= decode(code) * s``.
- ``o_w`` uint8 ``[hidden, o_cols_per_rank]``: row-parallel, rank ``r``'s slice of o's input
  dim (columns ``r*Q*D..``); ``o_s`` fp32 ``[hidden]``, the scale of each row of that slice.
- ``gu_w`` uint8 ``[2*mlp_per_rank, hidden]``: rank ``r``'s gate rows
  (``r*mlp_per_rank..``) then its up rows (same range); ``gu_s`` fp32 ``[2*mlp_per_rank]``.
- ``d_w`` uint8 ``[hidden, mlp_per_rank]``: rank ``r``'s slice of down's input dim; ``d_s``
  fp32 ``[hidden]``.
- Norm weights bf16: ``w_in``/``w_post`` ``[hidden]``, ``w_q``/``w_k`` ``[head_dim]`` (Gemma
  norms: the kernels multiply by ``1 + w``); ``final_norm`` bf16 ``[hidden]`` (once per model).
- ``k_scale``/``v_scale``: fp32 scalars per layer; a cache byte is ``encode(k / k_scale)``.

Quantization (``[weights] format`` of the layout):

- ``fp8-row``: per output row (per row of the rank's slice for o and down): ``s = absmax /
  fp8_max`` of the target arch's format, rounded to fp32, then ``code = encode(w / s)`` (round
  to nearest even, saturating). An all-zero row gets ``s = 1`` and zero codes.
- ``mxfp8`` (OCP MX, as vLLM's MXFP8 linear layers hold a checkpoint's weights after loading):
  the codes are e4m3fn on every arch, and each ``*_s`` is uint8 ``[rows, cols / block]``, one
  E8M0 byte per ``block`` consecutive inputs of a row: ``w = decode_e4m3fn(code) * 2**(byte -
  127)``. Quantizing takes the OCP rule ``2**(floor(log2(absmax)) - 8)`` (8: e4m3's largest
  exponent), saturating; an all-zero block gets byte 127 and zero codes. The runner stacks the
per-layer tensors across layers with ``torch.stack``, giving a leading ``[layers]`` dim: that is
``RankWeights.packed``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import torch

from mono_aot.reference.fp8 import (
    E4M3FN,
    E8M0_BIAS,
    E8M0_NAN,
    FP8Format,
    decode,
    e8m0_decode,
    encode,
    resolve_format,
)
from mono_aot.spec.errors import BadInput
from mono_aot.spec.layouts import Layout

GEMV_NAMES: tuple[str, ...] = ("qkv_w", "qkv_s", "o_w", "o_s", "gu_w", "gu_s", "d_w", "d_s")
NORM_NAMES: tuple[str, ...] = ("w_in", "w_post", "w_q", "w_k")
SCALE_NAMES: tuple[str, ...] = ("k_scale", "v_scale")


@dataclass(frozen=True)
class LayerWeights:
    """One draft decoder layer of the whole model (no TP), any float dtype.

    Linear weights are ``[out, in]`` as in ``torch.nn.Linear``.
    """

    q: torch.Tensor  # [heads * head_dim, hidden]
    k: torch.Tensor  # [kv_heads * head_dim, hidden]
    v: torch.Tensor  # [kv_heads * head_dim, hidden]
    o: torch.Tensor  # [hidden, heads * head_dim]
    gate: torch.Tensor  # [mlp, hidden]
    up: torch.Tensor  # [mlp, hidden]
    down: torch.Tensor  # [hidden, mlp]
    w_in: torch.Tensor  # [hidden]
    w_post: torch.Tensor  # [hidden]
    w_q: torch.Tensor  # [head_dim]
    w_k: torch.Tensor  # [head_dim]
    k_scale: float = 1.0
    v_scale: float = 1.0


@dataclass(frozen=True)
class LayerShard:
    """One rank's slices of one layer at full precision, already in packed row order.

    This is also what vLLM's sharded ``qkv_proj``/``o_proj``/``gate_up_proj``/``down_proj``
    weights hold on each rank, so a runner can pack from them directly.
    """

    qkv: torch.Tensor  # [qkv_rows_per_rank, hidden]
    o: torch.Tensor  # [hidden, o_cols_per_rank]
    gu: torch.Tensor  # [2 * mlp_per_rank, hidden]
    d: torch.Tensor  # [hidden, mlp_per_rank]
    w_in: torch.Tensor
    w_post: torch.Tensor
    w_q: torch.Tensor
    w_k: torch.Tensor
    k_scale: float = 1.0
    v_scale: float = 1.0


@dataclass(frozen=True)
class RankWeights:
    """One rank's kernel inputs for every layer, as the runner holds them.

    ``packed``: the eight GEMV tensors stacked over layers (``qkv_w`` ``[layers, rows, hidden]``
    ...); ``norms``: the four norm weights stacked (bf16 ``[layers, hidden]`` or ``[layers,
    head_dim]``); ``k_scale``/``v_scale`` fp32 ``[layers]``; ``final_norm`` bf16 ``[hidden]``.
    """

    packed: Mapping[str, torch.Tensor]
    norms: Mapping[str, torch.Tensor]
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    final_norm: torch.Tensor

    @property
    def layers(self) -> int:
        return int(self.packed["qkv_w"].shape[0])

    def layer(self, i: int) -> dict[str, torch.Tensor]:
        """Layer ``i``'s tensors in the form ``pack_shard`` returns."""
        out = {name: self.packed[name][i] for name in GEMV_NAMES}
        out.update({name: self.norms[name][i] for name in NORM_NAMES})
        out["k_scale"] = self.k_scale[i]
        out["v_scale"] = self.v_scale[i]
        return out


def _check(t: object, what: str, shape: tuple[int, ...], float_ok: bool = True) -> torch.Tensor:
    """Type and shape; finiteness is checked where the values are reduced anyway."""
    if not isinstance(t, torch.Tensor):
        raise BadInput(f"{what}: expected a tensor of shape {list(shape)}, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise BadInput(f"{what}: shape {list(t.shape)}, expected {list(shape)}")
    if float_ok and not t.is_floating_point():
        raise BadInput(f"{what}: dtype {t.dtype}, expected a floating-point tensor")
    return t


def quantize_rows(
    w: torch.Tensor, fmt: FP8Format | str, what: str = "weight"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row absmax fp8: ``(codes uint8 [rows, cols], scales fp32 [rows])``.

    ``s = fp32(absmax / fmt.max)`` (1 for an all-zero row), ``code = encode(w / s)`` with the
    division in float64 and saturation, so a row's absmax lands on +-max (or its neighbour when
    the fp32 rounding of ``s`` went down).
    """
    f = resolve_format(fmt)
    if w.dim() != 2:
        raise BadInput(f"{what}: expected a 2-d weight, got shape {list(w.shape)}")
    w64 = w.to(torch.float64)
    amax = w64.abs().amax(dim=1)
    if not bool(torch.isfinite(amax).all()):  # NaN and inf both survive the absmax
        row = int(torch.nonzero(~torch.isfinite(amax))[0, 0])
        raise BadInput(f"{what}: row {row} has non-finite values")
    s = torch.where(amax > 0, amax / f.max, 1.0).to(torch.float32)
    codes = encode(w64 / s.to(torch.float64)[:, None], f, saturate=True)
    return codes, s


def dequantize_rows(
    codes: torch.Tensor,
    scales: torch.Tensor,
    fmt: FP8Format | str,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """``decode(codes) * s`` per row (exact in float64); works on stacked ``[..., rows, cols]``."""
    f = resolve_format(fmt)
    return decode(codes, f, dtype) * scales.to(dtype)[..., None]


# mxfp8's element codes: e4m3fn (OCP) on every arch, as the checkpoint stores them
MX_CODE_FORMAT = E4M3FN
_MX_EMAX = 8  # the exponent of e4m3fn's largest value, 448 = 1.75 * 2**8


def scale_spec(layout: Layout, rows: int, cols: int) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and dtype of the scales of a ``[rows, cols]`` GEMV weight (module doc)."""
    if layout.weights.format == "mxfp8":
        return (rows, cols // layout.weights.block), torch.uint8
    return (rows,), torch.float32


def quantize_mx(
    w: torch.Tensor, block: int, what: str = "weight"
) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP MXFP8: ``(codes uint8 [rows, cols] e4m3fn, E8M0 scale bytes uint8 [rows, cols/block])``."""
    if w.dim() != 2 or w.shape[1] % block:
        raise BadInput(
            f"{what}: expected a 2-d weight of whole {block}-input blocks, got shape {list(w.shape)}"
        )
    w64 = w.to(torch.float64).reshape(w.shape[0], -1, block)
    amax = w64.abs().amax(dim=-1)
    if not bool(torch.isfinite(amax).all()):
        row = int(torch.nonzero(~torch.isfinite(amax))[0, 0])
        raise BadInput(f"{what}: row {row} has non-finite values")
    _, ex = torch.frexp(amax)  # amax = m * 2**ex with m in [0.5, 1): floor(log2) = ex - 1
    e = torch.where(amax > 0, ex - 1 - _MX_EMAX, 0).clamp(-E8M0_BIAS, E8M0_BIAS)
    codes = encode(torch.ldexp(w64, -e[..., None]), MX_CODE_FORMAT, saturate=True)
    return codes.reshape(w.shape), (e + E8M0_BIAS).to(torch.uint8)


def dequantize_mx(
    codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """``decode_e4m3fn(code) * 2**(byte - 127)`` per block (exact in float64); the block is
    ``cols / scales.shape[-1]``; works on stacked ``[..., rows, cols]``."""
    cols, nb = codes.shape[-1], scales.shape[-1]
    if nb == 0 or cols % nb or scales.shape[:-1] != codes.shape[:-1]:
        raise BadInput(f"mxfp8 scales {list(scales.shape)} do not block codes {list(codes.shape)}")
    vals = decode(codes, MX_CODE_FORMAT, torch.float64).reshape(*codes.shape[:-1], nb, -1)
    return (vals * e8m0_decode(scales)[..., None]).reshape(codes.shape).to(dtype)


def mx_codes_as_fnuz(
    codes: torch.Tensor, scales: torch.Tensor, what: str = "weight"
) -> tuple[torch.Tensor, torch.Tensor]:
    """mxfp8 weights for an arch whose fp8 instructions read e4m3fnuz (gfx942): the same bits
    mean half the value in e4m3fnuz (bias 8, not 7), so each scale byte gains one and every
    finite code keeps its bits; ``decode_fnuz(code') * 2**(byte' - 127)`` is then exactly the
    checkpoint's value. The codes whose meaning differs are rewritten: e4m3fn's ``-0`` (0x80,
    e4m3fnuz's NaN) becomes ``+0``, and its NaNs (0x7F, 0xFF: +-240 in e4m3fnuz) become the
    e4m3fnuz NaN 0x80. A scale byte of 254 (``2**127``) has no successor: ``BadInput``."""
    if codes.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise BadInput(
            f"{what}: mxfp8 codes and scales must be uint8, got {codes.dtype}, {scales.dtype}"
        )
    if bool((scales >= E8M0_NAN - 1).any()):
        at = torch.nonzero(scales >= E8M0_NAN - 1)[0].tolist()
        raise BadInput(
            f"{what}: scale byte {int(scales[tuple(at)])} at {at} has no e4m3fnuz equivalent"
            " (the largest it can take is 253)"
        )
    out = codes.clone()
    out[codes == 0x80] = 0x00
    out[(codes & 0x7F) == 0x7F] = 0x80
    return out, scales + 1


def quantize_weight(
    w: torch.Tensor, layout: Layout, fmt: FP8Format | str, what: str = "weight"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, scales)`` of one GEMV weight in the layout's weight format."""
    if layout.weights.format == "mxfp8":
        return quantize_mx(w, layout.weights.block, what)
    return quantize_rows(w, fmt, what)


def dequantize_weight(
    codes: torch.Tensor,
    scales: torch.Tensor,
    layout: Layout,
    fmt: FP8Format | str,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """The weight ``codes`` and ``scales`` stand for, in the layout's weight format."""
    if layout.weights.format == "mxfp8":
        return dequantize_mx(codes, scales, dtype)
    return dequantize_rows(codes, scales, fmt, dtype)


def shard_layer(layer: LayerWeights, layout: Layout, rank: int) -> LayerShard:
    """Rank ``rank``'s full-precision slices of ``layer``, in packed row order."""
    m, tp = layout.model, layout.parallel.tp
    if not 0 <= rank < tp:
        raise BadInput(f"rank {rank} is outside 0..{tp - 1}")
    D = m.head_dim
    qd, kvd = m.heads * D, m.kv_heads * D
    _check(layer.q, "layer.q", (qd, m.hidden))
    _check(layer.k, "layer.k", (kvd, m.hidden))
    _check(layer.v, "layer.v", (kvd, m.hidden))
    _check(layer.o, "layer.o", (m.hidden, qd))
    _check(layer.gate, "layer.gate", (m.mlp, m.hidden))
    _check(layer.up, "layer.up", (m.mlp, m.hidden))
    _check(layer.down, "layer.down", (m.hidden, m.mlp))
    qr, kr, mr = layout.q_rows_per_rank, layout.kv_rows_per_rank, layout.mlp_per_rank
    qkv = torch.cat(
        [
            layer.q[rank * qr : (rank + 1) * qr],
            layer.k[rank * kr : (rank + 1) * kr],
            layer.v[rank * kr : (rank + 1) * kr],
        ]
    )
    gu = torch.cat([layer.gate[rank * mr : (rank + 1) * mr], layer.up[rank * mr : (rank + 1) * mr]])
    return LayerShard(
        qkv=qkv,
        o=layer.o[:, rank * qr : (rank + 1) * qr],
        gu=gu,
        d=layer.down[:, rank * mr : (rank + 1) * mr],
        w_in=layer.w_in,
        w_post=layer.w_post,
        w_q=layer.w_q,
        w_k=layer.w_k,
        k_scale=layer.k_scale,
        v_scale=layer.v_scale,
    )


def _scale(value: float | torch.Tensor, what: str) -> torch.Tensor:
    v = torch.as_tensor(value, dtype=torch.float32).reshape(())
    if not (bool(torch.isfinite(v)) and float(v) > 0):
        raise BadInput(f"{what}: must be a positive finite number, got {float(v)}")
    return v


def pack_shard(shard: LayerShard, layout: Layout, fmt: FP8Format | str) -> dict[str, torch.Tensor]:
    """One layer of one rank: the eight GEMV tensors, four bf16 norms and two fp32 scales."""
    f = resolve_format(fmt)
    m = layout.model
    out: dict[str, torch.Tensor] = {}
    for name, shape in gemv_shapes(layout).items():
        w = _check(getattr(shard, name), f"shard.{name}", shape)
        codes, s = quantize_weight(w, layout, f, f"shard.{name}")
        out[f"{name}_w"], out[f"{name}_s"] = codes.contiguous(), s.contiguous()
    for name, n in (
        ("w_in", m.hidden),
        ("w_post", m.hidden),
        ("w_q", m.head_dim),
        ("w_k", m.head_dim),
    ):
        w = _check(getattr(shard, name), f"shard.{name}", (n,))
        if not bool(torch.isfinite(w).all()):
            raise BadInput(f"shard.{name}: has non-finite values")
        out[name] = w.to(torch.bfloat16).contiguous()
    out["k_scale"] = _scale(shard.k_scale, "k_scale")
    out["v_scale"] = _scale(shard.v_scale, "v_scale")
    return out


def pack_layer(
    layer: LayerWeights, layout: Layout, rank: int, fmt: FP8Format | str
) -> dict[str, torch.Tensor]:
    """``pack_shard(shard_layer(layer, layout, rank))``."""
    return pack_shard(shard_layer(layer, layout, rank), layout, fmt)


def stack_layers(
    per_layer: Sequence[Mapping[str, torch.Tensor]], final_norm: torch.Tensor, layout: Layout
) -> RankWeights:
    """Stack ``pack_shard`` outputs over layers the way the runner does (``torch.stack``)."""
    if len(per_layer) != layout.model.layers:
        raise BadInput(f"{len(per_layer)} layers given, the layout has {layout.model.layers}")
    fn = _check(final_norm, "final_norm", (layout.model.hidden,))
    return RankWeights(
        packed={n: torch.stack([w[n] for w in per_layer]).contiguous() for n in GEMV_NAMES},
        norms={n: torch.stack([w[n] for w in per_layer]).contiguous() for n in NORM_NAMES},
        k_scale=torch.stack([w["k_scale"] for w in per_layer]).to(torch.float32),
        v_scale=torch.stack([w["v_scale"] for w in per_layer]).to(torch.float32),
        final_norm=fn.to(torch.bfloat16).contiguous(),
    )


def pack_rank(
    layers: Sequence[LayerWeights],
    final_norm: torch.Tensor,
    layout: Layout,
    rank: int,
    fmt: FP8Format | str,
) -> RankWeights:
    """Every layer of rank ``rank``, stacked."""
    return stack_layers([pack_layer(w, layout, rank, fmt) for w in layers], final_norm, layout)


def pack_model(
    layers: Sequence[LayerWeights], final_norm: torch.Tensor, layout: Layout, fmt: FP8Format | str
) -> list[RankWeights]:
    """``pack_rank`` for every rank ``0..tp-1``."""
    return [pack_rank(layers, final_norm, layout, r, fmt) for r in range(layout.parallel.tp)]


def gemv_shapes(layout: Layout) -> dict[str, tuple[int, int]]:
    """``[rows, cols]`` of each of a rank's four GEMV weights (``qkv``, ``o``, ``gu``, ``d``)."""
    h = layout.model.hidden
    return {
        "qkv": (layout.qkv_rows_per_rank, h),
        "o": (h, layout.o_cols_per_rank),
        "gu": (layout.gu_rows_per_rank, h),
        "d": (h, layout.mlp_per_rank),
    }


def check_rank_weights(w: RankWeights, layout: Layout) -> None:
    """Shapes and dtypes of every tensor of ``w`` against ``layout``; ``BadInput`` names the first bad one."""
    m, L = layout.model, layout.model.layers
    want = {}
    for name, (rows, cols) in gemv_shapes(layout).items():
        shape, dtype = scale_spec(layout, rows, cols)
        want[f"{name}_w"] = ((L, rows, cols), torch.uint8)
        want[f"{name}_s"] = ((L, *shape), dtype)
    norms = {
        "w_in": (L, m.hidden),
        "w_post": (L, m.hidden),
        "w_q": (L, m.head_dim),
        "w_k": (L, m.head_dim),
    }
    groups = [("packed", w.packed, {k: v for k, v in want.items()})]
    groups.append(("norms", w.norms, {k: (s, torch.bfloat16) for k, s in norms.items()}))
    for group, have, spec in groups:
        for name, (shape, dtype) in spec.items():
            t = have.get(name)
            if t is None:
                raise BadInput(f"weights.{group}: missing {name!r}")
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise BadInput(
                    f"weights.{group}[{name!r}]: {t.dtype} {list(t.shape)}, expected {dtype} {list(shape)}"
                )
    for name in SCALE_NAMES:
        t = getattr(w, name)
        if tuple(t.shape) != (L,) or t.dtype != torch.float32:
            raise BadInput(
                f"weights.{name}: {t.dtype} {list(t.shape)}, expected torch.float32 [{L}]"
            )
        if not bool((torch.isfinite(t) & (t > 0)).all()):
            raise BadInput(f"weights.{name}: every layer's scale must be positive and finite")
    if tuple(w.final_norm.shape) != (m.hidden,) or w.final_norm.dtype != torch.bfloat16:
        raise BadInput(
            f"weights.final_norm: {w.final_norm.dtype} {list(w.final_norm.shape)}, expected "
            f"torch.bfloat16 [{m.hidden}]"
        )


def dequantize_shard(
    packed: Mapping[str, torch.Tensor],
    layout: Layout,
    fmt: FP8Format | str,
    dtype: torch.dtype = torch.float64,
) -> LayerShard:
    """The inverse of ``pack_shard`` (one layer): the weights the codes and scales stand for."""
    deq = {
        n: dequantize_weight(packed[f"{n}_w"], packed[f"{n}_s"], layout, fmt, dtype)
        for n in ("qkv", "o", "gu", "d")
    }
    return LayerShard(
        **deq,
        **{n: packed[n].to(dtype) for n in NORM_NAMES},
        k_scale=float(packed["k_scale"]),
        v_scale=float(packed["v_scale"]),
    )


def unshard(
    ranks: Sequence[RankWeights],
    layout: Layout,
    fmt: FP8Format | str,
    dtype: torch.dtype = torch.float64,
) -> tuple[list[LayerWeights], torch.Tensor]:
    """Reassemble the whole model from every rank's packed tensors (the inverse of ``pack_model``).

    Norm weights and K/V scales must agree across ranks (they are replicated); ``BadInput`` if not.
    """
    tp = layout.parallel.tp
    if len(ranks) != tp:
        raise BadInput(f"unshard needs all {tp} ranks, got {len(ranks)}")
    qr, kr, mr = layout.q_rows_per_rank, layout.kv_rows_per_rank, layout.mlp_per_rank
    out = []
    for i in range(layout.model.layers):
        shards = [dequantize_shard(r.layer(i), layout, fmt, dtype) for r in ranks]
        for s in shards[1:]:
            for name in (*NORM_NAMES, *SCALE_NAMES):
                a, b = getattr(shards[0], name), getattr(s, name)
                same = torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
                if not same:
                    raise BadInput(f"layer {i}: {name} differs between ranks (it is replicated)")
        layer = LayerWeights(
            q=torch.cat([s.qkv[:qr] for s in shards]),
            k=torch.cat([s.qkv[qr : qr + kr] for s in shards]),
            v=torch.cat([s.qkv[qr + kr :] for s in shards]),
            o=torch.cat([s.o for s in shards], dim=1),
            gate=torch.cat([s.gu[:mr] for s in shards]),
            up=torch.cat([s.gu[mr:] for s in shards]),
            down=torch.cat([s.d for s in shards], dim=1),
            **{
                f.name: getattr(shards[0], f.name)
                for f in fields(LayerShard)
                if f.name in (*NORM_NAMES, *SCALE_NAMES)
            },
        )
        out.append(layer)
    finals = [r.final_norm for r in ranks]
    if any(not torch.equal(finals[0], f) for f in finals[1:]):
        raise BadInput("final_norm differs between ranks (it is replicated)")
    return out, finals[0].to(dtype)


__all__ = [
    "GEMV_NAMES",
    "MX_CODE_FORMAT",
    "NORM_NAMES",
    "SCALE_NAMES",
    "LayerShard",
    "LayerWeights",
    "RankWeights",
    "check_rank_weights",
    "dequantize_rows",
    "dequantize_mx",
    "dequantize_shard",
    "dequantize_weight",
    "gemv_shapes",
    "mx_codes_as_fnuz",
    "pack_layer",
    "pack_model",
    "pack_rank",
    "pack_shard",
    "quantize_mx",
    "quantize_rows",
    "quantize_weight",
    "scale_spec",
    "shard_layer",
    "stack_layers",
    "unshard",
]
