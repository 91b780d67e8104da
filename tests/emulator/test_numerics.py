"""The emulator's numerics (mono_aot/emulator/numerics.py) against torch and the ISA guides.

Layouts in the MFMA tests are written here from the documented formulas (AMD's matrix
instruction calculator, CDNA3), not taken from the module, so a wrong layout there fails.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mono_aot.emulator import numerics as N
from mono_aot.emulator.lanes import LANES, OpContext, as_f32, as_u32
from mono_aot.reference import fp8 as ref_fp8

ARCHS = ("gfx942", "gfx950")
TORCH_FP8 = {"gfx942": torch.float8_e4m3fnuz, "gfx950": torch.float8_e4m3fn}
TORCH_BF8 = {"gfx942": torch.float8_e5m2fnuz, "gfx950": torch.float8_e5m2}


def u32(x: np.ndarray) -> np.ndarray:
    return as_u32(np.asarray(x, dtype=np.float32)).copy()


def torch_encode(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    return torch.from_numpy(x).to(dtype).view(torch.uint8).numpy()


def sweep() -> np.ndarray:
    """Dense float32 sweep: every fp8/bf8 value, the midpoints between neighbours and one ulp
    either side, subnormals, overflow, +-0, infinities, NaN, random values over all binades."""
    vals = []
    for fmt in (N.E4M3FN, N.E4M3FNUZ, N.E5M2, N.E5M2FNUZ):
        t = N._table(fmt)
        t = np.unique(np.abs(t[np.isfinite(t)]))
        mids = (t[:-1] + t[1:]) / 2
        top = t[-1] + (t[-1] - t[-2]) / 2  # the overflow midpoint
        for v in (t, mids, np.array([top, 2 * t[-1]])):
            v32 = v.astype(np.float32)
            vals += [v32, np.nextafter(v32, np.float32(np.inf)), np.nextafter(v32, np.float32(0))]
    rng = np.random.default_rng(0)
    vals.append(
        (rng.standard_normal(20000) * np.exp2(rng.uniform(-20, 20, 20000))).astype(np.float32)
    )
    vals.append(np.array([0.0, np.inf, 1e-45, 1e-40, 3e38], np.float32))
    x = np.concatenate(vals).astype(np.float32)
    return np.concatenate([x, -x, np.array([np.nan, -np.nan], np.float32)])


# ----------------------------------------------------------------------------- fp8 codecs
@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_decode_all_codes_equal_torch(arch: str) -> None:
    codes = np.arange(256, dtype=np.uint8)
    ours = N.fp8_decode(codes, arch)
    want = torch.from_numpy(codes).view(TORCH_FP8[arch]).float().numpy()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(as_u32(ours)[ok], as_u32(want)[ok])  # -0 too
    # and the project's own fp8 reference
    refv = ref_fp8.decode(torch.from_numpy(codes), arch).numpy()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(refv))
    np.testing.assert_array_equal(ours[ok], refv[ok])


@pytest.mark.parametrize("arch", ARCHS)
def test_bf8_decode_all_codes_equal_torch(arch: str) -> None:
    codes = np.arange(256, dtype=np.uint8)
    ours = N.minifloat_decode(codes, N.bf8_format(arch))
    want = torch.from_numpy(codes).view(TORCH_BF8[arch]).float().numpy()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(as_u32(ours)[ok], as_u32(want)[ok])


@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_encode_sweep_matches_torch_in_range(arch: str) -> None:
    x = sweep()
    fmt = N.fp8_format(arch)
    for saturate in (False, True):
        ours = N.fp8_encode(x, arch, saturate=saturate)
        a = np.abs(x.astype(np.float64))
        over = ~np.isfinite(a) | (a >= fmt.max + (fmt.max - N._table(fmt)[fmt.max_code - 1]) / 2)
        inside = ~over & ~np.isnan(x)
        want = torch_encode(x, TORCH_FP8[arch])
        np.testing.assert_array_equal(ours[inside], want[inside])
        # saturation: torch's conversion of the clamped value (the project's writers do this)
        if saturate:
            clamped = np.clip(x, -fmt.max, fmt.max)
            np.testing.assert_array_equal(
                ours[~np.isnan(x)], torch_encode(clamped, TORCH_FP8[arch])[~np.isnan(x)]
            )
        # and the project's arithmetic reference, both rules
        refc = ref_fp8.encode(
            torch.from_numpy(x), arch, saturate=saturate, exact_arith=True
        ).numpy()
        np.testing.assert_array_equal(ours, refc)


def test_fp8_encode_documented_overflow_rule() -> None:
    """FP16_OVFL clear: an overflow or infinity is NaN in FP8 on both archs (CDNA3/CDNA4 guide
    FP16_OVFL rule), set: +-max. torch's e4m3fn conversion saturates instead; asserted."""
    x = np.array([1e6, -1e6, np.inf, -np.inf, 464.0, 480.0, -480.0], np.float32)
    np.testing.assert_array_equal(N.fp8_encode(x, "gfx950", saturate=False),
                                  [0x7F, 0xFF, 0x7F, 0xFF, 0x7E, 0x7F, 0xFF])  # fmt: skip
    np.testing.assert_array_equal(N.fp8_encode(x, "gfx950", saturate=True),
                                  [0x7E, 0xFE, 0x7E, 0xFE, 0x7E, 0x7E, 0xFE])  # fmt: skip
    torch_codes = torch_encode(x[:2], torch.float8_e4m3fn)
    assert list(torch_codes) == [0x7E, 0xFE]  # torch saturates where the hardware gives NaN
    y = np.array([1e6, -np.inf, 248.0, 247.0, -0.0, -1e-9, np.nan], np.float32)
    np.testing.assert_array_equal(N.fp8_encode(y, "gfx942", saturate=False),
                                  [0x80, 0x80, 0x80, 0x7F, 0x00, 0x00, 0x80])  # fmt: skip
    np.testing.assert_array_equal(N.fp8_encode(y, "gfx942", saturate=True),
                                  [0x7F, 0xFF, 0x7F, 0x7F, 0x00, 0x00, 0x80])  # fmt: skip
    # OCP e5m2 (gfx950 BF8) overflows to infinity, e5m2fnuz (gfx942) to its NaN
    big = np.array([1e6, -1e6], np.float32)
    assert list(N.minifloat_encode(big, N.bf8_format("gfx950"), saturate=False)) == [0x7C, 0xFC]
    assert list(N.minifloat_encode(big, N.bf8_format("gfx942"), saturate=False)) == [0x80, 0x80]


