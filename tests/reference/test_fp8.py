"""fp8 codecs against torch's float8 dtypes, bit for bit, and the rounding-boundary helper."""

from __future__ import annotations

import pytest
import torch

from mono_aot.reference import fp8
from mono_aot.reference.fp8 import (
    E4M3FN,
    E4M3FNUZ,
    boundary_distance,
    decode,
    decode_table,
    encode,
    format_for_arch,
    quantize_dequantize,
    resolve_format,
)

FORMATS = [E4M3FN, E4M3FNUZ]
ids = [f.name for f in FORMATS]
ALL = torch.arange(256, dtype=torch.uint8)


def torch_codes(x: torch.Tensor, f: fp8.FP8Format) -> torch.Tensor:
    return x.to(f.torch_dtype).view(torch.uint8)


def torch_values(f: fp8.FP8Format) -> torch.Tensor:
    return ALL.view(f.torch_dtype).to(torch.float32)


@pytest.mark.parametrize("f", FORMATS, ids=ids)
def test_decode_every_code_bit_for_bit(f):
    want = torch_values(f)
    got = decode(ALL, f)
    assert got.dtype == torch.float32
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    # finite codes: identical float32 bit patterns (so -0.0 stays -0.0); NaN codes: same sign
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))
    assert torch.equal(torch.signbit(got[nan]), torch.signbit(want[nan]))
    assert int(nan.sum()) == (2 if f is E4M3FN else 1)


@pytest.mark.parametrize("f", FORMATS, ids=ids)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_decode_other_dtypes_exact(f, dtype):
    want = ALL.view(f.torch_dtype).to(dtype)
    got = decode(ALL, f, dtype)
    nan = torch.isnan(want)
    assert torch.equal(got[~nan], want[~nan])
    assert torch.equal(torch.isnan(got), nan)
    # keeps any shape
    codes = ALL.reshape(4, 8, 8)
    assert torch.equal(decode(codes, f, dtype).reshape(-1)[~nan], want[~nan])


@pytest.mark.parametrize("f", FORMATS, ids=ids)
def test_format_constants(f):
    vals = decode(ALL, f, torch.float64)
    finite = vals[~torch.isnan(vals)]
    assert float(finite.max()) == f.max == float(vals[f.max_code])
    assert float(vals[f.nan_code]) != float(vals[f.nan_code])  # NaN
    pos = finite[finite > 0]
    assert float(pos.min()) == f.min_subnormal
    assert float(pos[pos >= 2.0**f.emin].min()) == f.min_normal
    assert f.max == torch.finfo(f.torch_dtype).max
    assert f.min_normal == torch.finfo(f.torch_dtype).smallest_normal


@pytest.mark.parametrize("f", FORMATS, ids=ids)
def test_encode_every_value_back_to_its_code(f):
    vals = decode(ALL, f)
    nan = torch.isnan(vals)
    got = encode(vals, f)
    assert torch.equal(got[~nan], ALL[~nan])
    assert torch.equal(got[nan], torch_codes(vals[nan], f))


def _sweep(f: fp8.FP8Format) -> torch.Tensor:
    """A dense float32 sweep: a fine stride through every bit pattern from 0 up past overflow,
    every midpoint between adjacent codes and its float32 neighbours, and the specials."""
    top = int(torch.tensor(4 * f.max, dtype=torch.float32).view(torch.int32))
    strided = torch.arange(0, top, 1009, dtype=torch.int32).view(torch.float32)
    mags = decode(ALL[: f.max_code + 1], f)
    nxt = torch.cat([mags[1:], torch.tensor([2 * f.max - float(mags[-2])])])  # one past max
    mids = (mags + nxt) / 2
    around = torch.cat([mids, mags, nxt])
    near = torch.cat(
        [
            torch.nextafter(around, torch.tensor(-1.0)),
            around,
            torch.nextafter(around, torch.tensor(1e9)),
        ]
    )
    specials = torch.tensor(
        [
            0.0,
            f.max,
            f.min_normal,
            f.min_subnormal,
            f.min_subnormal / 2,  # a tie between 0 and the smallest subnormal: rounds to 0
            f.min_subnormal * 0.75,
            f.min_subnormal * 1.5,  # tie between codes 1 and 2: rounds to 2 (even)
            1e-30,
            1e-45,
            3e38,
            float("inf"),
            float("nan"),
        ],
        dtype=torch.float32,
    )
    pos = torch.cat([strided, near, specials])
    return torch.cat([pos, -pos])


