"""Per-lane numerics of the emulator: 8-bit float formats, bf16/f16 conversions and packing,
the transcendental unit, the f32 division helpers and the MFMA matrix ops.

Every operation follows the contract of ``mono_aot.emulator.lanes`` (raw ``uint32`` lanes in,
raw lanes out; EXEC, source modifiers, SDWA/op_sel source selects and the destination write are
the executor's). Semantics are those of the ISA guides: "AMD Instinct MI300 / CDNA3 Instruction
Set Architecture" (gfx942) and "AMD Instinct CDNA4 Instruction Set Architecture" (gfx950),
cited below by guide and section; ``mono_aot/emulator/isa.py`` names the same guides.

8-bit floats (CDNA3 guide section 7.2 table 30; CDNA4 guide section 7.3 table 30):

- gfx942 FP8 is E4M3 with bias 8, 0x80 the only NaN, no infinity, no negative zero (torch's
  ``float8_e4m3fnuz``); BF8 is E5M2 with bias 16, 0x80 NaN, no infinity (``float8_e5m2fnuz``);
- gfx950 FP8 is OCP E4M3 with bias 7, NaN 0x7F/0xFF, no infinity, a negative zero
  (``float8_e4m3fn``); BF8 is OCP E5M2, bias 15, infinities 0x7C/0xFC (``float8_e5m2``).

F32 -> FP8/BF8 (``v_cvt_pk_fp8_f32``, ``v_cvt_pk_bf8_f32``) rounds to nearest even, ignores
the ``clamp`` bit (table 31: "ignores: clamp, omod"), and on overflow follows MODE.FP16_OVFL
("CVT_*FP8_F32 and CVT*_BF8_F32 FP16_OVFL rule"): set, an infinite or too large input becomes
+-max; clear, it becomes NaN (FP8) or +-infinity (BF8; NaN where the format has no infinity).
NaN inputs give NaN. FP16_OVFL comes from the kernel descriptor (``compute_pgm_rsrc1`` bit 26,
``descriptor.KernelDescriptor.fp16_overflow``); the shipped kernels clear it, so ``NUMERICS``
is the table for FP16_OVFL = 0 and ``numerics_table(fp16_ovfl=True)`` the other one. The
guides do not say which NaN code keeps which sign: the OCP formats keep the input's sign
(0x7F/0xFF, as torch does), the fnuz formats have one NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from mono_aot.emulator.lanes import LANES, LaneOp, Lanes, Mask, OpContext, as_f32, as_u32
from mono_aot.spec.arch import arch_info

ARCHS = ("gfx942", "gfx950")


# ----------------------------------------------------------------------------- 8-bit floats
@dataclass(frozen=True)
class MiniFloat:
    """A sign / ``ebits`` exponent / ``mbits`` mantissa float of 8 bits.

    ``style``: ``fnuz`` (0x80 is the only NaN, no infinity, no -0), ``fn`` (OCP E4M3: the
    all-ones magnitude 0x7F is NaN, no infinity) or ``ieee`` (OCP E5M2: an all-ones exponent
    is infinity with a zero mantissa, NaN otherwise).
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    style: str

    @property
    def emin(self) -> int:
        return 1 - self.bias

    @property
    def max_code(self) -> int:
        """The code of the largest finite positive value."""
        if self.style == "fnuz":
            return 0x7F
        if self.style == "fn":
            return 0x7E
        return ((1 << self.ebits) - 2) << self.mbits | ((1 << self.mbits) - 1)

    @property
    def max(self) -> float:
        return float(_table(self)[self.max_code])

    def nan_code(self, negative: np.ndarray) -> np.ndarray:
        if self.style == "fnuz":
            return np.full(negative.shape, 0x80, np.uint8)
        return np.where(negative, 0xFF, 0x7F).astype(np.uint8)

    def overflow_code(self, negative: np.ndarray) -> np.ndarray:
        """What an overflow gives with FP16_OVFL clear: NaN, or infinity where there is one."""
        if self.style == "ieee":
            inf = (((1 << self.ebits) - 1) << self.mbits) & 0x7F
            return (np.where(negative, 0x80, 0) | inf).astype(np.uint8)
        return self.nan_code(negative)


E4M3FNUZ = MiniFloat("e4m3fnuz", 4, 3, 8, "fnuz")
E5M2FNUZ = MiniFloat("e5m2fnuz", 5, 2, 16, "fnuz")
E4M3FN = MiniFloat("e4m3fn", 4, 3, 7, "fn")
E5M2 = MiniFloat("e5m2", 5, 2, 15, "ieee")
_BY_NAME = {f.name: f for f in (E4M3FNUZ, E5M2FNUZ, E4M3FN, E5M2)}
_BF8 = {"gfx942": E5M2FNUZ, "gfx950": E5M2}


