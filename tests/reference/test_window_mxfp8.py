"""The real model's semantics in the reference: MXFP8 weights (e4m3fn codes, E8M0 block
scales), the sliding window, causality and padded requests, each against the dense model."""

from __future__ import annotations

import pytest
import torch

from mono_aot.reference import RequestSpec, make_problem, max_rel_error, run_tp
from mono_aot.reference.fp8 import e8m0_decode
from mono_aot.reference.problem import MX_FINITE_CODES, exact_mx_codes, random_model
from mono_aot.reference.step import key_window, mx_quantize, norm_rel_error
from mono_aot.reference.weights import (
    dequantize_mx,
    mx_codes_as_fnuz,
    pack_model,
    quantize_mx,
    unshard,
)
from mono_aot.spec.errors import BadInput
from tests.reference.helpers import real_geometry_one_layer, small_layout

F, T = False, True


def test_every_e8m0_byte_is_the_power_of_two_torch_reads():
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = e8m0_decode(b)
    want = b.view(torch.float8_e8m0fnu).to(torch.float64)  # torch's own OCP E8M0 dtype
    assert torch.equal(got.isnan(), want.isnan()) and int(got.isnan().sum()) == 1
    ok = ~want.isnan()
    assert torch.equal(got[ok], want[ok])
    assert float(got[127]) == 1.0 and float(got[0]) == 2.0**-127


def test_every_mxfp8_code_under_every_scale_dequantizes_exactly():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(256, 1)  # [byte, code]
    scales = torch.arange(256, dtype=torch.int32).to(torch.uint8)[:, None].repeat(1, 8)
    got = dequantize_mx(codes, scales)  # blocks of 32 codes, one byte each
    elem = codes.view(torch.float8_e4m3fn).to(torch.float64)
    want = elem * torch.pow(2.0, torch.arange(256, dtype=torch.float64) - 127)[:, None]
    want[255] = float("nan")
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.equal(got[ok], want[ok])


def test_mx_quantization_reproduces_exact_matrices_and_bounds_others():
    gen = torch.Generator().manual_seed(3)
    codes, scales = exact_mx_codes(48, 256, 32, gen, gain=1.0)
    w = dequantize_mx(codes, scales, torch.float32)
    c2, s2 = quantize_mx(w, 32)
    assert torch.equal(c2, codes) and torch.equal(s2, scales)
    # a plain Gaussian: the block's absmax lies in [256, 512) * 2**e, so every element is
    # within half of e4m3's top spacing (32 * 2**e) of its value, or saturates from below 512
    g = torch.randn(16, 128, generator=gen, dtype=torch.float64) * 0.01
    c3, s3 = quantize_mx(g, 32)
    back = dequantize_mx(c3, s3)
    unit = e8m0_decode(s3).repeat_interleave(32, dim=1)
    err = (back - g).abs()
    assert bool((g.abs() < 512 * unit).all())
    assert bool((err <= torch.where(g.abs() > 448 * unit, g.abs() - 448 * unit, 16 * unit)).all())
    assert float((err / g.abs()).median()) < 0.07
    with pytest.raises(BadInput, match="whole 32-input blocks"):
        quantize_mx(g[:, :100], 32)