@pytest.mark.parametrize("arith", [True, False], ids=["arith", "fast"])
@pytest.mark.parametrize("f", FORMATS, ids=ids)
def test_encode_matches_torch_on_a_dense_sweep(f, arith):
    x = _sweep(f)
    assert x.numel() > 2_000_000
    got = encode(x, f, exact_arith=arith)
    want = torch_codes(x, f)
    bad = torch.nonzero(got != want)
    assert bad.numel() == 0, [(float(x[i]), int(got[i]), int(want[i])) for i in bad[:10, 0]]
    # bf16 and float16 inputs convert identically
    for dt in (torch.bfloat16, torch.float16):
        y = x.to(dt)
        assert torch.equal(encode(y, f, exact_arith=arith), torch_codes(y, f))


def test_default_overflow_rules_are_torchs():
    # e4m3fn saturates (infinities too); e4m3fnuz gives NaN past the overflow midpoint
    x = torch.tensor([464.0, 464.5, 1e6, float("inf"), -float("inf")])
    assert encode(x, E4M3FN).tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE]
    y = torch.tensor([247.9, 248.0, 1e6, float("inf"), -1e6])
    assert encode(y, E4M3FNUZ).tolist() == [0x7F, 0x80, 0x80, 0x80, 0x80]
    # 248 is the tie between 240 (odd code 0x7F) and the missing 256: it rounds up, i.e. overflows
    assert torch_codes(y, E4M3FNUZ).tolist() == [0x7F, 0x80, 0x80, 0x80, 0x80]


@pytest.mark.parametrize("arith", [True, False], ids=["arith", "fast"])
@pytest.mark.parametrize("f", FORMATS, ids=ids)
def test_saturate_true_clamps_and_false_overflows(f, arith):
    x = _sweep(f)
    x = x[~torch.isnan(x)]
    sat = encode(x, f, saturate=True, exact_arith=arith)
    over = encode(x, f, saturate=False, exact_arith=arith)
    assert torch.equal(sat, torch_codes(torch.clamp(x, -f.max, f.max), f))
    assert (decode(sat, f).abs() <= f.max).all()
    # the two rules differ exactly where the rounded magnitude would exceed max: NaN there
    past = sat != over
    assert torch.isnan(decode(over[past], f)).all()
    assert bool((x[past].abs() > f.max).all())
    assert torch.isinf(x[past]).any() and (x[past].abs() < 2 * f.max).any()
    # and just below the overflow midpoint nothing overflows
    assert not bool(
        (x.abs() < f.max + (f.max - float(decode(ALL[f.max_code - 1 : f.max_code], f))) / 2)[
            past
        ].any()
    )
    # NaN is NaN under every rule
    n = torch.tensor([float("nan")])
    for sat in (None, True, False):
        assert torch.isnan(decode(encode(n, f, saturate=sat), f)).all()


def test_signs_of_zero_and_nan():
    z = torch.tensor([0.0, -0.0, -1e-9, float("nan"), -float("nan")])
    assert encode(z, E4M3FN).tolist() == [0x00, 0x80, 0x80, 0x7F, 0xFF]
    assert encode(z, E4M3FNUZ).tolist() == [0x00, 0x00, 0x00, 0x80, 0x80]


@pytest.mark.parametrize("f", FORMATS, ids=ids)
def test_float64_input_is_rounded_once(f):
    # just above the midpoint between 1 and 1.125: a float32 detour lands on the tie, which
    # rounds to 1 (even); the exact value rounds up
    x = torch.tensor([1.0625 + 2.0**-30], dtype=torch.float64)
    for arith in (True, False):
        assert float(decode(encode(x, f, exact_arith=arith), f)) == 1.125
        assert float(decode(encode(x.float(), f, exact_arith=arith), f)) == 1.0
    # every midpoint, nudged by less than a float32 ulp either way, and far outside float32
    mags = decode(ALL[: f.max_code + 1], f, torch.float64)
    mids = (mags[:-1] + mags[1:]) / 2
    for sign in (1.0, -1.0):
        up = sign * mids * (1 + 2.0**-40)
        down = sign * mids * (1 - 2.0**-40)
        codes = ALL[: f.max_code + 1]
        for arith in (True, False):
            assert torch.equal(encode(up, f, exact_arith=arith) & 0x7F, codes[1:])
            assert torch.equal(encode(down, f, exact_arith=arith) & 0x7F, codes[:-1])
    wide = torch.tensor([1e300, -1e300, 1e-300, -1e-300, 3.4e38 * 2], dtype=torch.float64)
    for sat in (None, True, False):
        assert torch.equal(encode(wide, f, sat, exact_arith=True), encode(wide, f, sat))