def _arch(arch: str) -> str:
    if arch not in ARCHS:
        raise ValueError(f"numerics: unknown arch {arch!r} (known: {', '.join(ARCHS)})")
    return arch


def fp8_format(arch: str) -> MiniFloat:
    """The FP8 (E4M3) format the arch's conversions read and write (``mono_aot.spec.arch``)."""
    fmt = _BY_NAME[arch_info(_arch(arch)).fp8_format]
    if fmt.max != arch_info(arch).fp8_max:
        raise AssertionError(f"{arch}: the arch table's fp8 max disagrees with {fmt.name}")
    return fmt


def bf8_format(arch: str) -> MiniFloat:
    """The BF8 (E5M2) format of the arch (CDNA3/CDNA4 guide table 30)."""
    return _BF8[_arch(arch)]


@cache
def _table(fmt: MiniFloat) -> np.ndarray:
    """float64 value of each of the 256 codes (NaN codes NaN)."""
    c = np.arange(256)
    e = (c >> fmt.mbits) & ((1 << fmt.ebits) - 1)
    m = c & ((1 << fmt.mbits) - 1)
    mag = np.where(
        e == 0,
        np.ldexp(m.astype(np.float64), fmt.emin - fmt.mbits),
        np.ldexp(1.0 + m / (1 << fmt.mbits), e - fmt.bias),
    )
    val = np.where(c >= 0x80, -mag, mag)
    if fmt.style == "fnuz":
        val[0x80] = np.nan
    elif fmt.style == "fn":
        val[(c & 0x7F) == 0x7F] = np.nan
    else:
        top = e == (1 << fmt.ebits) - 1
        val[top & (m == 0)] = np.copysign(np.inf, val[top & (m == 0)])
        val[top & (m != 0)] = np.nan
    return val


def _f32_of_table(fmt: MiniFloat) -> np.ndarray:
    """The float32 bits each code decodes to: a NaN code gives the quiet NaN of its sign."""
    t = _table(fmt).astype(np.float32).view(np.uint32).copy()
    nan = np.isnan(_table(fmt))
    neg = (np.arange(256) >= 0x80) & (fmt.style != "fnuz")
    t[nan] = np.where(neg[nan], 0xFFC00000, 0x7FC00000)
    return t


def minifloat_decode(codes: np.ndarray, fmt: MiniFloat) -> np.ndarray:
    """float32 values of ``uint8`` codes (exact: every code is a float32)."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"{fmt.name} codes must be uint8, got {codes.dtype}")
    return _f32_of_table(fmt)[codes].view(np.float32)


def minifloat_encode(x: np.ndarray, fmt: MiniFloat, *, saturate: bool) -> np.ndarray:
    """``uint8`` codes of float32 ``x``, round to nearest even; ``saturate`` is FP16_OVFL.

    The magnitude is rounded at the format's quantum for its binade (the subnormal quantum
    below the smallest normal): exact in float64, since a float32 divided by a power of two
    is exact and ``rint`` rounds half to even. A rounded magnitude above the max, or an
    infinity, is an overflow: +-max when saturating, else ``overflow_code``.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"{fmt.name} encode takes float32 (the instruction's input), not {x.dtype}")
    a = np.abs(x.astype(np.float64))
    neg = np.signbit(x)
    nan = np.isnan(x)
    finite = np.isfinite(a)
    safe = np.where(finite, a, 0.0)
    _, ex = np.frexp(safe)
    e = np.maximum(ex - 1, fmt.emin)
    quantum = np.ldexp(1.0, e - fmt.mbits)
    r = np.rint(safe / quantum) * quantum
    table = _table(fmt)[: fmt.max_code + 1]
    over = ~finite | (r > table[-1])
    mag = np.searchsorted(table, np.minimum(r, table[-1]))
    if not np.array_equal(table[mag], np.minimum(r, table[-1])):
        raise AssertionError(f"{fmt.name}: a rounded value is not a code (encoder bug)")
    if fmt.style == "fnuz":
        sign = neg & (mag != 0)  # no negative zero
    else:
        sign = neg
    code = (mag | (sign.astype(np.int64) << 7)).astype(np.uint8)
    if saturate:
        code = np.where(over, (fmt.max_code | (neg.astype(np.int64) << 7)).astype(np.uint8), code)
    else:
        code = np.where(over, fmt.overflow_code(neg), code)
    return np.where(nan, fmt.nan_code(neg), code).astype(np.uint8)