def test_mxfp8_packing_round_trips_through_the_ranks():
    lay = small_layout(weights={"format": "mxfp8", "block": 32})
    layers, final = random_model(lay, "gfx942", seed=4)
    ranks = pack_model(layers, final, lay, "gfx942")
    assert ranks[0].packed["qkv_s"].dtype == torch.uint8
    assert tuple(ranks[0].packed["o_s"].shape) == (lay.model.layers, 256, 64 // 32)
    back, _ = unshard(ranks, lay, "gfx942")
    for a, b in zip(layers, back, strict=True):
        for name in ("q", "k", "v", "o", "gate", "up", "down"):
            assert torch.equal(getattr(a, name).double(), getattr(b, name)), name


def test_key_window_is_vllms_rule():
    lay = small_layout(model={"window": 4})
    start, vis = key_window(lay, torch.tensor([10, 11]), 12)
    assert start == 7  # 10 - 4 + 1
    # query 10 sees 7..11 (the block is non-causal), query 11 sees 8..11
    assert vis.tolist() == [[T, T, T, T, T], [F, T, T, T, T]]
    causal = small_layout(model={"window": 4, "causal": True})
    _, vis = key_window(causal, torch.tensor([10, 11]), 12)
    assert vis.tolist() == [[T, T, T, T, F], [F, T, T, T, T]]
    assert key_window(lay, torch.tensor([0, 1]), 0)[1].numel() == 0  # a padded request


# contexts longer and shorter than the window, one that writes nothing, a padded request
WINDOWED = [
    RequestSpec(70),
    RequestSpec(5),
    RequestSpec(40, (T, F, T, T), seq_len=43),
    RequestSpec(0, (F, F, F, F), seq_len=0),
    RequestSpec(33, (F, F, F, F)),
]


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize(
    "sections",
    [
        {"model": {"window": 24}},
        {"model": {"window": 24, "causal": True}},
        {"weights": {"format": "mxfp8", "block": 32}},
        {"model": {"window": 17}, "weights": {"format": "mxfp8", "block": 32}},
        {"model": {"window": 4096}, "weights": {"format": "mxfp8", "block": 32}},  # never bites
    ],
    ids=["window", "window-causal", "mxfp8", "window-mxfp8", "wide-window-mxfp8"],
)
def test_reference_equals_dense_model(arch, sections):
    lay = small_layout(**sections)
    p = make_problem(lay, arch, WINDOWED, seed=17)
    res = run_tp(lay, p.fmt, p.ranks, p.caches(), p.inputs)
    assert bool(torch.isfinite(res.out).all())
    assert max_rel_error(res.out, p.dense()) < 1e-10
    # the padded request (the fourth) writes no K/V
    assert res.ranks[0].written[12:16].tolist() == [F] * 4


def test_the_window_changes_the_answer():
    """A wider window attends more keys; no window at all reads blocks the window leaves out."""
    lay = small_layout(model={"window": 24})
    p = make_problem(lay, "gfx950", WINDOWED[:1], seed=5)
    res = run_tp(lay, p.fmt, p.ranks, p.caches(), p.inputs)
    assert bool(torch.isfinite(res.out).all())
    wide = small_layout(model={"window": 30})
    q = make_problem(wide, "gfx950", WINDOWED[:1], seed=5)
    res_wide = run_tp(wide, q.fmt, q.ranks, q.caches(), q.inputs)
    assert max_rel_error(res_wide.out, res.out) > 1e-3  # six more keys change the output
    # read without the window, the problem's block-table entries below it are garbage
    with pytest.raises(BadInput, match=r"block_table\[0, 0\]"):
        run_tp(small_layout(), p.fmt, p.ranks, p.caches(), p.inputs)


@pytest.mark.slow
def test_real_geometry_one_layer_against_dense():
    lay = real_geometry_one_layer()
    reqs = [
        RequestSpec(5000),  # the window bites: keys from 5000 - 4095 on
        RequestSpec(0, (F,) * 7, seq_len=0),  # padded
    ]
    p = make_problem(lay, "gfx942", reqs, seed=23)
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in p.ranks[0].packed.items()}
    assert shapes["qkv_s"] == ((1, 2304, 192), torch.uint8)
    assert shapes["o_s"] == ((1, 6144, 64), torch.uint8)
    assert shapes["gu_s"] == ((1, 6144, 192), torch.uint8)
    assert shapes["d_s"] == ((1, 6144, 96), torch.uint8)
    caches = p.caches()
    assert tuple(caches[0][0].shape[1:]) == (1, 128, 256)
    res = run_tp(lay, p.fmt, p.ranks, caches, p.inputs)
    assert res.out.shape == (14, 6144)
    assert max_rel_error(res.out, p.dense()) < 1e-10