@pytest.mark.parametrize("arch", ARCHS)
def test_bf8_encode_sweep_matches_torch_in_range(arch: str) -> None:
    x = sweep()
    fmt = N.bf8_format(arch)
    ours = N.minifloat_encode(x, fmt, saturate=True)
    inside = np.abs(x) <= fmt.max
    np.testing.assert_array_equal(ours[inside], torch_encode(x, TORCH_BF8[arch])[inside])


def test_encode_rejects_other_dtypes() -> None:
    with pytest.raises(TypeError, match="float32"):
        N.fp8_encode(np.zeros(3), "gfx942", saturate=False)
    with pytest.raises(ValueError, match="gfx1100"):
        N.fp8_decode(np.zeros(3, np.uint8), "gfx1100")


# ----------------------------------------------------------------------------- conversion ops
def lanes(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 2**32, LANES, dtype=np.uint64).astype(np.uint32)


@pytest.mark.parametrize("arch", ARCHS)
def test_cvt_pk_f32_fp8_places_both_codes(arch: str) -> None:
    rng = np.random.default_rng(1)
    w = lanes(rng)
    out = N.NUMERICS["v_cvt_pk_f32_fp8"](OpContext(arch), w)
    assert out.shape == (LANES, 2) and out.dtype == np.uint32
    table = torch.arange(256, dtype=torch.uint8).view(TORCH_FP8[arch]).float().numpy()
    for k in range(2):
        want = table[(w >> (8 * k)) & 0xFF]
        got = as_f32(out[:, k].copy())
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])
    # only bits 15:0 are read (the executor passes the selected word there)
    out2 = N.NUMERICS["v_cvt_pk_f32_fp8"](OpContext(arch), w & 0xFFFF)
    np.testing.assert_array_equal(out, out2)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("word", [0, 1])
