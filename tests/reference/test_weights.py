"""Weight packing: per-row fp8 quantization, the per-rank row layout, stacking and the inverse."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mono_aot.reference.fp8 import E4M3FN, E4M3FNUZ, decode, encode
from mono_aot.reference.problem import (
    RequestSpec,
    exact_weight,
    make_problem,
    random_model,
    random_packed_model,
)
from mono_aot.reference.weights import (
    GEMV_NAMES,
    LayerWeights,
    check_rank_weights,
    dequantize_rows,
    pack_layer,
    pack_model,
    quantize_rows,
    shard_layer,
    unshard,
)
from mono_aot.spec.errors import BadInput
from tests.reference.helpers import shipped_one_layer, small_layout

FORMATS = [E4M3FNUZ, E4M3FN]
ids = [f.name for f in FORMATS]


@pytest.mark.parametrize("f", FORMATS, ids=ids)
def test_quantize_rows_absmax(f):
    gen = torch.Generator().manual_seed(0)
    w = (
        torch.randn(64, 96, generator=gen, dtype=torch.float64)
        * torch.logspace(-3, 2, 64, dtype=torch.float64)[:, None]
    )
    codes, s = quantize_rows(w, f)
    assert codes.dtype == torch.uint8 and codes.shape == w.shape
    assert s.dtype == torch.float32 and s.shape == (64,)
    assert torch.equal(s, (w.abs().amax(1) / f.max).to(torch.float32))
    vals = decode(codes, f, torch.float64)
    # each row's absmax lands on +-max (or the code below when fp32 rounded the scale down)
    top = vals.abs().amax(1)
    assert bool(
        (
            (top == f.max)
            | (top == float(decode(torch.tensor([f.max_code - 1], dtype=torch.uint8), f)))
        ).all()
    )
    # dequantized within half an fp8 spacing: 2^-4 relative for normals, half a subnormal step below
    err = (dequantize_rows(codes, s, f) - w).abs()
    s64 = s.double()[:, None]
    bound = torch.maximum(w.abs() * 2.0**-4, s64 * f.min_subnormal / 2) * (1 + 1e-12)
    assert bool((err <= bound).all())
    # nothing is NaN, even on fnuz where the format's own rule would overflow
    assert not bool(torch.isnan(vals).any())


def test_quantize_rows_zero_rows_and_bad_input():
    w = torch.zeros(3, 16)
    w[1, 5] = -2.0
    codes, s = quantize_rows(w, E4M3FNUZ)
    assert s.tolist() == [1.0, float(torch.tensor(2.0 / 240, dtype=torch.float32)), 1.0]
    assert int(codes[0].count_nonzero()) == 0 and int(codes[2].count_nonzero()) == 0
    assert int(codes[1, 5]) == 0xFF  # -240
    with pytest.raises(BadInput, match="2-d"):
        quantize_rows(torch.zeros(4), E4M3FN)


@pytest.mark.parametrize("f", FORMATS, ids=ids)
def test_exact_weights_quantize_without_loss(f):
    gen = torch.Generator().manual_seed(1)
    w = exact_weight(40, 64, 4, f, gen)
    for g in range(4):
        part = w[:, g * 16 : (g + 1) * 16]
        codes, s = quantize_rows(part, f)
        assert torch.equal(dequantize_rows(codes, s, f).to(torch.float32), part)
        assert torch.equal(encode(decode(codes, f), f), codes)


def _identifiable(layout) -> LayerWeights:
    """Every row of q/k/v/gate/up is a constant that names it; o and down are 1 + column."""
    m = layout.model
    D = m.head_dim

    def rows(n: int, base: float) -> torch.Tensor:
        return (base + torch.arange(n, dtype=torch.float64))[:, None].expand(n, m.hidden).clone()

    cols = lambda r, c: (1.0 + torch.arange(c, dtype=torch.float64))[None, :].expand(r, c).clone()  # noqa: E731
    return LayerWeights(
        q=rows(m.heads * D, 1000),
        k=rows(m.kv_heads * D, 2000),
        v=rows(m.kv_heads * D, 3000),
        o=cols(m.hidden, m.heads * D),
        gate=rows(m.mlp, 4000),
        up=rows(m.mlp, 6000),
        down=cols(m.hidden, m.mlp),
        w_in=torch.full((m.hidden,), 0.5),
        w_post=torch.full((m.hidden,), -0.25),
        w_q=torch.full((D,), 0.125),
        w_k=torch.full((D,), 2.0),
        k_scale=0.1,
        v_scale=0.2,
    )


@pytest.mark.parametrize(
    "lay",
    [small_layout(), small_layout(model={"heads": 16, "kv_heads": 8})],
    ids=["kv1", "kv2"],
)
def test_pack_row_layout(lay):
    """Rank r: q heads r*Q.., then its K head(s), then its V head(s); gate then up rows of its MLP
    slice; its column slices of o and down; per-row scales of each slice."""
    w = _identifiable(lay)
    D = lay.model.head_dim
    Q, K, mr = lay.q_heads_per_rank, lay.kv_heads_per_rank, lay.mlp_per_rank
    f = E4M3FNUZ
    for r in range(lay.parallel.tp):
        p = pack_layer(w, lay, r, f)
        # a constant row quantizes to all +max codes, so its scale is its value / max
        want_qkv = torch.cat(
            [
                1000 + torch.arange(r * Q * D, (r + 1) * Q * D),
                2000 + torch.arange(r * K * D, (r + 1) * K * D),
                3000 + torch.arange(r * K * D, (r + 1) * K * D),
            ]
        ).to(torch.float64)
        assert torch.equal(p["qkv_s"], (want_qkv / f.max).to(torch.float32))
        assert bool((p["qkv_w"] == f.max_code).all())
        want_gu = torch.cat(
            [4000 + torch.arange(r * mr, (r + 1) * mr), 6000 + torch.arange(r * mr, (r + 1) * mr)]
        )
        assert torch.equal(p["gu_s"], (want_gu.double() / f.max).to(torch.float32))
        # row-parallel: rank r's columns r*Q*D.. of o, its own absmax per row
        for name, full, width in (("o", w.o, Q * D), ("d", w.down, mr)):
            codes, s = quantize_rows(full[:, r * width : (r + 1) * width], f)
            assert torch.equal(p[f"{name}_w"], codes) and torch.equal(p[f"{name}_s"], s)
            assert float(p[f"{name}_s"][0]) == pytest.approx((r + 1) * width / f.max, rel=1e-7)
        assert p["w_in"].dtype == torch.bfloat16 and float(p["w_in"][0]) == 0.5
        assert p["k_scale"].dtype == torch.float32 and float(p["k_scale"]) == pytest.approx(0.1)
        shard = shard_layer(w, lay, r)
        assert torch.equal(shard.qkv[: Q * D], w.q[r * Q * D : (r + 1) * Q * D])


@pytest.mark.parametrize("f", FORMATS, ids=ids)
def test_pack_model_shapes_and_exact_roundtrip(f):
    lay = small_layout()
    layers, final = random_model(lay, f, seed=3)
    ranks = pack_model(layers, final, lay, f)
    L, h = lay.model.layers, lay.model.hidden
    shapes = {
        "qkv_w": (L, lay.qkv_rows_per_rank, h),
        "qkv_s": (L, lay.qkv_rows_per_rank),
        "o_w": (L, h, lay.o_cols_per_rank),
        "o_s": (L, h),
        "gu_w": (L, 2 * lay.mlp_per_rank, h),
        "gu_s": (L, 2 * lay.mlp_per_rank),
        "d_w": (L, h, lay.mlp_per_rank),
        "d_s": (L, h),
    }
    for rw in ranks:
        check_rank_weights(rw, lay)
        assert {k: tuple(v.shape) for k, v in rw.packed.items()} == shapes
        assert all(rw.packed[n].is_contiguous() for n in GEMV_NAMES)
        # the runner's stacking: torch.stack over the per-layer dicts
        for i in range(L):
            assert torch.equal(rw.layer(i)["qkv_w"], rw.packed["qkv_w"][i])
    # fp8-exact weights: the inverse reproduces every float exactly
    back, fn = unshard(ranks, lay, f)
    assert torch.equal(fn, final.double())
    for a, b in zip(back, layers, strict=True):
        for fld in dataclasses.fields(LayerWeights):
            x, y = getattr(a, fld.name), getattr(b, fld.name)
            if isinstance(x, torch.Tensor):
                assert torch.equal(x, y.double()), fld.name
            else:
                assert x == y, fld.name


@pytest.mark.parametrize("weights", ["fp8-row", "mxfp8"])
@pytest.mark.parametrize("f", FORMATS, ids=ids)
def test_packed_random_model_is_the_packed_float_model(f, weights):
    """The emulator's model is generated as codes and scales (never in float32): it must be
    the very bytes packing the float model gives, and a problem built on it the same launch."""
    lay = small_layout(weights={"format": weights})
    layers, final = random_model(lay, f, seed=7)
    want = pack_model(layers, final, lay, f)
    got = random_packed_model(lay, f, seed=7)
    assert len(got) == len(want) == lay.parallel.tp
    for r, (a, b) in enumerate(zip(got, want, strict=True)):
        check_rank_weights(a, lay)
        for group in ("packed", "norms"):
            for name, t in getattr(b, group).items():
                u = getattr(a, group)[name]
                assert u.dtype == t.dtype and torch.equal(u, t), (r, group, name)
        for name in ("k_scale", "v_scale", "final_norm"):
            assert torch.equal(getattr(a, name), getattr(b, name)), (r, name)
    reqs = [RequestSpec(context=5), RequestSpec(context=0)]
    p_packed = make_problem(lay, f, reqs, seed=1, model=got)
    p_float = make_problem(lay, f, reqs, seed=1, model=(layers, final))
    assert all(
        torch.equal(a, b) for a, b in zip(p_packed.caches()[0], p_float.caches()[0], strict=True)
    )
    assert torch.equal(p_packed.inputs.x, p_float.inputs.x)
    # the full-precision model, rebuilt from the bytes on demand, is the float model
    for a, b in zip(p_packed.layers, layers, strict=True):
        assert torch.equal(a.q, b.q.double()) and a.k_scale == b.k_scale


def test_inexact_weights_roundtrip_within_fp8_and_requantize_identically():
    lay = small_layout()
    f = E4M3FN
    layers, final = random_model(lay, f, seed=4, exact=False)
    ranks = pack_model(layers, final, lay, f)
    back, _ = unshard(ranks, lay, f)
    for a, b in zip(back, layers, strict=True):
        for name in ("q", "k", "v", "o", "gate", "up", "down"):
            x, y = getattr(a, name), getattr(b, name).double()
            assert (x - y).abs().max() <= 2.0**-4 * y.abs().max()
            assert not torch.equal(x, y)
    again = pack_model(back, final, lay, f)
    for r1, r2 in zip(ranks, again, strict=True):
        for name in GEMV_NAMES:
            assert torch.equal(r1.packed[name], r2.packed[name]), name


def test_bad_weights_are_named():
    lay = small_layout()
    layers, final = random_model(lay, E4M3FN, seed=5)
    w = layers[0]
    with pytest.raises(BadInput, match=r"layer\.q: shape"):
        pack_layer(dataclasses.replace(w, q=w.q[:-1]), lay, 0, E4M3FN)
    bad = w.gate.clone()
    bad[3, 4] = float("nan")
    with pytest.raises(BadInput, match="shard.gu: row 3 has non-finite"):
        pack_layer(dataclasses.replace(w, gate=bad), lay, 0, E4M3FN)
    with pytest.raises(BadInput, match="rank 4"):
        pack_layer(w, lay, 4, E4M3FN)
    with pytest.raises(BadInput, match="k_scale"):
        pack_layer(dataclasses.replace(w, k_scale=0.0), lay, 0, E4M3FN)
    ranks = pack_model(layers, final, lay, E4M3FN)
    rw = ranks[0]
    broken = dataclasses.replace(rw, packed={**rw.packed, "o_s": rw.packed["o_s"].double()})
    with pytest.raises(BadInput, match=r"weights.packed\['o_s'\]"):
        check_rank_weights(broken, lay)
    odd = dataclasses.replace(ranks[1], norms={**ranks[1].norms, "w_k": ranks[1].norms["w_k"] + 1})
    with pytest.raises(BadInput, match="w_k differs between ranks"):
        unshard([ranks[0], odd, ranks[2], ranks[3]], lay, E4M3FN)


def test_shipped_per_rank_shapes():
    """The shipped geometry's per-rank tensor shapes, computed by hand."""
    lay = shipped_one_layer()
    assert lay.qkv_rows_per_rank == 16 * 128 + 128 + 128 == 2304
    assert lay.o_cols_per_rank == 2048
    assert lay.gu_rows_per_rank == 2 * 12288 // 4 == 6144
    assert lay.mlp_per_rank == 3072
    assert lay.kv_entry_bytes == 256