def fp8_decode(codes: np.ndarray, arch: str) -> np.ndarray:
    """float32 values of FP8 codes in the arch's format (e4m3fnuz on gfx942, e4m3fn on gfx950)."""
    return minifloat_decode(codes, fp8_format(arch))


def fp8_encode(x: np.ndarray, arch: str, *, saturate: bool) -> np.ndarray:
    """FP8 codes of float32 ``x`` as ``v_cvt_pk_fp8_f32`` writes them; ``saturate`` is the
    MODE.FP16_OVFL bit (clamp to +-max on overflow) -- the instruction's ``clamp`` bit is
    ignored (CDNA3 guide section 7.2 table 31 and the FP16_OVFL rule after it)."""
    return minifloat_encode(x, fp8_format(arch), saturate=saturate)


# ----------------------------------------------------------------------------- helpers
def _lo16(x: Lanes) -> np.ndarray:
    return (x & 0xFFFF).astype(np.uint32)


def _pair_to_f32(word: Lanes, fmt: MiniFloat) -> Lanes:
    """Bytes 0 and 1 of each lane -> (64, 2) float32 bits (low dword first)."""
    lo = (word & 0xFF).astype(np.uint8)
    hi = ((word >> 8) & 0xFF).astype(np.uint8)
    table = _f32_of_table(fmt)
    return np.stack([table[lo], table[hi]], axis=-1).astype(np.uint32)


def _place16(ctx: OpContext, half: np.ndarray) -> Lanes:
    """A 16-bit result written into half ``ctx.dst_word`` of the destination, the other half
    kept from ``ctx.old_dst`` (the guides' "D0[31:16] are preserved")."""
    if ctx.old_dst is None:
        raise ValueError("a 16-bit result needs ctx.old_dst (the destination's old bits)")
    if ctx.dst_word not in (0, 1):
        raise ValueError(f"ctx.dst_word must be 0 or 1, not {ctx.dst_word}")
    sh = 16 * ctx.dst_word
    keep = ctx.old_dst & np.uint32(0xFFFF0000 >> sh if sh else 0xFFFF0000)
    return (keep | (half.astype(np.uint32) << np.uint32(sh))).astype(np.uint32)


def f32_to_bf16(x: Lanes) -> np.ndarray:
    """float32 bits -> bf16 bits (uint32 holding 16 bits), round to nearest even; NaN stays a
    quiet NaN of the same sign and high payload. Denormals are kept (CDNA4 guide section 7.4:
    formats narrower than 32 bits do not flush)."""
    x = x.astype(np.uint32)
    nan = (x & 0x7FFFFFFF) > 0x7F800000
    rounded = (x.astype(np.uint64) + 0x7FFF + ((x >> 16) & 1)) >> 16
    return np.where(nan, (x >> 16) | 0x40, rounded).astype(np.uint32)