@pytest.mark.parametrize("f", FORMATS, ids=ids)
def test_fast_and_arithmetic_paths_agree_on_random_float64(f):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1_000_000, generator=gen, dtype=torch.float64)
    x = x * torch.exp2(torch.randint(-14, 10, x.shape, generator=gen).double())
    for sat in (None, True, False):
        assert torch.equal(encode(x, f, sat, exact_arith=True), encode(x, f, sat))


def test_large_tensors_are_encoded_in_chunks(monkeypatch):
    monkeypatch.setattr(fp8, "_CHUNK", 1000)
    x = torch.randn(37, 111) * 50
    for f in FORMATS:
        for arith in (True, False):
            assert torch.equal(encode(x, f, exact_arith=arith), torch_codes(x, f))


@pytest.mark.parametrize("f", FORMATS, ids=ids)
def test_boundary_distance_bounds_where_codes_can_flip(f):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(200_000, generator=gen, dtype=torch.float64) * (f.max / 4)
    x = torch.cat([x, torch.randn(50_000, generator=gen, dtype=torch.float64) * f.min_normal])
    d = boundary_distance(x, f)
    base = encode(x, f, saturate=True)
    for rel in (1e-2, 1e-4, 1e-6):
        safe = d > rel
        for sign in (-1.0, 1.0):
            moved = encode(x * (1 + sign * rel * 0.999), f, saturate=True)
            assert torch.equal(moved[safe], base[safe])
    # every midpoint is a boundary, every code sits half a spacing away from one
    mags = decode(ALL[1 : f.max_code], f, torch.float64)
    mids = (mags[:-1] + mags[1:]) / 2
    assert torch.all(boundary_distance(mids, f) == 0)
    assert torch.all(boundary_distance(mags, f) > 1 / 40)
    assert torch.isinf(boundary_distance(torch.tensor([float("nan"), float("inf")]), f)).all()


def test_quantize_dequantize_is_decode_of_encode():
    x = torch.randn(1000, dtype=torch.float64) * 100
    for f in FORMATS:
        assert torch.equal(quantize_dequantize(x, f), decode(encode(x, f, True), f, torch.float64))


def test_formats_by_arch_and_name():
    assert format_for_arch("gfx942") is E4M3FNUZ
    assert format_for_arch("gfx950") is E4M3FN
    assert resolve_format("gfx942") is E4M3FNUZ
    assert resolve_format("e4m3fn") is E4M3FN
    assert resolve_format(E4M3FN) is E4M3FN
    with pytest.raises(KeyError, match="gfx940"):
        resolve_format("gfx940")
    with pytest.raises(KeyError, match="unsupported arch"):
        format_for_arch("gfx90a")


def test_bad_dtypes_are_refused():
    with pytest.raises(TypeError, match="uint8"):
        decode(torch.arange(3), E4M3FN)
    with pytest.raises(TypeError, match="floating-point"):
        encode(torch.arange(3), E4M3FN)


def test_decode_table_is_a_copy():
    t = decode_table(E4M3FN, torch.float64)
    t.zero_()
    assert float(decode(torch.tensor([0x38], dtype=torch.uint8), E4M3FN)) == 1.0


def test_code_distance_counts_representable_steps():
    for f in FORMATS:
        a = torch.tensor([0x38, 0x38, 0x38, 0xB8, 0x00, 0x01, f.max_code], dtype=torch.uint8)
        b = torch.tensor(
            [0x38, 0x39, 0x37, 0x38, 0x80 if f is E4M3FN else 0x00, 0x81, f.nan_code],
            dtype=torch.uint8,
        )
        got = fp8.code_distance(a, b, f).tolist()
        assert got[:6] == [0, 1, 1, 2 * 0x38, 0, 2]
        assert got[6] == 1000
        # one step apart is one code apart on the value line
        vals = decode(ALL[: f.max_code + 1], f, torch.float64)
        assert bool((vals[1:] > vals[:-1]).all())