def test_cvt_pk_fp8_f32_writes_one_half(arch: str, word: int) -> None:
    rng = np.random.default_rng(2)
    s0 = u32(rng.standard_normal(LANES) * 50)
    s1 = u32(rng.standard_normal(LANES) * 50)
    old = lanes(rng)
    out = N.NUMERICS["v_cvt_pk_fp8_f32"](OpContext(arch, old_dst=old, dst_word=word), s0, s1)
    c0 = torch_encode(as_f32(s0), TORCH_FP8[arch]).astype(np.uint32)
    c1 = torch_encode(as_f32(s1), TORCH_FP8[arch]).astype(np.uint32)
    pair = c0 | (c1 << 8)
    if word == 0:
        want = (old & 0xFFFF0000) | pair
    else:
        want = (old & 0x0000FFFF) | (pair << 16)
    np.testing.assert_array_equal(out, want.astype(np.uint32))


def test_cvt_pk_fp8_f32_overflow_follows_fp16_ovfl() -> None:
    s0 = u32(np.full(LANES, 1e5))
    s1 = u32(np.full(LANES, -1e5))
    ctx = OpContext("gfx950", old_dst=np.zeros(LANES, np.uint32), clamp=True)  # clamp ignored
    assert N.NUMERICS["v_cvt_pk_fp8_f32"](ctx, s0, s1)[0] == 0xFF7F
    assert N.numerics_table(fp16_ovfl=True)["v_cvt_pk_fp8_f32"](ctx, s0, s1)[0] == 0xFE7E


def test_cvt_pk_bf16_f32_matches_torch() -> None:
    x = sweep()[: 2 * LANES * 40].reshape(-1, 2, LANES)
    for s0f, s1f in x:
        s0, s1 = u32(s0f), u32(s1f)
        out = N.NUMERICS["v_cvt_pk_bf16_f32"](OpContext("gfx950"), s0, s1)
        b0 = torch.from_numpy(s0f).to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16)
        b1 = torch.from_numpy(s1f).to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16)
        np.testing.assert_array_equal(out & 0xFFFF, b0)
        np.testing.assert_array_equal(out >> 16, b1)
    with pytest.raises(ValueError, match="gfx942"):
        N.NUMERICS["v_cvt_pk_bf16_f32"](OpContext("gfx942"), s0, s1)


def test_cvt_scalef32_pk_bf16_fp8() -> None:
    rng = np.random.default_rng(3)
    w = lanes(rng)
    table = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    for scale in (1.0, 2.0**-20, 2.0**40, 0.75):  # 0.75: only the exponent (2**-1) counts
        out = N.NUMERICS["v_cvt_scalef32_pk_bf16_fp8"](
            OpContext("gfx950"), w, u32(np.full(LANES, scale))
        )
        e = np.floor(np.log2(scale))
        for k in range(2):
            v = table[torch.from_numpy(((w >> (8 * k)) & 0xFF).astype(np.int64))] * 2.0**e
            want = v.to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16)
            got = ((out >> (16 * k)) & 0xFFFF).astype(np.uint16)
            nan = np.isnan(v.numpy())
            np.testing.assert_array_equal(got[~nan], want[~nan])
            assert np.all((got[nan] & 0x7FFF) == 0x7FC0)