def _f32(x: np.ndarray) -> Lanes:
    """float64 values -> float32 bits, round to nearest even (numpy's cast)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return as_u32(np.asarray(x, dtype=np.float64).astype(np.float32))


# ----------------------------------------------------------------------------- conversions
def _cvt_pk_f32_8(kind: str) -> LaneOp:
    def op(ctx: OpContext, s0: Lanes) -> Lanes:
        fmt = fp8_format(ctx.arch) if kind == "fp8" else bf8_format(ctx.arch)
        return _pair_to_f32(_lo16(s0), fmt)

    op.__doc__ = (f"v_cvt_pk_f32_{kind}: the two {kind} codes in bits 15:0 of S0 -> 2 x f32. "
                  "The executor passes the SDWA/op_sel-selected word in bits 15:0 (CDNA3 "
                  f"guide 12.8 V_CVT_PK_F32_{kind.upper()}: tmp = S0[31:16] or S0[15:0]).")  # fmt: skip
    return op


def _cvt_f32_8(kind: str) -> LaneOp:
    def op(ctx: OpContext, s0: Lanes) -> Lanes:
        fmt = fp8_format(ctx.arch) if kind == "fp8" else bf8_format(ctx.arch)
        return _f32_of_table(fmt)[(s0 & 0xFF).astype(np.uint8)].astype(np.uint32)

    op.__doc__ = (f"v_cvt_f32_{kind}: the {kind} code in bits 7:0 of S0 (the executor applies "
                  "the SDWA byte select) -> f32.")  # fmt: skip
    return op


def _cvt_pk_8_f32(kind: str, fp16_ovfl: bool) -> LaneOp:
    def op(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
        fmt = fp8_format(ctx.arch) if kind == "fp8" else bf8_format(ctx.arch)
        lo = minifloat_encode(as_f32(s0), fmt, saturate=fp16_ovfl).astype(np.uint32)
        hi = minifloat_encode(as_f32(s1), fmt, saturate=fp16_ovfl).astype(np.uint32)
        return _place16(ctx, lo | (hi << 8))

    op.__doc__ = (f"v_cvt_pk_{kind}_f32: {{cvt(S1), cvt(S0)}} into the 16-bit half op_sel[3] "
                  "(ctx.dst_word) names, the other half preserved (CDNA3 guide 12.11, CDNA4 "
                  f"guide V_CVT_PK_{kind.upper()}_F32). FP16_OVFL={int(fp16_ovfl)}; clamp is "
                  "ignored.")  # fmt: skip
    return op


def v_cvt_pk_bf16_f32(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    """D[15:0] = bf16(S0), D[31:16] = bf16(S1), round to nearest even (CDNA4 guide,
    V_CVT_PK_BF16_F32, which forces ROUND_NEAREST_EVEN). gfx950 only."""
    if ctx.arch != "gfx950":
        raise ValueError(f"v_cvt_pk_bf16_f32 does not exist on {ctx.arch}")
    return (f32_to_bf16(s0) | (f32_to_bf16(s1) << 16)).astype(np.uint32)


def v_cvt_scalef32_pk_bf16_fp8(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    """Two FP8 codes (bits 15:0 of S0: the executor applies op_sel[0], "srcword = OPSEL[0] *
    16") -> two bf16 scaled by 2**(exponent(S1) - 127) (CDNA4 guide, V_CVT_SCALEF32_PK_BF16_FP8;
    section 7.3: "The scale is an E8M0 exponent with a bias of 127", "F4/F6/F8 allows denorms").

    The product is exact in float64 and rounded once to bf16 (nearest even); an E8M0 scale of
    255 (S1 infinite or NaN) is the E8M0 NaN and gives NaN (the OCP MX rule; the guide does not
    spell it out). gfx950 only."""
    if ctx.arch != "gfx950":
        raise ValueError(f"v_cvt_scalef32_pk_bf16_fp8 does not exist on {ctx.arch}")
    scale = ((s1 >> 23) & 0xFF).astype(np.int64)
    fmt = fp8_format(ctx.arch)
    out = np.zeros(s0.shape, np.uint32)
    for k in range(2):
        v = _table(fmt)[((s0 >> (8 * k)) & 0xFF).astype(np.int64)]
        with np.errstate(all="ignore"):
            v = np.where(scale == 255, np.nan, np.ldexp(v, scale - 127))
        out |= _bf16_of_f64(v) << np.uint32(16 * k)
    return out


def _bf16_of_f64(v: np.ndarray) -> np.ndarray:
    """bf16 bits of float64 values, one rounding (nearest even) at the bf16 quantum of each
    value's binade (2**-133 below the smallest normal); beyond the max, infinity."""
    a = np.abs(v)
    finite = np.isfinite(a)
    safe = np.where(finite, a, 0.0)
    _, ex = np.frexp(safe)
    q = np.ldexp(1.0, np.maximum(ex - 1, -126) - 7)
    r = np.rint(safe / q) * q
    with np.errstate(over="ignore"):
        bits = as_u32(np.where(finite, r, a).astype(np.float32)) >> 16
    bits = np.where(np.signbit(v), bits | 0x8000, bits)
    return np.where(np.isnan(v), np.where(np.signbit(v), 0xFFC0, 0x7FC0), bits).astype(np.uint32)


# ----------------------------------------------------------------------------- transcendentals
_QNAN_NEG = np.uint32(0xFFC00000)  # the guides' result of an invalid operation (e.g. log(-1))


def _flush_in(x: np.ndarray) -> np.ndarray:
    """Denormal inputs as signed zeros (the guide's note "denormals are flushed")."""
    return np.where(
        (x != 0) & (np.abs(x) < np.float32(2.0**-126)), np.copysign(np.float32(0), x), x
    )


def _flush_out(bits: Lanes) -> Lanes:
    """Denormal results as signed zeros."""
    den = ((bits & 0x7F800000) == 0) & ((bits & 0x7FFFFF) != 0)
    return np.where(den, bits & 0x80000000, bits).astype(np.uint32)


def _quiet(bits: Lanes) -> Lanes:
    return (bits | 0x00400000).astype(np.uint32)