def test_every_e4m3fn_code_keeps_its_value_in_e4m3fnuz_under_the_next_scale():
    """gfx942 reads e4m3fnuz: the checkpoint's e4m3fn codes, rewritten for it, decode to the
    same values under every scale byte that has a successor (all 256 codes)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(254, 1)  # [byte, code]
    scales = torch.arange(254, dtype=torch.int32).to(torch.uint8)[:, None].repeat(1, 8)
    fnuz, s2 = mx_codes_as_fnuz(codes, scales)
    want = dequantize_mx(codes, scales)  # e4m3fn, as the checkpoint means it
    unit = torch.pow(2.0, s2.to(torch.float64) - 127).repeat_interleave(32, dim=1)
    got = fnuz.view(torch.float8_e4m3fnuz).to(torch.float64) * unit  # torch's own fnuz decode
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.equal(got[ok], want[ok])  # -0 became +0: equal as values
    assert fnuz[0, 0x80] == 0 and fnuz[0, 0x7F] == fnuz[0, 0xFF] == 0x80
    with pytest.raises(BadInput, match="scale byte 254 at \\[0, 1\\]"):
        mx_codes_as_fnuz(codes[:1, :64], torch.tensor([[3, 254]], dtype=torch.uint8))


def test_mxfp8_problems_hold_every_finite_code_so_the_emulator_judges_each():
    # gfx942 reads e4m3fn's -0 (0x80) as NaN unless the kernels clear it: every problem matrix
    # holds it and the other 253 finite codes (tests/emulator/test_emulate.py runs them)
    gen = torch.Generator().manual_seed(3)
    codes, scales = exact_mx_codes(64, 1024, 32, gen)
    assert set(codes.unique().tolist()) == set(MX_FINITE_CODES.tolist())
    assert len(MX_FINITE_CODES) == 254 and 0x80 in MX_FINITE_CODES.tolist()
    again = quantize_mx(dequantize_mx(codes, scales), 32)
    assert torch.equal(again[0], codes) and torch.equal(again[1], scales)


def test_stock_activation_quantisation_is_vllms_mxfp8_rule():
    """``mx_quantize`` against vLLM's rule written with torch's own e4m3fn dtype: a block's
    scale is the power of two that fits its amax into +-448 (a block whose amax is exactly a
    power of two times 448 keeps that power), an all-zero block stays zero, and tiny blocks
    clamp the biased exponent at 0."""
    gen = torch.Generator().manual_seed(3)
    t = torch.randn(6, 128, generator=gen, dtype=torch.float64) * 3
    t[1, :32] = 0.0
    t[2, 32:64] *= 1e-40  # subnormal-sized values: the exponent clamps
    t[3, 64:96] = t[3, 64:96] / t[3, 64:96].abs().max() * 448 * 2.0**-5  # amax on a power
    t = t.to(torch.bfloat16).to(torch.float64)
    x = t.to(torch.float32).view(6, 4, 32)
    amax = x.abs().amax(-1).clamp(min=torch.finfo(torch.float32).tiny)
    biased = (torch.ceil(torch.log2(amax / 448)) + 127).clamp(0, 254)
    d = torch.exp2(biased - 127)
    want = (x / d[..., None]).to(torch.float8_e4m3fn).to(torch.float64) * d[..., None].double()
    got = mx_quantize(t, 32)
    assert torch.equal(got, want.view(6, 128))
    assert bool((got[1, :32] == 0).all()) and float(biased[3, 2]) == 127 - 5
    assert float(got[3, 64:96].abs().max()) == 448 * 2.0**-5
    with pytest.raises(BadInput, match="not whole blocks of 32"):
        mx_quantize(t[:, :48], 32)


def test_the_stock_model_lands_farther_from_float64_than_the_kernel_numerics():
    """Given the same K/V bytes, the kernels' storage (bf16 activations into every projection)
    lands within 1e-2 of the float64 step, vLLM's stock numerics (MXFP8 activations) several
    times farther: the comparison the README states."""
    lay = small_layout(model={"window": 17}, weights={"format": "mxfp8", "block": 32})
    p = make_problem(lay, "gfx950", WINDOWED, seed=29)
    kern = run_tp(lay, p.fmt, p.ranks, p.caches(), p.inputs, "kernel")
    forced = [r.kv for r in kern.ranks]
    exact = run_tp(lay, p.fmt, p.ranks, p.caches(), p.inputs, "float64", forced)
    stock = run_tp(lay, p.fmt, p.ranks, p.caches(), p.inputs, "stock", forced)
    k_err, s_err = norm_rel_error(kern.out, exact.out), norm_rel_error(stock.out, exact.out)
    assert k_err < 1e-2 and s_err > 3 * k_err, (k_err, s_err)
    assert stock.out.dtype == torch.bfloat16