# ----------------------------------------------------------------------------- transcendentals
def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 ulps between float32 arrays (ordered integer mapping)."""

    def key(x: np.ndarray) -> np.ndarray:
        i = as_u32(x.astype(np.float32)).astype(np.int64)
        return np.where(i >= 2**31, 2**31 - i, i)

    return np.abs(key(a) - key(b))


UNARY = {
    "v_exp_f32": (
        np.exp2,
        lambda r: np.concatenate([r.uniform(-150, 130, 4000), r.standard_normal(2000)]),
    ),
    "v_log_f32": (np.log2, lambda r: np.exp2(r.uniform(-126, 127, 6000))),
    "v_rcp_f32": (
        lambda x: 1 / x,
        lambda r: np.exp2(r.uniform(-126, 127, 6000)) * r.choice([-1, 1], 6000),
    ),
    "v_rsq_f32": (lambda x: 1 / np.sqrt(x), lambda r: np.exp2(r.uniform(-126, 127, 6000))),
    "v_sqrt_f32": (np.sqrt, lambda r: np.exp2(r.uniform(-126, 127, 6000))),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_transcendental_within_one_ulp_of_float64(name: str) -> None:
    fn, gen = UNARY[name]
    x = gen(np.random.default_rng(4)).astype(np.float32)
    x = x[: len(x) // LANES * LANES].reshape(-1, LANES)
    for row in x:
        got = as_f32(N.NUMERICS[name](OpContext("gfx942"), u32(row)))
        with np.errstate(all="ignore"):
            exact = fn(row.astype(np.float64))
            want = exact.astype(np.float32)
        tiny = np.abs(exact) < 2.0**-126  # results the guide flushes
        assert np.all(ulp_distance(got[~tiny], want[~tiny]) <= 1), name
        assert np.all(got[tiny] == 0)


# the guides' functional examples (CDNA3 guide 12.8: V_EXP_F32 ... V_SQRT_F32)
EXAMPLES = {
    "v_exp_f32": [(0xFF800000, 0x00000000), (0x80000000, 0x3F800000), (0x7F800000, 0x7F800000)],
    "v_log_f32": [(0xFF800000, 0xFFC00000), (0xBF800000, 0xFFC00000), (0x80000000, 0xFF800000),
                  (0x00000000, 0xFF800000), (0x3F800000, 0x00000000), (0x7F800000, 0x7F800000)],
    "v_rcp_f32": [(0xFF800000, 0x80000000), (0xC0000000, 0xBF000000), (0x80000000, 0xFF800000),
                  (0x00000000, 0x7F800000), (0x7F800000, 0x00000000)],
    "v_rsq_f32": [(0xFF800000, 0xFFC00000), (0x80000000, 0xFF800000), (0x00000000, 0x7F800000),
                  (0x40800000, 0x3F000000), (0x7F800000, 0x00000000)],
    "v_sqrt_f32": [(0xFF800000, 0xFFC00000), (0x80000000, 0x80000000), (0x00000000, 0x00000000),
                   (0x40800000, 0x40000000), (0x7F800000, 0x7F800000)],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_transcendental_documented_examples(name: str) -> None:
    ins = np.array([i for i, _ in EXAMPLES[name]], np.uint32)
    outs = np.array([o for _, o in EXAMPLES[name]], np.uint32)
    x = np.resize(ins, LANES)
    got = N.NUMERICS[name](OpContext("gfx950"), x)
    np.testing.assert_array_equal(got[: len(ins)], outs)
    # denormal inputs are flushed (the guides' notes): rcp(+denorm) = +inf, sqrt(-denorm) = -0
    den = np.full(LANES, 0x00000001, np.uint32)
    assert N.NUMERICS["v_rcp_f32"](OpContext("gfx942"), den)[0] == 0x7F800000
    assert N.NUMERICS["v_sqrt_f32"](OpContext("gfx942"), den | 0x80000000)[0] == 0x80000000
    # a NaN input comes out as the same NaN, quieted
    nan = np.full(LANES, 0x7F800001, np.uint32)
    assert N.NUMERICS[name](OpContext("gfx942"), nan)[0] == 0x7FC00001


# ----------------------------------------------------------------------------- division
def f32_divide(n: np.ndarray, d: np.ndarray) -> np.ndarray:
    """n / d by the sequence LLVM's AMDGPU backend emits for an f32 fdiv with denormals on
    (SITargetLowering::LowerFDIV32): div_scale x2, rcp, five fma/mul steps, div_fmas,
    div_fixup. v_fma_f32 / v_mul_f32 are IEEE float32 ops."""
    ctx = OpContext("gfx942")
    nn, dd = u32(n), u32(d)
    den, _ = N.v_div_scale_f32(ctx, dd, dd, nn)
    num, vcc = N.v_div_scale_f32(ctx, nn, dd, nn)
    rcp = N.v_rcp_f32(ctx, den)
    neg = den ^ np.uint32(0x80000000)
    one = u32(np.ones(LANES))
    fma0 = N.fma_f32(neg, rcp, one)
    fma1 = N.fma_f32(fma0, rcp, rcp)
    with np.errstate(all="ignore"):
        mul = u32(as_f32(num) * as_f32(fma1))
    fma2 = N.fma_f32(neg, mul, num)
    fma3 = N.fma_f32(fma2, fma1, mul)
    fma4 = N.fma_f32(neg, fma3, num)
    fmas = N.v_div_fmas_f32(OpContext("gfx942", mask=vcc), fma4, fma1, fma3)
    return as_f32(N.v_div_fixup_f32(ctx, fmas, dd, nn)).copy()


def check_division(n: np.ndarray, d: np.ndarray) -> None:
    got = f32_divide(n.astype(np.float32), d.astype(np.float32))
    with np.errstate(all="ignore"):
        want = (n.astype(np.float64) / d.astype(np.float64)).astype(np.float32)  # correctly rounded
    both_nan = np.isnan(got) & np.isnan(want)
    bad = ~both_nan & (as_u32(got) != as_u32(want))
    assert not bad.any(), [(float(a), float(b), float(g), float(w))
                           for a, b, g, w in zip(n[bad], d[bad], got[bad], want[bad], strict=True)][:5]  # fmt: skip


def test_division_sequence_random_is_correctly_rounded() -> None:
    rng = np.random.default_rng(5)
    for _ in range(60):
        n = (rng.standard_normal(LANES) * np.exp2(rng.uniform(-60, 60, LANES))).astype(np.float32)
        d = (rng.standard_normal(LANES) * np.exp2(rng.uniform(-60, 60, LANES))).astype(np.float32)
        check_division(n, d)
    for _ in range(30):  # the whole exponent range: huge quotients, denormal quotients
        n = (rng.choice([-1, 1], LANES) * np.exp2(rng.uniform(-149, 128, LANES))).astype(np.float32)
        d = (rng.choice([-1, 1], LANES) * np.exp2(rng.uniform(-149, 128, LANES))).astype(np.float32)
        check_division(n, d)


def test_division_sequence_edge_inputs() -> None:
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -3.0, 1e-45, -3e-39, 1e-38,
                         2.0**126, 3e38, -2.0**127, 2.0**-126, 7.0, 1.5e-30],
                        np.float32)  # fmt: skip
    n, d = np.meshgrid(specials, specials)
    n, d = n.ravel(), d.ravel()
    pad = (-len(n)) % LANES
    n = np.concatenate([n, np.ones(pad, np.float32)]).reshape(-1, LANES)
    d = np.concatenate([d, np.ones(pad, np.float32)]).reshape(-1, LANES)
    for a, b in zip(n, d, strict=True):
        check_division(a, b)


def test_div_fixup_documented_cases() -> None:
    ctx = OpContext("gfx942")
    q = u32(np.full(LANES, 5.0))

    def fix(d: float, n: float) -> int:
        return int(N.v_div_fixup_f32(ctx, q, u32(np.full(LANES, d)), u32(np.full(LANES, n)))[0])

    assert fix(0.0, 0.0) == 0xFFC00000
    assert fix(np.inf, -np.inf) == 0xFFC00000
    assert fix(-0.0, 1.0) == 0xFF800000
    assert fix(2.0, -np.inf) == 0xFF800000
    assert fix(np.inf, 1.0) == 0x00000000
    assert fix(-2.0, 0.0) == 0x80000000
    assert fix(-2.0, 3.0) == 0xC0A00000  # sign of the division, magnitude of the quotient
    assert fix(np.nan, 1.0) == 0x7FC00000


def test_div_scale_vcc_and_zero() -> None:
    ctx = OpContext("gfx942")
    one = u32(np.ones(LANES))
    out, vcc = N.v_div_scale_f32(ctx, one, u32(np.zeros(LANES)), one)
    assert np.isnan(as_f32(out)).all() and not vcc.any()
    big, small = u32(np.full(LANES, 2.0**100)), u32(np.full(LANES, 1.0))
    out, vcc = N.v_div_scale_f32(ctx, small, small, big)  # N/D near the max: scale D by 2**64
    assert vcc.all() and (as_f32(out) == 2.0**64).all()


# ----------------------------------------------------------------------------- MFMA
def bf16_bits(x: np.ndarray) -> np.ndarray:
    return (
        torch.from_numpy(x)
        .to(torch.bfloat16)
        .view(torch.int16)
        .numpy()
        .astype(np.uint16)
        .astype(np.uint32)
    )


def pack_ab(M: np.ndarray, k: int, operand: str) -> np.ndarray:
    """The calculator's layout: A[i][kk] / B[kk][j] is element kk % kpl of lane
    16 * (kk // kpl) + i (or + j), elements low half first, two per dword."""
    kpl = k // 4
    elems = np.zeros((LANES, kpl), np.uint32)
    bits = bf16_bits(M)
    for kk in range(k):
        for r in range(16):
            lane = 16 * (kk // kpl) + r
            elems[lane, kk % kpl] = bits[r, kk] if operand == "A" else bits[kk, r]
    return (elems[:, 0::2] | (elems[:, 1::2] << 16)).astype(np.uint32)


def pack_cd(M: np.ndarray) -> np.ndarray:
    out = np.zeros((LANES, 4), np.uint32)
    for i in range(16):
        for j in range(16):
            out[16 * (i // 4) + j, i % 4] = np.float32(M[i, j]).view(np.uint32)
    return out


def unpack_cd(R: np.ndarray) -> np.ndarray:
    out = np.zeros((16, 16), np.float32)
    for i in range(16):
        for j in range(16):
            out[i, j] = np.uint32(R[16 * (i // 4) + j, i % 4]).view(np.float32)
    return out


CASES = [("v_mfma_f32_16x16x16_bf16", "gfx942", 16), ("v_mfma_f32_16x16x16_bf16", "gfx950", 16),
         ("v_mfma_f32_16x16x32_bf16", "gfx950", 32)]  # fmt: skip


def random_problem(k: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    A = torch.from_numpy(rng.standard_normal((16, k)).astype(np.float32)).bfloat16().float().numpy()
    B = torch.from_numpy(rng.standard_normal((k, 16)).astype(np.float32)).bfloat16().float().numpy()
    C = rng.standard_normal((16, 16)).astype(np.float32)
    return A, B, C


@pytest.mark.parametrize(("name", "arch", "k"), CASES)
def test_mfma_matches_torch_matmul(name: str, arch: str, k: int) -> None:
    for seed in range(3):
        A, B, C = random_problem(k, seed)
        D = unpack_cd(N.mfma(name, arch, pack_ab(A, k, "A"), pack_ab(B, k, "B"), pack_cd(C)))
        want = (torch.from_numpy(A) @ torch.from_numpy(B) + torch.from_numpy(C)).numpy()
        scale = np.abs(A) @ np.abs(B) + np.abs(C)
        np.testing.assert_allclose(D, want, rtol=0, atol=float(scale.max()) * k * 2.0**-23)
        exact = (A.astype(np.float64) @ B.astype(np.float64) + C).astype(np.float32)
        np.testing.assert_array_equal(D, exact)  # the documented model: one rounding


def _products_summed(name: str, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """D of a gang's MFMAs computed as every product of every output, summed along k in float64
    plus C, rounded once (the executor's formulation before it became a batched matmul)."""
    k = N.MFMA_SHAPES[name].k
    waves, kpl = a.shape[0] // LANES, k // 4

    def elems(w: np.ndarray) -> np.ndarray:  # [wave, lane group, row, element] as float64
        lo = (w << 16).astype(np.uint32).view(np.float32)
        hi = (w & 0xFFFF0000).astype(np.uint32).view(np.float32)
        return np.stack([lo, hi], -1).reshape(waves, 4, 16, kpl).astype(np.float64)

    A = elems(a).transpose(0, 2, 1, 3).reshape(waves, 16, k)
    B = elems(b).transpose(0, 1, 3, 2).reshape(waves, k, 16)
    C = c.view(np.float32).astype(np.float64).reshape(waves, 4, 16, 4).transpose(0, 1, 3, 2)
    with np.errstate(all="ignore"):
        D = (A[:, :, :, None] * B[:, None, :, :]).sum(axis=2) + C.reshape(waves, 16, 16)
    D32 = D.astype(np.float32)  # one rounding, nearest even
    return D32.reshape(waves, 4, 4, 16).transpose(0, 1, 3, 2).reshape(-1, 4).view(np.uint32)


@pytest.mark.parametrize(("name", "arch", "k"), CASES)
@pytest.mark.parametrize("spread", [0, 20, 40])
def test_mfma_of_a_gang_equals_every_product_summed_bit_for_bit(name, arch, k, spread) -> None:
    """A gang's MFMAs as batched matmuls give the bits of summing each output's products in
    float64, on 300 waves of bf16 operands whose exponents spread over 2**-spread..2**spread,
    with infinities, NaNs and zeros among them (``numerics.mfma``)."""
    rng = np.random.default_rng(spread)
    lanes, dwords = 300 * LANES, N.MFMA_SHAPES[name].ab_dwords

    def operand() -> np.ndarray:
        x = rng.standard_normal((lanes, 2 * dwords)) * np.exp2(
            rng.integers(-spread, spread + 1, (lanes, 2 * dwords))
        )
        x = x.astype(np.float32)
        specials = rng.integers(0, lanes, 40)
        x[specials, 0] = rng.choice([np.inf, -np.inf, np.nan, 0.0, -0.0], 40)
        hi = x.view(np.uint32) & 0xFFFF0000
        return (hi[:, 1::2] | (hi[:, 0::2] >> 16)).astype(np.uint32)

    a, b = operand(), operand()
    c = rng.standard_normal((lanes, 4)).astype(np.float32).view(np.uint32)
    np.testing.assert_array_equal(N.mfma(name, arch, a, b, c), _products_summed(name, a, b, c))


@pytest.mark.parametrize(("name", "arch", "k"), CASES)
def test_mfma_transposed_layout_fails(name: str, arch: str, k: int) -> None:
    """Feeding A where B belongs (A laid out as if it were B^T's layout swapped) and reading D
    transposed must not pass: the layout is really checked."""
    A, B, C = random_problem(k, 7)
    want = A.astype(np.float64) @ B + C
    D = unpack_cd(N.mfma(name, arch, pack_ab(A, k, "A"), pack_ab(B, k, "B"), pack_cd(C)))
    assert not np.allclose(D.T, want, atol=1e-3)
    D2 = unpack_cd(
        N.mfma(name, arch, pack_ab(B.T.copy(), k, "A"), pack_ab(A.T.copy(), k, "B"), pack_cd(C))
    )
    assert not np.allclose(D2, want, atol=1e-3)  # this computes (A B)^T + C
    np.testing.assert_allclose(D2, (A.astype(np.float64) @ B).T + C, atol=1e-3)


def test_mfma_rejects_bad_input() -> None:
    z2, z4 = np.zeros((LANES, 2), np.uint32), np.zeros((LANES, 4), np.uint32)
    with pytest.raises(ValueError, match="gfx942"):
        N.mfma("v_mfma_f32_16x16x32_bf16", "gfx942", z4, z4, z4)
    with pytest.raises(ValueError, match="srcA"):
        N.mfma("v_mfma_f32_16x16x16_bf16", "gfx942", z4, z2, z4)
    with pytest.raises(ValueError, match="blgp"):
        N.mfma("v_mfma_f32_16x16x16_bf16", "gfx942", z2, z2, z4, blgp=1)
    with pytest.raises(ValueError, match="unknown MFMA"):
        N.mfma("v_mfma_f32_32x32x8_bf16", "gfx942", z2, z2, z4)


def test_table_covers_the_shipped_opcodes() -> None:
    """Every numerics opcode the shipped kernels use (listed from their decoded code objects,
    see the report) has an operation; the MFMAs are served by ``mfma``."""
    used = {"v_cvt_pk_f32_fp8", "v_cvt_pk_fp8_f32", "v_cvt_pk_bf16_f32",
            "v_cvt_scalef32_pk_bf16_fp8", "v_exp_f32", "v_rcp_f32", "v_rsq_f32", "v_sqrt_f32",
            "v_div_scale_f32", "v_div_fmas_f32", "v_div_fixup_f32"}  # fmt: skip
    assert used <= set(N.NUMERICS)
    assert {"v_mfma_f32_16x16x16_bf16", "v_mfma_f32_16x16x32_bf16"} <= set(N.MFMA_SHAPES)