def _unary(fn, ctx_name: str):  # type: ignore[no-untyped-def]
    """A transcendental as the correctly rounded float32 of the float64 function (see
    ``TRANSCENDENTAL_MODEL``), denormal inputs and results flushed, NaN inputs quieted."""

    def op(ctx: OpContext, s0: Lanes) -> Lanes:
        x = _flush_in(as_f32(s0))
        with np.errstate(all="ignore"):
            r = _flush_out(_f32(fn(x.astype(np.float64))))
        nan_in = np.isnan(as_f32(s0))
        r = np.where(np.isnan(as_f32(r)) & ~nan_in, _QNAN_NEG, r)
        return np.where(nan_in, _quiet(s0), r).astype(np.uint32)

    op.__name__ = ctx_name
    return op


TRANSCENDENTAL_MODEL = (
    "v_exp_f32, v_log_f32, v_rcp_f32, v_rsq_f32 and v_sqrt_f32 return the float32 nearest to "
    "the float64 evaluation of the exact function (numpy's exp2/log2/1/x/1/sqrt/sqrt; for "
    "rcp and sqrt that is the correctly rounded result). The guides document these as '1ULP "
    "accuracy, denormals are flushed' (CDNA3 guide 12.8, V_EXP_F32 ... V_SQRT_F32), so real "
    "hardware may differ from the emulator by one unit in the last place; the documented "
    "functional examples (special values) are reproduced exactly."
)

v_exp_f32 = _unary(np.exp2, "v_exp_f32")
v_log_f32 = _unary(np.log2, "v_log_f32")
v_rcp_f32 = _unary(lambda x: 1.0 / x, "v_rcp_f32")
v_rsq_f32 = _unary(lambda x: 1.0 / np.sqrt(x), "v_rsq_f32")
v_sqrt_f32 = _unary(np.sqrt, "v_sqrt_f32")


# ----------------------------------------------------------------------------- division
def _exponent(bits: Lanes) -> np.ndarray:
    """The guides' exponent(x): the biased exponent field."""
    return ((bits >> 23) & 0xFF).astype(np.int64)


def _is_denorm(x: np.ndarray) -> np.ndarray:
    return (x != 0) & np.isfinite(x) & (np.abs(x) < 2.0**-126)


def _fma_scaled(a: Lanes, b: Lanes, c: Lanes, k: np.ndarray | int) -> Lanes:
    """float32 bits of 2**k * (a*b + c), rounded once (nearest even), denormals kept: the sum
    rounded to odd in float64 (``valu.fma_odd64``), scaled exactly, then rounded to float32."""
    from mono_aot.emulator.valu import fma_odd64

    with np.errstate(all="ignore"):
        return _f32(np.ldexp(fma_odd64(as_f32(a), as_f32(b), as_f32(c)), k))


def fma_f32(a: Lanes, b: Lanes, c: Lanes) -> Lanes:
    """float32 bits of a*b + c rounded once (``v_fma_f32`` with denormals on)."""
    return _fma_scaled(a, b, c, 0)


OVERFLOW_F32 = np.float32(np.inf)
UNDERFLOW_F32 = np.float32(0.0)


