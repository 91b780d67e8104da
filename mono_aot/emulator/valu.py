"""Per-lane semantics of the vector ALU opcodes the shipped kernels use: integer, bitwise, shift,
f32 arithmetic, compares and the packed-f32 (VOP3P) operations.

``VALU`` maps an opcode's base name (``Instruction.base``) to a ``LaneOp`` following the contract
in ``mono_aot/emulator/lanes.py``: sources are raw ``uint32`` lanes (``(64,)``, or ``(64, 2)`` for
64-bit operands) with SDWA/op_sel selects, ``neg``/``abs`` and constants already applied by the
executor; an operation returns lanes, or ``(lanes | None, mask)`` when it also produces a per-lane
bit (carry-out, compares). Not here: fp8/bf16/f16 conversions and packing, transcendentals and
the division helpers, MFMA (``mono_aot.emulator.numerics``), and the lane-crossing opcodes
(``v_readfirstlane_b32``, ``v_mbcnt_*``, ``v_permlane*_swap``, DS swizzle/permute: the executor).

Semantics follow the pseudocode of the "AMD Instinct MI300 (CDNA3) ISA" and "AMD Instinct CDNA4
ISA" guides, chapter "Instructions" (sections "VOP2", "VOP1", "VOPC", "VOP3A/B", "VOP3P"); the
two archs agree on every opcode here. Conventions the executor relies on:

- **Inputs of the extra bit** (``ctx.mask``): the carry-in of ``v_addc_co_u32``,
  ``v_subb_co_u32``, ``v_subbrev_co_u32`` and the select of ``v_cndmask_b32`` (VCC or the SGPR
  pair of the VOP3 form). ``v_fmac_f32`` reads its accumulator from ``ctx.old_dst`` (the VOP2 and
  VOP3 forms have no third source field; the destination is the addend).
- **16-bit results** (``v_add_u16``, ``v_ashrrev_i16``, ...): the result is the low 16 bits and
  bits 31:16 are written as zero. These gfx9-family opcodes have no op_sel destination select
  (the decoder rejects op_sel on them), so ``ctx.dst_word`` must be 0; LLVM's
  ``GCNSubtarget::zeroesHigh16BitsOfDest`` lists them as zeroing the high half up to GFX9, as the
  guides' ``D0 = { 16'0, tmp }`` form of the 16-bit VOP3 opcodes says. SDWA destination selects
  are the executor's, applied to this 32-bit value.
- **clamp**: for the opcodes in ``SATURATING`` the guides define clamp as integer saturation
  ("Supports saturation (unsigned 32/16-bit integer domain)"), which only the operation can do: it
  reads ``ctx.clamp``. For float opcodes clamp (to [0, 1]) and omod are the executor's, after the
  operation. Other opcodes ignore ``ctx.clamp``.
- **Float mode**: IEEE mode on, f32 denormals preserved, round to nearest even: what both archs'
  shipped kernel descriptors set (``KernelDescriptor.ieee_mode`` = 1, ``float_denorm_mode_32`` =
  3, ``float_round_mode_32`` = 0, checked by ``tests/emulator/test_valu.py``). numpy's float32
  arithmetic is IEEE-754 binary32 with round to nearest even and gradual underflow, so it is the
  hardware's arithmetic in that mode. NaN results are quiet NaNs; which NaN payload an add or a
  multiply propagates is not modelled (the guides leave it unspecified); ``v_max_f32`` and
  ``v_min_f32`` follow the guides' NaN rules exactly.
- **Packed f32** (``v_pk_fma_f32``, ``v_pk_mul_f32``, ``v_pk_add_f32``, ``v_pk_mov_b32``):
  every source arrives as ``(64, 2)``: column 0 is the dword of the 64-bit register pair that
  ``op_sel[i]`` selects for the low result (0: bits 31:0, 1: bits 63:32), negated when
  ``neg_lo[i]`` is set; column 1 is the dword ``op_sel_hi[i]`` selects for the high result,
  negated when ``neg_hi[i]`` is set. The result's column 0 is bits 31:0 of the destination pair.
  ``v_pk_mov_b32`` writes ``src0[:, 0]`` and ``src1[:, 0]`` (the guides: "D[31:0] = S0 dword
  selected by OPSEL[0], D[63:32] = S1 dword selected by OPSEL[1]"; op_sel_hi is not used).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mono_aot.emulator.lanes import LaneOp, Lanes, Mask, OpContext, Result, as_f32, as_u32

_U32 = np.uint64(0xFFFFFFFF)


# ------------------------------------------------------------------------------ helpers
def _u(x: Lanes) -> np.ndarray:
    """uint32 lanes widened to uint64 (no wrap-around in sums of a few terms)."""
    return x.astype(np.uint64)


def _i(x: Lanes) -> np.ndarray:
    """uint32 lanes as signed values, widened to int64."""
    return x.view(np.int32).astype(np.int64)


def _lo32(x: np.ndarray) -> Lanes:
    """The low 32 bits of integer lanes (any width, two's complement) as uint32."""
    return (x.astype(np.int64).view(np.uint64) & _U32).astype(np.uint32)


def _u64(x: Lanes) -> np.ndarray:
    """A ``(64, 2)`` register pair (low dword first) as uint64 lanes."""
    if x.ndim != 2 or x.shape[1] != 2:
        raise ValueError(f"a 64-bit source must have shape (64, 2), not {x.shape}")
    # a C-ordered copy of the pair read as one little-endian uint64 per lane
    return x.astype(np.uint32, order="C").view(np.uint64).reshape(-1)


def _pair(v: np.ndarray) -> Lanes:
    """uint64 (or int64) lanes as a ``(64, 2)`` uint32 register pair, low dword first."""
    v = v.astype(np.int64).view(np.uint64) if v.dtype != np.uint64 else v
    # a C-ordered copy whose little-endian dwords are (low, high) per lane
    return v.astype(np.uint64, order="C").view(np.uint32).reshape(-1, 2)


def _need_mask(ctx: OpContext, op: str) -> Mask:
    if ctx.mask is None:
        raise ValueError(f"{op}: needs its per-lane input bit (carry-in/select) in ctx.mask")
    return ctx.mask.astype(bool)


def _sat_u(v: np.ndarray, bits: int, ctx: OpContext) -> np.ndarray:
    """Unsigned ``bits``-bit saturation when clamp is set (the guides' "supports saturation")."""
    if ctx.clamp:
        return np.clip(v, 0, (1 << bits) - 1)
    return v


def _f32(x: Lanes) -> np.ndarray:
    if type(x) is np.ndarray and x.dtype == np.uint32:
        return x.view(np.float32)  # same item size: a view whatever the strides
    return as_f32(np.ascontiguousarray(x, dtype=np.uint32))


def _bits_f32(x: np.ndarray) -> Lanes:
    return as_u32(x.astype(np.float32))


def _fop(fn: Callable[..., np.ndarray]) -> Callable[..., Lanes]:
    """An f32 operation of float32 arrays (no FP warnings: NaN/inf results are normal here)."""

    def op(ctx: OpContext, *srcs: Lanes) -> Lanes:
        with np.errstate(all="ignore"):
            return _bits_f32(fn(*(_f32(s) for s in srcs)))

    op.__doc__ = fn.__doc__
    return op


# ------------------------------------------------------------------------------ fma
def fma_odd64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a * b + c`` of float32 arrays as float64 rounded to odd: rounding it to float32 (after
    any exact scaling by a power of two, as ``v_div_fmas_f32`` does) rounds once.

    Why this is exact without a hardware fma: the product of two binary32 values has at most
    48 significant bits and lies within 2^-298 .. 2^256, so ``p = a * b`` in binary64 is exact
    (53-bit significand, normal down to 2^-1022). The sum ``p + c`` cannot overflow binary64, and
    TwoSum (Knuth) gives ``s = fl64(p + c)`` and the exact error ``e`` with ``s + e = p + c``.
    Rounding ``s`` straight to binary32 would round twice, which is wrong when ``s`` lands exactly
    on a binary32 midpoint that ``p + c`` is not on. Instead ``s`` is turned into the
    round-to-odd value of ``p + c`` in binary64: when ``e != 0`` and ``s``'s last significand
    bit is even, ``s`` is replaced by its binary64 neighbour towards ``e`` (which is odd and still
    on the same side of every binary32 midpoint, as those are binary64 numbers). Rounding to odd
    in a format with at least two more bits (53 >= 24 + 2) followed by round to nearest even
    gives the correctly rounded result (Boldo and Melquiond, "Emulation of FMA and correctly
    rounded sums: proved algorithms using rounding to odd", IEEE Trans. Computers 57(4), 2008);
    binary32's subnormals sit inside binary64's normal range, so they are covered too.
    Infinities and NaNs take the plain path (``s`` is then inf or NaN and is not adjusted).
    """
    with np.errstate(all="ignore"):
        a64, b64, c64 = (np.asarray(x, dtype=np.float32).astype(np.float64) for x in (a, b, c))
        p = a64 * b64
        s = p + c64
        bb = s - p
        e = (p - (s - bb)) + (c64 - bb)
        even = (s.view(np.int64) & 1) == 0
        nudge = np.isfinite(s) & (e != 0) & even
        toward = np.where(e > 0, np.inf, -np.inf)
        return np.where(nudge, np.nextafter(s, toward), s)


# binary64 bits: the 29 fraction bits below binary32's precision, shifted to the top, are
# 1000...0 on a binary32 midpoint (normal range and the overflow bound); 2**-126 (below it,
# binary32 subnormals) is 897 << 52, shifted left once to drop the sign
_SH35 = np.uint64(35)
_TOP = np.uint64(1 << 63)
_F32_NORMAL2 = np.uint64(897 << 53)
_ONE = np.uint64(1)
_TWO = np.uint64(2)


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a * b + c`` of float32 arrays rounded once (round to nearest even), as float32.

    Fast path: ``s = fl64(a * b + c)`` (the product is exact, see ``fma_odd64``) rounds to the
    same binary32 value as the exact sum unless ``s`` is itself a binary32 midpoint: every
    midpoint is a binary64 number, so one strictly between the exact sum and ``s`` would be
    nearer the sum than ``s`` is. Lanes where ``s`` sits on a midpoint (its 29 low fraction bits
    ``1000...0``; this includes the overflow bound) or in binary32's subnormal range (coarser
    midpoints) are recomputed by ``fma_odd64``'s round-to-odd path, which is exact everywhere."""
    with np.errstate(all="ignore"):
        return _fma_f32(a, b, c)


def _fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``fma_f32`` for callers that already ignore FP warnings (the operation wrappers)."""
    a = np.asarray(a, dtype=np.float32)
    s = a.astype(np.float64)
    s *= np.asarray(b, dtype=np.float32)
    s += np.asarray(c, dtype=np.float32)
    u = s.view(np.uint64)
    risky = (u << _SH35) == _TOP  # the 29 low fraction bits are 1000...0
    risky |= ((u << _ONE) - _TWO) < _F32_NORMAL2  # 0 < |s| < 2**-126 (sign shifted out; 0 wraps)
    out = s.astype(np.float32)
    if np.count_nonzero(risky):
        k = np.flatnonzero(risky.ravel())
        a_, b_, c_ = (np.broadcast_to(np.asarray(x, np.float32), s.shape).ravel()[k]
                      for x in (a, b, c))  # fmt: skip
        out.ravel()[k] = fma_odd64(a_, b_, c_).astype(np.float32)
    return out


# ------------------------------------------------------------------------------ f32 min/max
_QUIET = np.uint32(0x00400000)


def _is_nan(bits: Lanes) -> np.ndarray:
    return (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)


def _is_snan(bits: Lanes) -> np.ndarray:
    return _is_nan(bits) & ((bits & _QUIET) == 0)


def max_f32(s0: Lanes, s1: Lanes, ieee: bool = True) -> Lanes:
    """V_MAX_F32 (VOP2 opcode 11) on raw bits, the guides' pseudocode in order: in IEEE mode a
    signaling NaN operand (S0 first) is returned quieted; otherwise a NaN operand yields the other
    operand; max(+0, -0) and max(-0, +0) are +0; then ``S0 >= S1 ? S0 : S1`` (IEEE mode) or
    ``S0 > S1 ? S0 : S1``."""
    a, b = _f32(s0), _f32(s1)
    with np.errstate(all="ignore"):
        pick_a = (a >= b) if ieee else (a > b)
    out = np.where(pick_a, s0, s1)
    pz, nz = np.uint32(0), np.uint32(0x80000000)
    out = np.where((s0 == nz) & (s1 == pz), s1, out)
    out = np.where((s0 == pz) & (s1 == nz), s0, out)
    out = np.where(_is_nan(s1), s0, out)
    out = np.where(_is_nan(s0), s1, out)
    if ieee:
        out = np.where(_is_snan(s1), s1 | _QUIET, out)
        out = np.where(_is_snan(s0), s0 | _QUIET, out)
    return out.astype(np.uint32)


def min_f32(s0: Lanes, s1: Lanes, ieee: bool = True) -> Lanes:
    """V_MIN_F32 (VOP2 opcode 10): as ``max_f32`` with min(+0, -0) = min(-0, +0) = -0 and
    ``S0 < S1 ? S0 : S1`` in both modes (the guides: "there's no IEEE case here like there is for
    V_MAX_F32")."""
    a, b = _f32(s0), _f32(s1)
    with np.errstate(all="ignore"):
        out = np.where(a < b, s0, s1)
    pz, nz = np.uint32(0), np.uint32(0x80000000)
    out = np.where((s0 == nz) & (s1 == pz), s0, out)
    out = np.where((s0 == pz) & (s1 == nz), s1, out)
    out = np.where(_is_nan(s1), s0, out)
    out = np.where(_is_nan(s0), s1, out)
    if ieee:
        out = np.where(_is_snan(s1), s1 | _QUIET, out)
        out = np.where(_is_snan(s0), s0 | _QUIET, out)
    return out.astype(np.uint32)


def _med3_f32(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Lanes:
    """V_MED3_F32 (VOP3 opcode 470): any NaN -> min3; else the max of the two inputs that are
    not the max3 (compared as floats, S0 first)."""
    mx = max_f32(max_f32(s0, s1), s2)
    with np.errstate(all="ignore"):
        is0 = _f32(mx) == _f32(s0)
        is1 = _f32(mx) == _f32(s1)
    out = np.where(is0, max_f32(s1, s2), np.where(is1, max_f32(s0, s2), max_f32(s0, s1)))
    anynan = _is_nan(s0) | _is_nan(s1) | _is_nan(s2)
    return np.where(anynan, min_f32(min_f32(s0, s1), s2), out).astype(np.uint32)


# ------------------------------------------------------------------------------ conversions
def _cvt_u32_f32(ctx: OpContext, s0: Lanes) -> Lanes:
    """V_CVT_U32_F32 (VOP1 opcode 7): truncate toward zero; out-of-range values (infinities
    included) saturate to 0 or 0xffffffff; NaN converts to 0."""
    x = _f32(s0).astype(np.float64)
    with np.errstate(invalid="ignore"):
        t = np.clip(np.trunc(x), 0.0, 4294967295.0)
    return np.where(np.isnan(x), 0.0, t).astype(np.uint32)


def _cvt_i32_f32(ctx: OpContext, s0: Lanes) -> Lanes:
    """V_CVT_I32_F32 (VOP1 opcode 8): truncate toward zero, saturate to the i32 range, NaN -> 0."""
    x = _f32(s0).astype(np.float64)
    with np.errstate(invalid="ignore"):
        t = np.clip(np.trunc(x), -2147483648.0, 2147483647.0)
    return _lo32(np.where(np.isnan(x), 0.0, t).astype(np.int64))


def _cvt_f32_u32(ctx: OpContext, s0: Lanes) -> Lanes:
    """V_CVT_F32_U32 (VOP1 opcode 6): round to nearest even (a uint32 is exact in float64, so
    one rounding to float32)."""
    return _bits_f32(s0.astype(np.float64).astype(np.float32))


def _cvt_f32_i32(ctx: OpContext, s0: Lanes) -> Lanes:
    """V_CVT_F32_I32 (VOP1 opcode 5): round to nearest even."""
    return _bits_f32(_i(s0).astype(np.float64).astype(np.float32))


def _cvt_f32_ubyte(n: int) -> LaneOp:
    def op(ctx: OpContext, s0: Lanes) -> Lanes:
        return _bits_f32(((s0 >> np.uint32(8 * n)) & np.uint32(0xFF)).astype(np.float32))

    op.__doc__ = f"V_CVT_F32_UBYTE{n}: byte {n} of S0 as an exact float."
    return op


# ------------------------------------------------------------------------------ integer
def _add_co(ctx: OpContext, s0: Lanes, s1: Lanes) -> Result:
    """V_ADD_CO_U32: carry-out = the 33rd bit of S0 + S1."""
    t = _u(s0) + _u(s1)
    return _lo32(_sat_u(t, 32, ctx)), t > _U32


def _sub_co(ctx: OpContext, s0: Lanes, s1: Lanes) -> Result:
    """V_SUB_CO_U32: borrow-out = S1 > S0."""
    t = _u(s0).astype(np.int64) - _u(s1).astype(np.int64)
    return _lo32(_sat_u(t, 32, ctx)), s1 > s0


def _subrev_co(ctx: OpContext, s0: Lanes, s1: Lanes) -> Result:
    """V_SUBREV_CO_U32: S1 - S0, borrow-out = S0 > S1."""
    return _sub_co(ctx, s1, s0)


def _addc_co(ctx: OpContext, s0: Lanes, s1: Lanes) -> Result:
    """V_ADDC_CO_U32: S0 + S1 + carry-in, carry-out = bit 32 of the sum."""
    c = _need_mask(ctx, "v_addc_co_u32").astype(np.uint64)
    t = _u(s0) + _u(s1) + c
    return _lo32(_sat_u(t, 32, ctx)), t > _U32


def _subb_co(ctx: OpContext, s0: Lanes, s1: Lanes, op: str = "v_subb_co_u32") -> Result:
    """V_SUBB_CO_U32: S0 - S1 - borrow-in, borrow-out = S1 + borrow-in > S0."""
    c = _need_mask(ctx, op).astype(np.int64)
    t = _u(s0).astype(np.int64) - _u(s1).astype(np.int64) - c
    return _lo32(_sat_u(t, 32, ctx)), t < 0


def _subbrev_co(ctx: OpContext, s0: Lanes, s1: Lanes) -> Result:
    """V_SUBBREV_CO_U32: S1 - S0 - borrow-in, borrow-out = S0 + borrow-in > S1. (Older guides
    copy V_SUBB_CO_U32's borrow formula here; the opcode is V_SUBB_CO_U32 with its sources
    swapped, as the Vega guide's note "SQ translates this to V_SUBB_U32 with reversed operands"
    says, so the borrow is that of S1 - S0 - borrow-in.)"""
    return _subb_co(ctx, s1, s0, "v_subbrev_co_u32")


def _add_u32(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    return _lo32(_sat_u(_u(s0) + _u(s1), 32, ctx))


def _sub_u32(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    return _lo32(_sat_u(_u(s0).astype(np.int64) - _u(s1).astype(np.int64), 32, ctx))


def _subrev_u32(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    return _sub_u32(ctx, s1, s0)


def _cndmask(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    """V_CNDMASK_B32: D = mask ? S1 : S0."""
    return np.where(_need_mask(ctx, "v_cndmask_b32"), s1, s0).astype(np.uint32)


def _sext(v: np.ndarray, bits: int) -> np.ndarray:
    """The low ``bits`` bits of integer lanes, sign-extended, as int64."""
    v = v.astype(np.int64) & ((1 << bits) - 1)
    return v - ((v >> (bits - 1)) & 1) * (1 << bits)


def _mad_u64_u32(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Result:
    """V_MAD_U64_U32 (VOP3 opcode 488): {D1.u1, D0.u64} = 65'U(S0.u32) * 65'U(S1.u32) +
    65'U(S2.u64); D1 (the SGPR-pair destination) is bit 64 of the 65-bit sum."""
    p = _u(s0) * _u(s1)  # < 2^64, exact in uint64
    c = _u64(s2)
    t = p + c  # wraps modulo 2^64
    return _pair(t), t < p


def _mad_i64_i32(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Result:
    """V_MAD_I64_I32 (VOP3 opcode 489): {D1.i1, D0.i64} = 65'I(S0.i32) * 65'I(S1.i32) +
    65'I(S2.i64); D1 is bit 64 of the 65-bit two's-complement sum of the sign-extended terms."""
    p = _i(s0) * _i(s1)  # |p| <= 2^62: exact in int64
    c = _u64(s2).view(np.int64)
    lo = p.view(np.uint64) + c.view(np.uint64)  # bits 63:0 of the sum, modulo 2^64
    # bit 64 of the 65-bit sum: bit 64 of each sign-extended term (its sign) plus the carry out
    # of bit 63, modulo 2
    carry = lo < p.view(np.uint64)
    bit64 = (carry.astype(np.int64) + (p < 0) + (c < 0)) & 1
    return _pair(lo), bit64.astype(bool)


def _bfe_u32(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Lanes:
    """V_BFE_U32 (VOP3 opcode 456): (S0 >> S1[4:0]) & ((1 << S2[4:0]) - 1); width 0 gives 0."""
    off = (s1 & np.uint32(31)).astype(np.uint64)
    width = (s2 & np.uint32(31)).astype(np.uint64)
    mask = (np.uint64(1) << width) - np.uint64(1)
    return ((_u(s0) >> off) & mask).astype(np.uint32)


def _bfe_i32(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Lanes:
    """V_BFE_I32 (VOP3 opcode 457): tmp = (S0.i32 >> S1[4:0]) & ((1 << S2[4:0]) - 1), then
    signext_from_bit(tmp, S2[4:0]) (the arithmetic shift brings sign bits into a field that runs
    past bit 31; width 0 gives 0)."""
    off = (s1 & np.uint32(31)).astype(np.int64)
    width = (s2 & np.uint32(31)).astype(np.int64)
    tmp = (_i(s0) >> off) & ((np.int64(1) << width) - 1)
    sign = np.where(width > 0, (tmp >> np.maximum(width - 1, 0)) & 1, 0)
    return _lo32(tmp - sign * (np.int64(1) << width))


def _bfi(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Lanes:
    """V_BFI_B32: (S0 & S1) | (~S0 & S2)."""
    return ((s0 & s1) | (~s0 & s2)).astype(np.uint32)


def _bfm(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    """V_BFM_B32: ((1 << S0[4:0]) - 1) << S1[4:0]."""
    m = (np.uint64(1) << _sh32(s0)) - np.uint64(1)
    return ((m << _sh32(s1)) & _U32).astype(np.uint32)


def _alignbit(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Lanes:
    """V_ALIGNBIT_B32 (VOP3 opcode 462): ({S0, S1} >> S2[4:0]) & 0xffffffff (S0 the high
    dword)."""
    v = (_u(s0) << np.uint64(32)) | _u(s1)
    return ((v >> (s2 & np.uint32(31)).astype(np.uint64)) & _U32).astype(np.uint32)


def _alignbyte(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Lanes:
    """V_ALIGNBYTE_B32 (VOP3 opcode 463): ({S0, S1} >> (S2[1:0] * 8)) & 0xffffffff."""
    v = (_u(s0) << np.uint64(32)) | _u(s1)
    sh = ((s2 & np.uint32(3)) * np.uint32(8)).astype(np.uint64)
    return ((v >> sh) & _U32).astype(np.uint32)


def _perm(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Lanes:
    """V_PERM_B32 (VOP3 opcode 493): each result byte k is BYTE_PERMUTE({S0, S1}, S2 byte k),
    where for the selector ``sel`` (all 8 bits): 0-7 pick that byte of the 64-bit value (bytes
    0-3 from S1, 4-7 from S0); 8, 9, 10, 11 replicate the top bit of byte 1, 3, 5, 7; 12 gives
    0x00; 13 and above give 0xff."""
    n = s0.shape[0]
    table = np.empty((n, 16), dtype=np.uint8)  # per lane, the byte each selector 0-15 gives
    table[:, 0:4] = _bytes(s1)
    table[:, 4:8] = _bytes(s0)
    table[:, 8:12] = np.where(table[:, 1:8:2] & 0x80, 0xFF, 0)
    table[:, 12] = 0
    table[:, 13:16] = 0xFF
    sel = np.minimum(_bytes(s2), 15)  # 13 and above all give 0xff
    return np.take_along_axis(table, sel, axis=1).view(np.uint32).reshape(n)


def _bytes(x: Lanes) -> np.ndarray:
    """The 4 bytes of each lane, least significant first: ``(lanes, 4)`` uint8."""
    return np.ascontiguousarray(x, dtype="<u4").view(np.uint8).reshape(-1, 4)


def _mul_lo_u32(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    return ((_u(s0) * _u(s1)) & _U32).astype(np.uint32)


def _mul_hi_u32(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    return ((_u(s0) * _u(s1)) >> np.uint64(32)).astype(np.uint32)


def _mul_hi_i32(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    return _lo32((_i(s0) * _i(s1)) >> 32)


def _mul_i32_i24(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    """V_MUL_I32_I24: 32'I(S0.i24) * 32'I(S1.i24): the low 24 bits of each source,
    sign-extended; the low 32 bits of the product."""
    return _lo32(_sext(s0, 24) * _sext(s1, 24))


def _mul_hi_i32_i24(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    return _lo32((_sext(s0, 24) * _sext(s1, 24)) >> 32)


def _mul_u32_u24(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    m = np.uint64(0xFFFFFF)
    return ((_u(s0) & m) * (_u(s1) & m) & _U32).astype(np.uint32)


def _mul_hi_u32_u24(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    m = np.uint64(0xFFFFFF)
    return (((_u(s0) & m) * (_u(s1) & m)) >> np.uint64(32)).astype(np.uint32)


def _mad_i32_i24(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Lanes:
    """V_MAD_I32_I24 (VOP3 opcode 450): 32'I(S0.i24) * 32'I(S1.i24) + S2.i32, modulo 2^32."""
    return _lo32(_sext(s0, 24) * _sext(s1, 24) + _i(s2))


def _mad_u32_u24(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Lanes:
    m = np.uint64(0xFFFFFF)
    return (((_u(s0) & m) * (_u(s1) & m) + _u(s2)) & _U32).astype(np.uint32)


def _sh32(s: Lanes) -> np.ndarray:
    return (s & np.uint32(31)).astype(np.uint64)


def _sh64(s: Lanes) -> np.ndarray:
    return (s & np.uint32(63)).astype(np.uint64)


def _lshl_add_u64(ctx: OpContext, s0: Lanes, s1: Lanes, s2: Lanes) -> Lanes:
    """V_LSHL_ADD_U64 (VOP3 opcode 520): (S0.u64 << S1[2:0]) + S2.u64, modulo 2^64. The guides:
    "the shift count must be between 0 and 4 ... The design treats unsupported shift counts as a
    shift of zero", so S1[2:0] of 5, 6, 7 shift by 0."""
    sh = (s1 & np.uint32(7)).astype(np.uint64)
    sh = np.where(sh > 4, np.uint64(0), sh)
    return _pair((_u64(s0) << sh) + _u64(s2))


def _b16(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], name: str, sat: bool = False):
    """A 16-bit VOP2 integer opcode: the low 16 bits of each source, the 16-bit result in bits
    15:0 and zero in bits 31:16 (see the module docstring)."""

    def op(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
        if ctx.dst_word:
            raise ValueError(f"{name}: has no op_sel destination select on gfx942/gfx950")
        r = fn((s0 & np.uint32(0xFFFF)).astype(np.int64), (s1 & np.uint32(0xFFFF)).astype(np.int64))
        if sat:
            r = _sat_u(r, 16, ctx)
        return (r.astype(np.int64) & 0xFFFF).astype(np.uint32)

    op.__doc__ = f"{name.upper()}: 16-bit result, bits 31:16 zero."
    return op


def _popcount(x: Lanes) -> np.ndarray:
    """Set bits per uint32 lane, as int64."""
    by = np.ascontiguousarray(x, dtype=np.uint32).view(np.uint8).reshape(-1, 4)
    return np.unpackbits(by, axis=1).sum(axis=1).astype(np.int64)


def _s16(v: np.ndarray) -> np.ndarray:
    return _sext(v, 16)


# ------------------------------------------------------------------------------ compares
_F_PRED: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "f": lambda a, b: np.zeros(a.shape, bool),
    "lt": lambda a, b: a < b,
    "eq": lambda a, b: a == b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "lg": lambda a, b: (a < b) | (a > b),
    "ge": lambda a, b: a >= b,
    "o": lambda a, b: ~(np.isnan(a) | np.isnan(b)),
    "u": lambda a, b: np.isnan(a) | np.isnan(b),
    "nge": lambda a, b: ~(a >= b),
    "nlg": lambda a, b: ~((a < b) | (a > b)),
    "ngt": lambda a, b: ~(a > b),
    "nle": lambda a, b: ~(a <= b),
    "neq": lambda a, b: ~(a == b),
    "nlt": lambda a, b: ~(a < b),
    "tru": lambda a, b: np.ones(a.shape, bool),
}
_I_PRED: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "f": lambda a, b: np.zeros(a.shape, bool),
    "lt": lambda a, b: a < b,
    "eq": lambda a, b: a == b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ne": lambda a, b: a != b,
    "ge": lambda a, b: a >= b,
    "t": lambda a, b: np.ones(a.shape, bool),
}


def _f16(x: Lanes) -> np.ndarray:
    return (x & np.uint32(0xFFFF)).astype(np.uint16).view(np.float16)


def _f64(x: Lanes) -> np.ndarray:
    return _u64(x).view(np.float64)


_FLOAT_VIEW = {"f16": _f16, "f32": _f32, "f64": _f64}
_INT_VIEW: dict[str, Callable[[Lanes], np.ndarray]] = {
    "i16": lambda x: _s16(x),
    "u16": lambda x: (x & np.uint32(0xFFFF)).astype(np.int64),
    "i32": _i,
    "u32": _u,
    "i64": lambda x: _u64(x).view(np.int64),
    "u64": _u64,
}


def _cmp(pred: Callable[[np.ndarray, np.ndarray], np.ndarray], view: Callable) -> LaneOp:
    def op(ctx: OpContext, s0: Lanes, s1: Lanes) -> Result:
        with np.errstate(invalid="ignore"):
            return None, np.asarray(pred(view(s0), view(s1)), dtype=bool)

    return op


# class bits (VOPC V_CMP_CLASS_*): 0 sNaN, 1 qNaN, 2 -inf, 3 -normal, 4 -denormal, 5 -0,
# 6 +0, 7 +denormal, 8 +normal, 9 +inf
_CLASS_LAYOUT = {"f16": (16, 10), "f32": (32, 23), "f64": (64, 52)}


def _class_index(bits: np.ndarray, width: int, mant: int) -> np.ndarray:
    """The class number (0-9) of each raw float of ``width`` bits with ``mant`` mantissa bits."""
    bits = bits.astype(np.uint64)
    sign = (bits >> np.uint64(width - 1)) & np.uint64(1)
    exp_mask = np.uint64((1 << (width - 1 - mant)) - 1)
    exp = (bits >> np.uint64(mant)) & exp_mask
    frac = bits & np.uint64((1 << mant) - 1)
    quiet = (frac >> np.uint64(mant - 1)) & np.uint64(1)
    neg = sign == 1
    return np.select(
        [
            (exp == exp_mask) & (frac != 0) & (quiet == 0),
            (exp == exp_mask) & (frac != 0),
            (exp == exp_mask) & neg,
            exp == exp_mask,
            (exp == 0) & (frac == 0) & neg,
            (exp == 0) & (frac == 0),
            (exp == 0) & neg,
            exp == 0,
            neg,
        ],
        [0, 1, 2, 9, 5, 6, 4, 7, 3],
        8,
    )


def _cmp_class(ty: str) -> LaneOp:
    width, mant = _CLASS_LAYOUT[ty]

    def op(ctx: OpContext, s0: Lanes, s1: Lanes) -> Result:
        raw = _u64(s0) if ty == "f64" else _u(s0) & np.uint64((1 << width) - 1)
        idx = _class_index(raw, width, mant).astype(np.uint32)
        return None, ((s1 >> idx) & np.uint32(1)).astype(bool)

    op.__doc__ = (
        f"V_CMP_CLASS_{ty.upper()}: true when S0's class bit is set in S1[9:0] (0 sNaN, 1 qNaN, "
        "2 -inf, 3 -normal, 4 -denormal, 5 -0, 6 +0, 7 +denormal, 8 +normal, 9 +inf)."
    )
    return op


def _compares() -> dict[str, LaneOp]:
    out: dict[str, LaneOp] = {}
    for sfx in ("cmp", "cmpx"):  # cmpx: the same bit, which the executor also writes to EXEC
        for ty, view in _FLOAT_VIEW.items():
            for name, pred in _F_PRED.items():
                out[f"v_{sfx}_{name}_{ty}"] = _cmp(pred, view)
            out[f"v_{sfx}_class_{ty}"] = _cmp_class(ty)
        for ty, view in _INT_VIEW.items():
            for name, pred in _I_PRED.items():
                out[f"v_{sfx}_{name}_{ty}"] = _cmp(pred, view)
    return out


# ------------------------------------------------------------------------------ packed f32
def _pk(fn: Callable[..., np.ndarray]) -> LaneOp:
    """A packed-f32 opcode: ``fn`` on column 0 and on column 1 of every ``(64, 2)`` source (see
    the module docstring for what the executor selects into each column)."""

    def op(ctx: OpContext, *srcs: Lanes) -> Lanes:
        for s in srcs:  # (64, 2) for a wave; (64 * waves, 2) for a gang of them
            if s.ndim != 2 or s.shape[1] != 2 or s.shape[0] % 64:
                raise ValueError(f"a packed-f32 source must have shape (64, 2), not {s.shape}")
        with np.errstate(all="ignore"):  # both columns at once: fn is elementwise
            return _bits_f32(fn(*(_f32(s) for s in srcs)))

    # the executor may apply ``fn`` to several instructions' columns at once (``fuse.py``)
    op.elementwise_f32 = fn  # type: ignore[attr-defined]
    return op


def _pk_mov(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    """V_PK_MOV_B32: D[31:0] = src0 column 0, D[63:32] = src1 column 0."""
    return np.stack([s0[:, 0], s1[:, 0]], 1).astype(np.uint32)


def _fmac(ctx: OpContext, s0: Lanes, s1: Lanes) -> Lanes:
    """V_FMAC_F32 (VOP2 opcode 59): D = fma(S0, S1, D); D's old bits come in ``ctx.old_dst``."""
    if ctx.old_dst is None:
        raise ValueError("v_fmac_f32: needs the destination's old bits (the addend) in ctx.old_dst")
    return _bits_f32(fma_f32(_f32(s0), _f32(s1), _f32(ctx.old_dst)))


# ------------------------------------------------------------------------------ the table
def _build() -> dict[str, LaneOp]:
    u32 = np.uint32
    t: dict[str, LaneOp] = {
        # moves and selects
        "v_mov_b32": lambda ctx, s0: s0.astype(np.uint32, copy=True),
        "v_accvgpr_read_b32": lambda ctx, s0: s0.astype(np.uint32, copy=True),
        "v_accvgpr_write_b32": lambda ctx, s0: s0.astype(np.uint32, copy=True),
        "v_mov_b64": lambda ctx, s0: _pair(_u64(s0)),
        "v_cndmask_b32": _cndmask,
        # 32-bit integer add/sub
        "v_add_u32": _add_u32,
        "v_sub_u32": _sub_u32,
        "v_subrev_u32": _subrev_u32,
        "v_add_co_u32": _add_co,
        "v_sub_co_u32": _sub_co,
        "v_subrev_co_u32": _subrev_co,
        "v_addc_co_u32": _addc_co,
        "v_subb_co_u32": _subb_co,
        "v_subbrev_co_u32": _subbrev_co,
        "v_add3_u32": lambda ctx, a, b, c: _lo32(_u(a) + _u(b) + _u(c)),
        "v_xad_u32": lambda ctx, a, b, c: _lo32(_u(a ^ b) + _u(c)),
        # bitwise
        "v_and_b32": lambda ctx, a, b: (a & b).astype(u32),
        "v_or_b32": lambda ctx, a, b: (a | b).astype(u32),
        "v_xor_b32": lambda ctx, a, b: (a ^ b).astype(u32),
        "v_xnor_b32": lambda ctx, a, b: (~(a ^ b)).astype(u32),
        "v_not_b32": lambda ctx, a: (~a).astype(u32),
        "v_and_or_b32": lambda ctx, a, b, c: ((a & b) | c).astype(u32),
        "v_or3_b32": lambda ctx, a, b, c: (a | b | c).astype(u32),
        "v_bfi_b32": _bfi,
        "v_bfm_b32": _bfm,
        "v_bfe_u32": _bfe_u32,
        "v_bfe_i32": _bfe_i32,
        "v_alignbit_b32": _alignbit,
        "v_alignbyte_b32": _alignbyte,
        "v_perm_b32": _perm,
        "v_bcnt_u32_b32": lambda ctx, a, b: _lo32(_popcount(a) + _u(b).astype(np.int64)),
        # shifts: 32-bit amounts are S[4:0], 64-bit amounts S[5:0] (the guides' pseudocode)
        # uint32 shifts by 0..31 are exact modulo 2**32
        "v_lshlrev_b32": lambda ctx, a, b: np.left_shift(b, a & u32(31), dtype=u32),
        "v_lshrrev_b32": lambda ctx, a, b: np.right_shift(b, a & u32(31), dtype=u32),
        "v_ashrrev_i32": lambda ctx, a, b: _lo32(_i(b) >> _sh32(a).astype(np.int64)),
        "v_lshlrev_b64": lambda ctx, a, b: _pair(_u64(b) << _sh64(a)),
        "v_lshrrev_b64": lambda ctx, a, b: _pair(_u64(b) >> _sh64(a)),
        "v_ashrrev_i64": lambda ctx, a, b: _pair(
            _u64(b).view(np.int64) >> _sh64(a).astype(np.int64)
        ),
        "v_lshl_add_u32": lambda ctx, a, b, c: _lo32(((_u(a) << _sh32(b)) & _U32) + _u(c)),
        "v_add_lshl_u32": lambda ctx, a, b, c: _lo32(((_u(a) + _u(b)) & _U32) << _sh32(c)),
        "v_lshl_or_b32": lambda ctx, a, b, c: (((_u(a) << _sh32(b)) & _U32) | _u(c)).astype(u32),
        "v_lshl_add_u64": _lshl_add_u64,
        # min/max
        "v_min_i32": lambda ctx, a, b: np.where(_i(a) < _i(b), a, b).astype(u32),
        "v_max_i32": lambda ctx, a, b: np.where(_i(a) >= _i(b), a, b).astype(u32),
        "v_min_u32": lambda ctx, a, b: np.minimum(a, b).astype(u32),
        "v_max_u32": lambda ctx, a, b: np.maximum(a, b).astype(u32),
        "v_min3_i32": lambda ctx, a, b, c: _lo32(np.minimum(np.minimum(_i(a), _i(b)), _i(c))),
        "v_max3_i32": lambda ctx, a, b, c: _lo32(np.maximum(np.maximum(_i(a), _i(b)), _i(c))),
        "v_min3_u32": lambda ctx, a, b, c: np.minimum(np.minimum(a, b), c).astype(u32),
        "v_max3_u32": lambda ctx, a, b, c: np.maximum(np.maximum(a, b), c).astype(u32),
        "v_med3_i32": lambda ctx, a, b, c: _lo32(np.sort(np.stack([_i(a), _i(b), _i(c)]), 0)[1]),
        "v_med3_u32": lambda ctx, a, b, c: np.sort(np.stack([a, b, c]), 0)[1].astype(u32),
        # multiplies
        "v_mul_lo_u32": _mul_lo_u32,
        "v_mul_hi_u32": _mul_hi_u32,
        "v_mul_hi_i32": _mul_hi_i32,
        "v_mul_i32_i24": _mul_i32_i24,
        "v_mul_hi_i32_i24": _mul_hi_i32_i24,
        "v_mul_u32_u24": _mul_u32_u24,
        "v_mul_hi_u32_u24": _mul_hi_u32_u24,
        "v_mad_i32_i24": _mad_i32_i24,
        "v_mad_u32_u24": _mad_u32_u24,
        "v_mad_u64_u32": _mad_u64_u32,
        "v_mad_i64_i32": _mad_i64_i32,
        # 16-bit (VOP2): the shift amount is S0[3:0]
        "v_add_u16": _b16(lambda a, b: a + b, "v_add_u16", sat=True),
        "v_sub_u16": _b16(lambda a, b: a - b, "v_sub_u16", sat=True),
        "v_subrev_u16": _b16(lambda a, b: b - a, "v_subrev_u16", sat=True),
        "v_mul_lo_u16": _b16(lambda a, b: a * b, "v_mul_lo_u16"),
        "v_lshlrev_b16": _b16(lambda a, b: b << (a & 15), "v_lshlrev_b16"),
        "v_lshrrev_b16": _b16(lambda a, b: b >> (a & 15), "v_lshrrev_b16"),
        "v_ashrrev_i16": _b16(lambda a, b: _s16(b) >> (a & 15), "v_ashrrev_i16"),
        "v_max_u16": _b16(lambda a, b: np.maximum(a, b), "v_max_u16"),
        "v_min_u16": _b16(lambda a, b: np.minimum(a, b), "v_min_u16"),
        "v_max_i16": _b16(lambda a, b: np.maximum(_s16(a), _s16(b)), "v_max_i16"),
        "v_min_i16": _b16(lambda a, b: np.minimum(_s16(a), _s16(b)), "v_min_i16"),
        # f32 arithmetic
        "v_add_f32": _fop(lambda a, b: a + b),
        "v_sub_f32": _fop(lambda a, b: a - b),
        "v_subrev_f32": _fop(lambda a, b: b - a),
        "v_mul_f32": _fop(lambda a, b: a * b),
        "v_fma_f32": _fop(_fma_f32),
        "v_fmac_f32": _fmac,
        "v_max_f32": lambda ctx, a, b: max_f32(a, b),
        "v_min_f32": lambda ctx, a, b: min_f32(a, b),
        "v_max3_f32": lambda ctx, a, b, c: max_f32(max_f32(a, b), c),
        "v_min3_f32": lambda ctx, a, b, c: min_f32(min_f32(a, b), c),
        "v_med3_f32": _med3_f32,
        # int <-> f32 conversions
        "v_cvt_f32_u32": _cvt_f32_u32,
        "v_cvt_f32_i32": _cvt_f32_i32,
        "v_cvt_u32_f32": _cvt_u32_f32,
        "v_cvt_i32_f32": _cvt_i32_f32,
        **{f"v_cvt_f32_ubyte{n}": _cvt_f32_ubyte(n) for n in range(4)},
        # packed f32 (VOP3P)
        "v_pk_add_f32": _pk(lambda a, b: a + b),
        "v_pk_mul_f32": _pk(lambda a, b: a * b),
        "v_pk_fma_f32": _pk(_fma_f32),
        "v_pk_mov_b32": _pk_mov,
    }
    t.update(_compares())
    return t


VALU: dict[str, LaneOp] = _build()

# Opcodes whose VOP3 clamp bit means integer saturation, applied by the operation (ctx.clamp).
SATURATING: frozenset[str] = frozenset(
    ("v_add_u32 v_sub_u32 v_subrev_u32 v_add_co_u32 v_sub_co_u32 v_subrev_co_u32 v_addc_co_u32 "
     "v_subb_co_u32 v_subbrev_co_u32 v_add_u16 v_sub_u16 v_subrev_u16").split()
)  # fmt: skip