def v_div_scale_f32(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> tuple[Lanes, Mask]:
    """The CDNA3 guide's V_DIV_SCALE_F32 pseudo-code (section 12.11), S0 the value to scale,
    S1 the denominator, S2 the numerator; D0 = S0 where no branch assigns it.

    Two readings the pseudo-code needs to be meaningful for f32: ``1.0 / 64'F(S1) ==
    DENORM.f64`` is read as "the reciprocal of S1 is below the f32 normal range" (the
    reciprocal of a float32 is never a float64 denormal, so the literal reading would make
    those branches dead and leave x / y with |y| > 2**126 to a flushed v_rcp_f32); and in the
    branch where both the reciprocal and the quotient are denormal the denominator is scaled
    by 2**-64, not 2**+64 (|S1| > 2**126 scaled up would overflow to infinity; scaled down,
    the scaled quotient is below 2 and v_div_fmas_f32 applies 2**-64, the consistent pair).
    """
    a = as_f32(s0).astype(np.float64)
    d = as_f32(s1).astype(np.float64)
    n = as_f32(s2).astype(np.float64)
    e_d, e_n = _exponent(s1), _exponent(s2)
    rcp_den = np.isfinite(d) & (np.abs(d) > 2.0**126)  # 1 / S1 below the f32 normal range
    with np.errstate(all="ignore"):
        quo_den = _is_denorm((n / d).astype(np.float32).astype(np.float64))
    out = a.copy()
    vcc = np.zeros(a.shape, bool)
    done = np.zeros(a.shape, bool)

    def branch(cond: np.ndarray) -> np.ndarray:
        take = cond & ~done
        done[:] |= take
        return take

    t = branch((n == 0) | (d == 0))
    out = np.where(t, np.nan, out)
    t = branch(e_n - e_d >= 96)
    vcc |= t
    out = np.where(t & (a == d), np.ldexp(a, 64), out)
    t = branch(_is_denorm(d))
    out = np.where(t, np.ldexp(a, 64), out)
    t = branch(rcp_den & quo_den)
    vcc |= t
    out = np.where(t & (a == d), np.ldexp(a, -64), out)
    t = branch(rcp_den)
    out = np.where(t, np.ldexp(a, -64), out)
    t = branch(quo_den)
    vcc |= t
    out = np.where(t & (a == n), np.ldexp(a, 64), out)
    t = branch(e_n <= 23)
    out = np.where(t, np.ldexp(a, 64), out)
    res = _f32(out)
    # a NaN S0 passes through bit for bit where no branch rewrote it
    res = np.where(~done & np.isnan(as_f32(s0)), s0, res).astype(np.uint32)
    return res, vcc


def v_div_fmas_f32(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Lanes:
    """fma(S0, S1, S2), scaled where VCC (``ctx.mask``) is set (CDNA3 guide V_DIV_FMAS_F32).

    The guide prints the factor as 2**32; the factor that undoes v_div_scale_f32's 2**64
    scalings is 2**+64 when the quotient estimate S2 is at least 2 (exponent(S2) > 127: the
    denominator was scaled up) and 2**-64 otherwise (the numerator was scaled up, or both
    were scaled down by the denominator): the emulator applies that, the only factor under
    which the division sequence's results come out right (tests/emulator/test_numerics.py).
    The scaling is exact and rounds once with the fma (the product of two float64 roundings
    could double-round only for subnormal results, where it is done from the exact sum).
    """
    if ctx.mask is None:
        raise ValueError("v_div_fmas_f32 needs ctx.mask (VCC)")
    k = np.where(ctx.mask, np.where(_exponent(s2) > 127, 64, -64), 0)
    return _fma_scaled(s0, s1, s2, k)


def v_div_fixup_f32(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Lanes:
    """The CDNA3 guide's V_DIV_FIXUP_F32 pseudo-code (section 12.11): S0 the quotient, S1 the
    denominator, S2 the numerator; NaNs are quieted, 0/0 and inf/inf give 0xFFC00000,
    UNDERFLOW_F32 is +-0 and OVERFLOW_F32 +-infinity (the values rounding gives there).

    The guide's last special case reads ``exponent(S1.f32) == 255``, which cannot hold there
    (an infinite or NaN S1 was handled above); the emulator reads it as the quotient S0 being
    infinite or NaN, which is what happens when the scaled Newton-Raphson steps overflow for a
    quotient beyond the f32 range: the result is then +-infinity, the correctly rounded
    quotient (tests/emulator/test_numerics.py, division edge cases)."""
    q = as_f32(s0)
    d = as_f32(s1).astype(np.float64)
    n = as_f32(s2).astype(np.float64)
    sign = ((s1 ^ s2) >> 31).astype(bool)
    mag = np.abs(q).astype(np.float32)
    conds = [
        (np.isnan(n), _quiet(s2)),
        (np.isnan(d), _quiet(s1)),
        ((d == 0) & (n == 0), np.full(s0.shape, _QNAN_NEG, np.uint32)),
        (np.isinf(d) & np.isinf(n), np.full(s0.shape, _QNAN_NEG, np.uint32)),
        ((d == 0) | np.isinf(n), _signed(np.float32(np.inf), sign)),
        (np.isinf(d) | (n == 0), _signed(np.float32(0.0), sign)),
        (_exponent(s2) - _exponent(s1) < -150, _signed(UNDERFLOW_F32, sign)),
        (_exponent(s0) == 255, _signed(OVERFLOW_F32, sign)),
    ]
    out = np.where(sign, as_u32(mag) | np.uint32(0x80000000), as_u32(mag)).astype(np.uint32)
    for cond, val in reversed(conds):
        out = np.where(cond, val, out)
    return out.astype(np.uint32)


def _signed(v: np.float32, sign: np.ndarray) -> Lanes:
    b = np.uint32(np.float32(v).view(np.uint32))
    return np.where(sign, b | np.uint32(0x80000000), b).astype(np.uint32)


# ----------------------------------------------------------------------------- MFMA
@dataclass(frozen=True)
class MfmaShape:
    """One dense MFMA: D (m x n, f32) = A (m x k) B (k x n) + C, one block.

    Register layouts (AMD's matrix instruction calculator for CDNA3,
    ``--architecture cdna3 --instruction v_mfma_f32_16x16x16_bf16 --detail-instruction``):
    with ``kpl = k // 4`` elements a lane, A[i][kk] is element ``kk % kpl`` (dword
    ``e // 2``, low half first) of lane ``16 * (kk // kpl) + i``; B[kk][j] the same element of
    lane ``16 * (kk // kpl) + j``; C/D[i][j] is dword ``i % 4`` of lane ``16 * (i // 4) + j``.
    The gfx950 32-deep form is the same equations with 8 elements a lane: the calculator does
    not cover CDNA4, but AMD's composable_kernel describes this instruction so (ck_tile's
    ``WarpGemmAttributeMfmaImplBf16Bf16F32M16N16K32``: 16 M/N lanes, 4 K lane groups of 8
    elements, C as 4 M lane groups of 4 dwords; the same in its ``xdlops_gemm.hpp``). Which K
    index an element carries is not observable when A and B agree (the products are summed
    exactly); the M, N and C/D mappings are. The shipped GEMM only needs A and B to agree on K
    (``mono_aot/kernels/mfma.py``); attention also reads D.
    """

    name: str
    m: int
    n: int
    k: int
    archs: tuple[str, ...]

    @property
    def kpl(self) -> int:
        return self.k // 4

    @property
    def ab_dwords(self) -> int:
        return self.kpl // 2

    @property
    def cd_dwords(self) -> int:
        return self.m * self.n // LANES


MFMA_SHAPES: dict[str, MfmaShape] = {
    s.name: s
    for s in (
        MfmaShape("v_mfma_f32_16x16x16_bf16", 16, 16, 16, ("gfx942", "gfx950")),
        MfmaShape("v_mfma_f32_16x16x32_bf16", 16, 16, 32, ("gfx950",)),
    )
}

MFMA_MODEL = (
    "bf16 operands are exact in float32 and their products exact in float64; the emulator "
    "sums C and all k products of an output in float64 (exact unless the terms span more than "
    "about 2**50 in magnitude) and rounds once to float32 (nearest even). The hardware keeps "
    "products exact too but adds them in its own order with its own intermediate roundings, "
    "which the guides do not specify; results can differ from it by rounding only (a few ulps "
    "of the largest term). Denormal inputs, C and D are not flushed (CDNA3 guide 7.3)."
)


def _bf16_elems(words: np.ndarray) -> np.ndarray:
    """(64, dwords) uint32 of bf16 pairs -> (64, 2 * dwords) float64, low half first."""
    lo = (words << 16).astype(np.uint32).view(np.float32)
    hi = (words & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.stack([lo, hi], axis=-1).reshape(words.shape[0], -1).astype(np.float64)


def _operand(name: str, x: np.ndarray, dwords: int, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.uint32 or x.ndim != 2 or x.shape[1] != dwords or x.shape[0] % LANES:
        raise ValueError(f"{name}: {what} must be uint32 of shape ({LANES}, {dwords}), "
                         f"got {x.dtype} {x.shape}")  # fmt: skip
    return x


def mfma(
    name: str,
    arch: str,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    *,
    cbsz: int = 0,
    abid: int = 0,
    blgp: int = 0,
) -> np.ndarray:
    """D = A B + C of MFMA ``name`` on the per-lane register tuples ``a``, ``b``, ``c``
    ((64, dwords) uint32 as srcA, srcB, srcC name them); returns D as (64, c_dwords) uint32.
    A gang of waves (``gang.py``) passes ``64 * waves`` rows: one MFMA per wave, the same sums.
    Layouts: ``MfmaShape``; rounding: ``MFMA_MODEL``. CBSZ/ABID (block broadcast) and BLGP
    (lane-group swizzle) are not supported by these single-block bf16 shapes (calculator:
    "CBSZ and ABID bits supported: False", "BLGP bits supported: False"), so a nonzero value
    is an error naming the field."""
    shape = MFMA_SHAPES.get(name)
    if shape is None:
        raise ValueError(f"mfma: unknown MFMA {name!r} (known: {', '.join(MFMA_SHAPES)})")
    if _arch(arch) not in shape.archs:
        raise ValueError(f"mfma: {name} does not exist on {arch}")
    for field, v in (("cbsz", cbsz), ("abid", abid), ("blgp", blgp)):
        if v:
            raise ValueError(f"mfma: {name} does not support {field} (got {v})")
    a = _operand(name, a, shape.ab_dwords, "srcA")
    b = _operand(name, b, shape.ab_dwords, "srcB")
    c = _operand(name, c, shape.cd_dwords, "srcC")
    if not a.shape[0] == b.shape[0] == c.shape[0]:
        raise ValueError(f"{name}: srcA, srcB and srcC span {a.shape[0]}, {b.shape[0]} and "
                         f"{c.shape[0]} lanes")  # fmt: skip
    kpl, groups, waves = shape.kpl, LANES // 16, a.shape[0] // LANES
    ea = _bf16_elems(a).reshape(waves, groups, 16, kpl)  # [wave, lane group, i, element]
    eb = _bf16_elems(b).reshape(waves, groups, 16, kpl)  # [wave, lane group, j, element]
    A = ea.transpose(0, 2, 1, 3).reshape(waves, 16, shape.k)  # A[i][g * kpl + e]
    B = eb.transpose(0, 1, 3, 2).reshape(waves, shape.k, 16)  # B[g * kpl + e][j]
    C = c.view(np.float32).astype(np.float64).reshape(waves, groups, 16, 4)  # [i // 4, j, i % 4]
    C = C.transpose(0, 1, 3, 2).reshape(waves, 16, 16)
    with np.errstate(all="ignore"):
        # one batched product a wave: the sums are exact in float64 (MFMA_MODEL), so their order
        # inside matmul does not show in the bits (tests/emulator/test_numerics.py)
        D = np.matmul(A, B) + C
    out = _f32(D.reshape(waves, groups, 4, 16).transpose(0, 1, 3, 2).reshape(-1, 4))
    return out.astype(np.uint32)


# ----------------------------------------------------------------------------- tables
CLAMP_IGNORED = frozenset(
    {"v_cvt_pk_fp8_f32", "v_cvt_pk_bf8_f32", "v_cvt_pk_f32_fp8", "v_cvt_pk_f32_bf8",
     "v_cvt_f32_fp8", "v_cvt_f32_bf8"}
)  # fmt: skip
"""Opcodes whose ``clamp`` bit the executor must not apply (CDNA3/CDNA4 guide table 31)."""


def numerics_table(fp16_ovfl: bool = False) -> dict[str, LaneOp]:
    """The operation table for a kernel whose MODE.FP16_OVFL is ``fp16_ovfl`` (the kernel
    descriptor's ``fp16_overflow``); it only changes the F32 -> FP8/BF8 overflow rule."""
    return {
        "v_cvt_pk_f32_fp8": _cvt_pk_f32_8("fp8"),
        "v_cvt_pk_f32_bf8": _cvt_pk_f32_8("bf8"),
        "v_cvt_f32_fp8": _cvt_f32_8("fp8"),
        "v_cvt_f32_bf8": _cvt_f32_8("bf8"),
        "v_cvt_pk_fp8_f32": _cvt_pk_8_f32("fp8", fp16_ovfl),
        "v_cvt_pk_bf8_f32": _cvt_pk_8_f32("bf8", fp16_ovfl),
        "v_cvt_pk_bf16_f32": v_cvt_pk_bf16_f32,
        "v_cvt_scalef32_pk_bf16_fp8": v_cvt_scalef32_pk_bf16_fp8,
        "v_exp_f32": v_exp_f32,
        "v_log_f32": v_log_f32,
        "v_rcp_f32": v_rcp_f32,
        "v_rsq_f32": v_rsq_f32,
        "v_sqrt_f32": v_sqrt_f32,
        "v_div_scale_f32": v_div_scale_f32,
        "v_div_fmas_f32": v_div_fmas_f32,
        "v_div_fixup_f32": v_div_fixup_f32,
    }


NUMERICS: dict[str, LaneOp] = numerics_table(fp16_ovfl=False)
"""The table for FP16_OVFL = 0, what the shipped kernels' descriptors set."""

__all__ = [
    "CLAMP_IGNORED", "MFMA_MODEL", "MFMA_SHAPES", "NUMERICS", "TRANSCENDENTAL_MODEL",
    "MiniFloat", "MfmaShape", "bf8_format", "f32_to_bf16", "fma_f32", "fp8_decode",
    "fp8_encode", "fp8_format", "mfma", "minifloat_decode", "minifloat_encode",
    "numerics_table",
]  # fmt: skip
