"""The VALU operation table (``mono_aot/emulator/valu.py``) against references that do not share
its code: per-lane Python integers for the integer opcodes (the guides' pseudocode, written
again), exact rational arithmetic (``fractions.Fraction``) rounded to binary32 by hand for the
float opcodes, Python's IEEE float comparisons for the compares, and hand-computed tables for the
edges (0, -0, denormals, infinities, NaNs, INT_MIN, carries, shift amounts past the width, 16- and
24-bit edges, the v_perm_b32 selectors). The last tests check that every VALU opcode of the four
shipped kernels has an entry (reading the code objects from ``MONO_AOT_TEST_STORE``).
"""

from __future__ import annotations

import itertools
import os
import struct
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mono_aot.emulator.descriptor import KernelDescriptor
from mono_aot.emulator.lanes import LANES, OpContext
from mono_aot.emulator.valu import SATURATING, VALU, fma_f32, max_f32, min_f32

CTX = OpContext("gfx942")
M32 = (1 << 32) - 1
M64 = (1 << 64) - 1
RNG = np.random.default_rng(20240915)

EDGES = [0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 0x7F, 0x80, 0xFF, 0x7FFF,
         0x8000, 0xFFFF, 0x10000, 0x7FFFFF, 0x800000, 0xFFFFFF, 0x1000000, 0x7FFFFFFF,
         0x80000000, 0x80000001, 0xFFFFFFFE, 0xFFFFFFFF, 0x12345678, 0xDEADBEEF]  # fmt: skip


def lanes(values) -> np.ndarray:
    v = np.asarray(list(values), dtype=np.uint64).astype(np.uint32)
    assert v.shape == (LANES,)
    return v


def batches(n_src: int, extra: int = 192):
    """Source tuples in 64-lane batches: the edge values crossed (pairs; triples from a subset),
    then random 32-bit values."""
    if n_src == 1:
        combos = [(e,) for e in EDGES]
    elif n_src == 2:
        combos = list(itertools.product(EDGES, repeat=2))
    else:
        sub = EDGES[::3]
        combos = list(itertools.product(sub, repeat=3))
    combos += [tuple(int(x) for x in RNG.integers(0, 1 << 32, n_src)) for _ in range(extra)]
    while len(combos) % LANES:
        combos.append(tuple(int(x) for x in RNG.integers(0, 1 << 32, n_src)))
    for i in range(0, len(combos), LANES):
        chunk = combos[i : i + LANES]
        yield chunk, [lanes(c[k] for c in chunk) for k in range(n_src)]


def s32(x: int) -> int:
    x &= M32
    return x - (1 << 32) if x >> 31 else x


def sx(x: int, bits: int) -> int:
    x &= (1 << bits) - 1
    return x - (1 << bits) if x >> (bits - 1) else x


def perm_ref(a: int, b: int, sel: int) -> int:
    data = (a << 32) | b
    out = 0
    for k in range(4):
        s = (sel >> (8 * k)) & 0xFF
        if s >= 13:
            byte = 0xFF
        elif s == 12:
            byte = 0
        elif s >= 8:
            src_byte = {8: 1, 9: 3, 10: 5, 11: 7}[s]
            byte = 0xFF if (data >> (8 * src_byte + 7)) & 1 else 0
        else:
            byte = (data >> (8 * s)) & 0xFF
        out |= byte << (8 * k)
    return out


def bfe_i_ref(a: int, off: int, w: int) -> int:
    off, w = off & 31, w & 31
    if w == 0:
        return 0
    return sx((s32(a) >> off) & ((1 << w) - 1), w) & M32


# name -> per-lane reference over Python ints (the guides' pseudocode, written again)
INT_REFS = {
    "v_mov_b32": lambda a: a,
    "v_not_b32": lambda a: ~a & M32,
    "v_cvt_f32_ubyte0": lambda a: f32_bits(float(a & 0xFF)),
    "v_cvt_f32_ubyte1": lambda a: f32_bits(float((a >> 8) & 0xFF)),
    "v_cvt_f32_ubyte2": lambda a: f32_bits(float((a >> 16) & 0xFF)),
    "v_cvt_f32_ubyte3": lambda a: f32_bits(float(a >> 24)),
    "v_add_u32": lambda a, b: (a + b) & M32,
    "v_sub_u32": lambda a, b: (a - b) & M32,
    "v_subrev_u32": lambda a, b: (b - a) & M32,
    "v_and_b32": lambda a, b: a & b,
    "v_or_b32": lambda a, b: a | b,
    "v_xor_b32": lambda a, b: a ^ b,
    "v_xnor_b32": lambda a, b: ~(a ^ b) & M32,
    "v_bfm_b32": lambda a, b: (((1 << (a & 31)) - 1) << (b & 31)) & M32,
    "v_bcnt_u32_b32": lambda a, b: (bin(a).count("1") + b) & M32,
    "v_lshlrev_b32": lambda a, b: (b << (a & 31)) & M32,
    "v_lshrrev_b32": lambda a, b: b >> (a & 31),
    "v_ashrrev_i32": lambda a, b: (s32(b) >> (a & 31)) & M32,
    "v_min_i32": lambda a, b: min(s32(a), s32(b)) & M32,
    "v_max_i32": lambda a, b: max(s32(a), s32(b)) & M32,
    "v_min_u32": min,
    "v_max_u32": max,
    "v_mul_lo_u32": lambda a, b: (a * b) & M32,
    "v_mul_hi_u32": lambda a, b: (a * b) >> 32,
    "v_mul_hi_i32": lambda a, b: ((s32(a) * s32(b)) >> 32) & M32,
    "v_mul_i32_i24": lambda a, b: (sx(a, 24) * sx(b, 24)) & M32,
    "v_mul_hi_i32_i24": lambda a, b: ((sx(a, 24) * sx(b, 24)) >> 32) & M32,
    "v_mul_u32_u24": lambda a, b: ((a & 0xFFFFFF) * (b & 0xFFFFFF)) & M32,
    "v_mul_hi_u32_u24": lambda a, b: ((a & 0xFFFFFF) * (b & 0xFFFFFF)) >> 32,
    "v_add_u16": lambda a, b: (a + b) & 0xFFFF,
    "v_sub_u16": lambda a, b: (a - b) & 0xFFFF,
    "v_subrev_u16": lambda a, b: (b - a) & 0xFFFF,
    "v_mul_lo_u16": lambda a, b: ((a & 0xFFFF) * (b & 0xFFFF)) & 0xFFFF,
    "v_lshlrev_b16": lambda a, b: ((b & 0xFFFF) << (a & 15)) & 0xFFFF,
    "v_lshrrev_b16": lambda a, b: (b & 0xFFFF) >> (a & 15),
    "v_ashrrev_i16": lambda a, b: (sx(b, 16) >> (a & 15)) & 0xFFFF,
    "v_max_u16": lambda a, b: max(a & 0xFFFF, b & 0xFFFF),
    "v_min_u16": lambda a, b: min(a & 0xFFFF, b & 0xFFFF),
    "v_max_i16": lambda a, b: max(sx(a, 16), sx(b, 16)) & 0xFFFF,
    "v_min_i16": lambda a, b: min(sx(a, 16), sx(b, 16)) & 0xFFFF,
    "v_add3_u32": lambda a, b, c: (a + b + c) & M32,
    "v_xad_u32": lambda a, b, c: ((a ^ b) + c) & M32,
    "v_and_or_b32": lambda a, b, c: (a & b) | c,
    "v_or3_b32": lambda a, b, c: a | b | c,
    "v_bfi_b32": lambda a, b, c: (a & b) | (~a & c & M32),
    "v_bfe_u32": lambda a, b, c: (a >> (b & 31)) & ((1 << (c & 31)) - 1),
    "v_bfe_i32": bfe_i_ref,
    "v_alignbit_b32": lambda a, b, c: (((a << 32) | b) >> (c & 31)) & M32,
    "v_alignbyte_b32": lambda a, b, c: (((a << 32) | b) >> (8 * (c & 3))) & M32,
    "v_perm_b32": perm_ref,
    "v_lshl_add_u32": lambda a, b, c: (((a << (b & 31)) & M32) + c) & M32,
    "v_add_lshl_u32": lambda a, b, c: (((a + b) & M32) << (c & 31)) & M32,
    "v_lshl_or_b32": lambda a, b, c: ((a << (b & 31)) & M32) | c,
    "v_min3_i32": lambda a, b, c: min(s32(a), s32(b), s32(c)) & M32,
    "v_max3_i32": lambda a, b, c: max(s32(a), s32(b), s32(c)) & M32,
    "v_min3_u32": lambda a, b, c: min(a, b, c),
    "v_max3_u32": lambda a, b, c: max(a, b, c),
    "v_med3_i32": lambda a, b, c: sorted([s32(a), s32(b), s32(c)])[1] & M32,
    "v_med3_u32": lambda a, b, c: sorted([a, b, c])[1],
    "v_mad_i32_i24": lambda a, b, c: (sx(a, 24) * sx(b, 24) + s32(c)) & M32,
    "v_mad_u32_u24": lambda a, b, c: ((a & 0xFFFFFF) * (b & 0xFFFFFF) + c) & M32,
}


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_f32(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & M32))[0]


@pytest.mark.parametrize("name", sorted(INT_REFS))
def test_integer_op_matches_the_pseudocode(name):
    ref = INT_REFS[name]
    n_src = ref.__code__.co_argcount if hasattr(ref, "__code__") else 2
    for chunk, srcs in batches(n_src):
        got = VALU[name](CTX, *srcs)
        assert got.dtype == np.uint32 and got.shape == (LANES,)
        want = [ref(*c) for c in chunk]
        bad = [(c, hex(int(g)), hex(w)) for c, g, w in zip(chunk, got, want, strict=True) if g != w]
        assert not bad, f"{name}: first mismatches (sources, got, want): {bad[:4]}"


def test_the_reference_of_a_missing_op_would_fail():
    """The harness compares: a wrong operation (v_add_u32 standing in for v_sub_u32) fails."""
    chunk, srcs = next(batches(2))
    got = VALU["v_add_u32"](CTX, *srcs)
    assert any(int(g) != INT_REFS["v_sub_u32"](*c) for c, g in zip(chunk, got, strict=True))


# --------------------------------------------------------------------- hand-computed edges
def one(name, *vals, **kw):
    """Run ``name`` with every lane holding the same sources; return lane 0's result(s)."""
    ctx = OpContext("gfx942", **kw)
    srcs = []
    for v in vals:
        if isinstance(v, tuple):  # a 64-bit operand (lo, hi)
            srcs.append(np.tile(np.array(v, dtype=np.uint32), (LANES, 1)))
        else:
            srcs.append(np.full(LANES, v & M32, dtype=np.uint32))
    out = VALU[name](ctx, *srcs)
    if isinstance(out, tuple):
        d, m = out
        assert m.dtype == bool and m.shape == (LANES,)
        return (None if d is None else _lane0(d)), bool(m[0])
    return _lane0(out)


def _lane0(d):
    return int(d[0]) if d.ndim == 1 else (int(d[0, 0]) | int(d[0, 1]) << 32)


@pytest.mark.parametrize(
    ("name", "vals", "want"),
    [
        ("v_perm_b32", (0x01020304, 0x05060708, 0x00010203), 0x08070605),
        ("v_perm_b32", (0x01020304, 0x05060708, 0x07060504), 0x01020304),
        ("v_perm_b32", (0, 0x00008000, 0x0C0D0E08), 0x00FFFF00 | 0xFF),
        ("v_perm_b32", (0x80000000, 0x00800000, 0x0B0A0908), 0xFF000000),
        ("v_perm_b32", (0x00008000, 0x80000000, 0xFF0D0C0A), 0xFFFF00FF),
        ("v_bfe_u32", (0xFFFFFFFF, 4, 0), 0),
        ("v_bfe_u32", (0x80000000, 31, 31), 1),
        ("v_bfe_u32", (0xF0, 36, 4), 0xF),  # offset masked to 4
        ("v_bfe_u32", (0xABCD, 0, 33), 1),  # width masked to 1
        ("v_bfe_i32", (0x80000000, 31, 1), 0xFFFFFFFF),
        ("v_bfe_i32", (0x00000008, 3, 1), 0xFFFFFFFF),
        ("v_bfe_i32", (0x00000008, 3, 2), 1),
        ("v_bfe_i32", (0x80000000, 31, 4), 0xFFFFFFFF),  # field past bit 31: sign bits
        ("v_bfe_i32", (0xFFFFFFFF, 0, 0), 0),
        ("v_alignbit_b32", (0x12345678, 0x9ABCDEF0, 4), 0x89ABCDEF),
        ("v_alignbit_b32", (0x12345678, 0x9ABCDEF0, 32), 0x9ABCDEF0),
        ("v_lshlrev_b32", (33, 1), 2),
        ("v_lshrrev_b32", (32, 0x80000000), 0x80000000),
        ("v_ashrrev_i32", (31, 0x80000000), 0xFFFFFFFF),
        ("v_ashrrev_i32", (63, 0x80000000), 0xFFFFFFFF),
        ("v_mul_i32_i24", (0x800000, 1), 0xFF800000),
        ("v_mul_i32_i24", (0xFF000001, 2), 2),  # bits 31:24 ignored
        ("v_mul_i32_i24", (0x7FFFFF, 0x7FFFFF), (0x7FFFFF * 0x7FFFFF) & M32),
        ("v_mad_i32_i24", (0xFFFFFF, 0xFFFFFF, 0x80000000), 0x80000001),
        ("v_mul_hi_i32", (0x80000000, 0x80000000), 0x40000000),
        ("v_mul_hi_i32", (0xFFFFFFFF, 0xFFFFFFFF), 0),
        ("v_mul_hi_i32", (0x80000000, 1), 0xFFFFFFFF),
        ("v_mul_hi_u32", (0xFFFFFFFF, 0xFFFFFFFF), 0xFFFFFFFE),
        ("v_min_i32", (0x80000000, 0x7FFFFFFF), 0x80000000),
        ("v_max_i32", (0x80000000, 0xFFFFFFFF), 0xFFFFFFFF),
        ("v_add_u16", (0x1234FFFF, 0xABCD0001), 0),  # high halves ignored, result high half 0
        ("v_sub_u16", (0xFFFF0000, 0x00000001), 0xFFFF),
        ("v_ashrrev_i16", (15, 0xFFFF8000), 0xFFFF),
        ("v_ashrrev_i16", (16, 0x00008001), 0x8001),  # amount masked to 4 bits
        ("v_lshrrev_b16", (1, 0xFFFF8000), 0x4000),
        ("v_cvt_u32_f32", (f32_bits(float("nan")),), 0),
        ("v_cvt_u32_f32", (f32_bits(-1.5),), 0),
        ("v_cvt_u32_f32", (0x80000000,), 0),
        ("v_cvt_u32_f32", (f32_bits(0.999),), 0),
        ("v_cvt_u32_f32", (f32_bits(1.5),), 1),
        ("v_cvt_u32_f32", (f32_bits(3e9),), 3000000000),
        ("v_cvt_u32_f32", (f32_bits(4294967296.0),), M32),
        ("v_cvt_u32_f32", (f32_bits(float("inf")),), M32),
        ("v_cvt_u32_f32", (f32_bits(float("-inf")),), 0),
        ("v_cvt_u32_f32", (1,), 0),  # the smallest denormal
        ("v_cvt_i32_f32", (f32_bits(-2.5),), (-2) & M32),
        ("v_cvt_i32_f32", (f32_bits(3e9),), 0x7FFFFFFF),
        ("v_cvt_i32_f32", (f32_bits(float("-inf")),), 0x80000000),
        ("v_cvt_f32_u32", (0xFFFFFFFF,), f32_bits(4294967296.0)),
        ("v_cvt_f32_u32", (16777217,), f32_bits(16777216.0)),  # tie: to even
        ("v_cvt_f32_u32", (16777219,), f32_bits(16777220.0)),  # tie: to even (up)
        ("v_cvt_f32_i32", (0x80000000,), f32_bits(-2147483648.0)),
        ("v_lshlrev_b64", (64, (1, 0)), 1),  # amount masked to 6 bits
        ("v_lshlrev_b64", (65, (0x80000000, 0)), 1 << 32),
        ("v_lshrrev_b64", (63, (0, 0x80000000)), 1),
        ("v_ashrrev_i64", (63, (0, 0x80000000)), M64),
        ("v_ashrrev_i64", (32, (0, 0x80000001)), 0xFFFFFFFF80000001),
        ("v_lshl_add_u64", ((1, 0), 4, (0, 0)), 16),
        ("v_lshl_add_u64", ((1, 0), 5, (2, 0)), 3),  # 5-7 shift by 0 (the guides)
        ("v_lshl_add_u64", ((1, 0), 7, (2, 0)), 3),
        ("v_lshl_add_u64", ((1, 0), 9, (2, 0)), 4),  # S1[2:0] = 1
        ("v_lshl_add_u64", ((M32, M32), 1, (2, 0)), 0),  # wraps modulo 2^64
        ("v_mov_b64", ((0xDEADBEEF, 0x12345678),), 0x12345678DEADBEEF),
    ],
)
def test_edge_table(name, vals, want):
    assert one(name, *vals) == want, f"{name}{vals}"


@pytest.mark.parametrize(
    ("name", "vals", "carry_in", "want", "carry_out"),
    [
        ("v_add_co_u32", (M32, 1), None, 0, True),
        ("v_add_co_u32", (M32, 0), None, M32, False),
        ("v_addc_co_u32", (M32, 0), True, 0, True),
        ("v_addc_co_u32", (M32, M32), True, M32, True),
        ("v_addc_co_u32", (1, 2), False, 3, False),
        ("v_sub_co_u32", (0, 1), None, M32, True),
        ("v_sub_co_u32", (5, 5), None, 0, False),
        ("v_subrev_co_u32", (1, 0), None, M32, True),
        ("v_subb_co_u32", (5, 5), True, M32, True),
        ("v_subb_co_u32", (5, 4), True, 0, False),
        ("v_subb_co_u32", (0, M32), False, 1, True),
        ("v_subbrev_co_u32", (5, 5), True, M32, True),  # S1 - S0 - 1 borrows
        ("v_subbrev_co_u32", (4, 5), True, 0, False),
        ("v_subbrev_co_u32", (M32, 0), False, 1, True),
    ],
)
def test_carry_ops(name, vals, carry_in, want, carry_out):
    kw = {} if carry_in is None else {"mask": np.full(LANES, carry_in)}
    assert one(name, *vals, **kw) == (want, carry_out)


def test_a_64bit_add_chain_and_sub_chain_equal_python_ints():
    a = [int(x) for x in RNG.integers(0, 1 << 63, LANES)] + []
    b = [int(x) for x in RNG.integers(0, 1 << 63, LANES)]
    a[:4] = [M64, M64, 0, 1 << 32]
    b[:4] = [1, M64, 1, M32]
    lo = VALU["v_add_co_u32"](CTX, lanes(x & M32 for x in a), lanes(x & M32 for x in b))
    hi = VALU["v_addc_co_u32"](OpContext("gfx942", mask=lo[1]), lanes(x >> 32 for x in a),
                               lanes(x >> 32 for x in b))  # fmt: skip
    got = [int(l_) | int(h) << 32 for l_, h in zip(lo[0], hi[0], strict=True)]
    assert got == [(x + y) & M64 for x, y in zip(a, b, strict=True)]
    assert list(hi[1]) == [(x + y) >> 64 == 1 for x, y in zip(a, b, strict=True)]
    lo = VALU["v_sub_co_u32"](CTX, lanes(x & M32 for x in a), lanes(x & M32 for x in b))
    hi = VALU["v_subb_co_u32"](OpContext("gfx942", mask=lo[1]), lanes(x >> 32 for x in a),
                               lanes(x >> 32 for x in b))  # fmt: skip
    got = [int(l_) | int(h) << 32 for l_, h in zip(lo[0], hi[0], strict=True)]
    assert got == [(x - y) & M64 for x, y in zip(a, b, strict=True)]
    assert list(hi[1]) == [x < y for x, y in zip(a, b, strict=True)]


@pytest.mark.parametrize("signed", [False, True])
def test_mad_64_32_result_and_carry_out(signed):
    name = "v_mad_i64_i32" if signed else "v_mad_u64_u32"
    a = [int(x) for x in RNG.integers(0, 1 << 32, LANES, dtype=np.uint64)]
    b = [int(x) for x in RNG.integers(0, 1 << 32, LANES, dtype=np.uint64)]
    c = [int(x) for x in RNG.integers(0, 1 << 64, LANES, dtype=np.uint64)]
    edge = [(M32, M32, M64), (0x80000000, 0x80000000, 1 << 63), (0x80000000, 0x7FFFFFFF, 0),
            (M32, 1, 0), (0, 0, M64), (1, 1, M64), (0x80000000, 1, 1 << 63), (M32, M32, 0)]  # fmt: skip
    for i, (x, y, z) in enumerate(edge):
        a[i], b[i], c[i] = x, y, z
    d, m = VALU[name](CTX, lanes(a), lanes(b), np.array([[z & M32, z >> 32] for z in c], np.uint32))
    for i in range(LANES):
        if signed:
            r = (s32(a[i]) * s32(b[i]) + sx(c[i], 64)) & ((1 << 65) - 1)
        else:
            r = a[i] * b[i] + c[i]
        got = int(d[i, 0]) | int(d[i, 1]) << 32
        assert (got, bool(m[i])) == (r & M64, bool(r >> 64)), (name, a[i], b[i], c[i])
    assert m.any() and not m.all()


def test_clamp_saturates_the_integer_ops_that_support_it():
    assert one("v_add_u32", M32, 2, clamp=True) == M32
    assert one("v_sub_u32", 1, 2, clamp=True) == 0
    assert one("v_add_u16", 0xFFFF, 2, clamp=True) == 0xFFFF
    assert one("v_sub_u16", 1, 2, clamp=True) == 0
    assert one("v_add_co_u32", M32, 2, clamp=True) == (M32, True)
    assert one("v_add_u32", M32, 2) == 1
    assert {"v_add_u32", "v_add_u16", "v_addc_co_u32"} <= SATURATING


def test_cndmask_selects_per_lane():
    sel = np.arange(LANES) % 3 == 0
    a, b = lanes(range(LANES)), lanes(range(1000, 1000 + LANES))
    got = VALU["v_cndmask_b32"](OpContext("gfx942", mask=sel), a, b)
    assert list(got) == [1000 + i if i % 3 == 0 else i for i in range(LANES)]


@pytest.mark.parametrize("name", ["v_addc_co_u32", "v_subb_co_u32", "v_cndmask_b32"])
def test_missing_mask_is_an_error_naming_the_op(name):
    with pytest.raises(ValueError, match=name):
        VALU[name](CTX, lanes([1] * LANES), lanes([2] * LANES))


def test_16bit_op_refuses_a_high_destination_word():
    with pytest.raises(ValueError, match="v_add_u16"):
        VALU["v_add_u16"](OpContext("gfx942", dst_word=1), lanes([1] * LANES), lanes([1] * LANES))


# --------------------------------------------------------------------- f32: exact references
def round_f32(x: Fraction, neg_zero: bool = False) -> int:
    """The binary32 bits of the exact value ``x`` rounded to nearest even (subnormals,
    overflow to infinity), computed with integers only; ``neg_zero``: the sign of an exact 0."""
    if x == 0:
        return 0x80000000 if neg_zero else 0
    sign = 0x80000000 if x < 0 else 0
    m = abs(x)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if Fraction(2) ** e > m:
        e -= 1
    q = max(e, -126) - 23  # the quantum of m's binade (or the subnormal quantum)
    scaled = m / Fraction(2) ** q
    n = scaled.numerator // scaled.denominator
    rem = scaled - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2):
        n += 1
    if n * Fraction(2) ** q >= Fraction(2) ** 128:
        return sign | 0x7F800000
    if n >= 1 << 24:  # rounded up into the next binade: n = 2^24
        n, q = n >> 1, q + 1
    if n < (1 << 23):  # subnormal
        return sign | n
    return sign | ((q + 23 + 127) << 23) | (n - (1 << 23))


def test_round_f32_agrees_with_numpy_on_exact_binary64_values():
    """The hand rounding is checked where one rounding is unambiguous: binary64 inputs."""
    vals = RNG.standard_normal(2000) * np.exp2(RNG.integers(-160, 140, 2000))
    for v in vals:
        want = int(np.float32(v).view(np.uint32)) if abs(v) < 3.4e38 else None
        if want is not None and np.isfinite(np.float32(v)):
            assert round_f32(Fraction(float(v))) == want, v


def exact(b: int) -> Fraction:
    return Fraction(bits_f32(b))


def is_finite_bits(b: int) -> bool:
    return (b & 0x7F800000) != 0x7F800000


def fma_ref(a: int, b: int, c: int) -> int:
    p = exact(a) * exact(b)
    s = p + exact(c)
    p_neg_zero = p == 0 and ((a ^ b) >> 31) == 1
    return round_f32(s, neg_zero=(s == 0 and p_neg_zero and c == 0x80000000))


F32_EDGES = [0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x00800000, 0x3F800000, 0xBF800000,
             0x3F800001, 0x7F7FFFFF, 0xFF7FFFFF, 0x34000000, 0x33800000, 0x4B800000]  # fmt: skip


def f32_batches(n_src: int):
    combos = list(itertools.product(F32_EDGES, repeat=n_src))
    combos = [c for c in combos] + [
        tuple(int(x) for x in RNG.integers(0, 1 << 32, n_src)) for _ in range(640)
    ]
    combos = [c for c in combos if all(is_finite_bits(x) for x in c)]
    combos = combos[: len(combos) - len(combos) % LANES]
    for i in range(0, len(combos), LANES):
        chunk = combos[i : i + LANES]
        yield chunk, [lanes(c[k] for c in chunk) for k in range(n_src)]


F32_REFS = {
    "v_add_f32": lambda a, b: exact(a) + exact(b),
    "v_sub_f32": lambda a, b: exact(a) - exact(b),
    "v_subrev_f32": lambda a, b: exact(b) - exact(a),
    "v_mul_f32": lambda a, b: exact(a) * exact(b),
}
ZERO_SIGN = {  # the sign of an exact zero result under round to nearest even
    "v_add_f32": lambda a, b: a == b == 0x80000000,
    "v_sub_f32": lambda a, b: a == 0x80000000 and b == 0,
    "v_subrev_f32": lambda a, b: b == 0x80000000 and a == 0,
    "v_mul_f32": lambda a, b: ((a ^ b) >> 31) == 1,
}


@pytest.mark.parametrize("name", sorted(F32_REFS))
def test_f32_arithmetic_is_correctly_rounded_with_denormals(name):
    for chunk, srcs in f32_batches(2):
        got = VALU[name](CTX, *srcs)
        for c, g in zip(chunk, got, strict=True):
            want = round_f32(F32_REFS[name](*c), neg_zero=ZERO_SIGN[name](*c))
            assert int(g) == want, (name, [hex(x) for x in c], hex(int(g)), hex(want))


def test_fma_exact_on_edges_and_random_bits():
    for chunk, srcs in f32_batches(3):
        got = VALU["v_fma_f32"](CTX, *srcs)
        for c, g in zip(chunk, got, strict=True):
            assert int(g) == fma_ref(*c), ([hex(x) for x in c], hex(int(g)))


finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(finite32, finite32, finite32), min_size=1, max_size=LANES))
def test_fma_property_single_rounding(triples):
    triples = (triples * LANES)[:LANES]
    a, b, c = (np.array([t[k] for t in triples], np.float32) for k in range(3))
    got = fma_f32(a, b, c).view(np.uint32)
    for (x, y, z), g in zip(triples, got, strict=True):
        assert int(g) == fma_ref(f32_bits(x), f32_bits(y), f32_bits(z)), (x, y, z)


def test_fma_avoids_the_double_rounding_a_float64_sum_makes():
    """1 + 2^-23 + (2^-24 - 2^-70): binary64 rounds the sum onto the binary32 midpoint
    1 + 3 * 2^-24, which ties to even (up); the exact sum is below it (down)."""
    a = np.float32(2.0**-24 * (1 + 2.0**-23))
    b = np.float32(1 - 2.0**-23)
    c = np.float32(1 + 2.0**-23)
    naive = np.float32(np.float64(a) * np.float64(b) + np.float64(c))
    want = fma_ref(f32_bits(a), f32_bits(b), f32_bits(c))
    assert want == f32_bits(c)  # rounds down to 1 + 2^-23
    assert int(np.float32(naive).view(np.uint32)) != want  # the naive way is wrong here
    got = VALU["v_fma_f32"](CTX, *(lanes([f32_bits(v)] * LANES) for v in (a, b, c)))
    assert int(got[0]) == want


def test_fma_fast_path_and_round_to_odd_path_agree_lane_by_lane():
    """``fma_f32`` takes the plain binary64 sum unless a lane lands on a binary32 midpoint or in
    the subnormal range, then the round-to-odd path for the whole array: one lane at a time, each
    triple takes its own path, and every result must equal the exact reference; whole arrays
    (mixed paths) must equal the round-to-odd path lane for lane."""
    from mono_aot.emulator.valu import fma_odd64

    triples = [tuple(int(x) for x in RNG.integers(0, 1 << 32, 3)) for _ in range(300)]
    # on-midpoint sums (the double-rounding case) and subnormal results
    triples += [(f32_bits(np.float32(2.0**-24 * (1 + 2.0**-23))), f32_bits(np.float32(1 - 2.0**-23)),
                 f32_bits(np.float32(1 + 2.0**-23))), (0x00000003, 0x3F000000, 0x80000001),
                (0x00400000, 0x3F800000, 0x00000001), (0x7F7FFFFF, 0x3F800001, 0x73000000)]  # fmt: skip
    triples = [c for c in triples if all(is_finite_bits(x) for x in c)]
    for c in triples:
        a, b, z = (np.array([x], np.uint32).view(np.float32) for x in c)
        assert int(fma_f32(a, b, z).view(np.uint32)[0]) == fma_ref(*c), [hex(x) for x in c]
    arr = [np.array([c[k] for c in triples], np.uint32).view(np.float32) for k in range(3)]
    want = fma_odd64(*arr).astype(np.float32).view(np.uint32)
    for k in range(0, len(triples) - 8, 7):  # windows with and without a risky lane
        got = fma_f32(*(x[k : k + 8] for x in arr)).view(np.uint32)
        assert got.tolist() == want[k : k + 8].tolist()


def test_fma_special_values():
    inf, nan = float("inf"), float("nan")
    cases = [((inf, 0.0, 1.0), nan), ((inf, 1.0, -inf), nan), ((inf, 2.0, 1.0), inf),
             ((1.0, 1.0, nan), nan), ((-0.0, 1.0, -0.0), -0.0), ((-0.0, 1.0, 0.0), 0.0),
             ((3.4e38, 10.0, -3.4e38), inf), ((1e-45, 0.5, 0.0), 0.0)]  # fmt: skip
    for (x, y, z), want in cases:
        got = bits_f32(one("v_fma_f32", f32_bits(x), f32_bits(y), f32_bits(z)))
        if want != want:
            assert got != got, (x, y, z)
        else:
            assert f32_bits(got) == f32_bits(want), (x, y, z, got)


def test_fmac_reads_the_old_destination():
    d = lanes([f32_bits(0.25)] * LANES)
    got = VALU["v_fmac_f32"](OpContext("gfx942", old_dst=d), lanes([f32_bits(2.0)] * LANES),
                             lanes([f32_bits(3.0)] * LANES))  # fmt: skip
    assert bits_f32(int(got[0])) == 6.25
    with pytest.raises(ValueError, match="old_dst"):
        VALU["v_fmac_f32"](CTX, d, d)


QNAN, SNAN, QNAN2 = 0x7FC00000, 0x7F800001, 0xFFC12345
P0, N0 = 0, 0x80000000


@pytest.mark.parametrize(
    ("a", "b", "mx", "mn"),
    [
        (f32_bits(1.0), f32_bits(2.0), f32_bits(2.0), f32_bits(1.0)),
        (P0, N0, P0, N0),
        (N0, P0, P0, N0),
        (QNAN, f32_bits(1.0), f32_bits(1.0), f32_bits(1.0)),
        (f32_bits(1.0), QNAN, f32_bits(1.0), f32_bits(1.0)),
        (SNAN, f32_bits(1.0), SNAN | 0x400000, SNAN | 0x400000),
        (f32_bits(1.0), SNAN, SNAN | 0x400000, SNAN | 0x400000),
        (QNAN2, SNAN, SNAN | 0x400000, SNAN | 0x400000),  # sNaN first, even as S1
        (QNAN, QNAN2, QNAN2, QNAN2),  # NaN S0: the other operand
        (1, 0x80000001, 1, 0x80000001),  # denormals
        (f32_bits(float("-inf")), f32_bits(-3e38), f32_bits(-3e38), f32_bits(float("-inf"))),
    ],
)
def test_min_max_f32_ieee_mode(a, b, mx, mn):
    assert one("v_max_f32", a, b) == mx
    assert one("v_min_f32", a, b) == mn


def test_min_max_f32_agree_with_numpy_on_ordered_values_and_max3_chains():
    x = RNG.standard_normal((3, LANES)).astype(np.float32)
    x[:, :4] = [[1.0, -1.0, 0.0, 5.0], [2.0, -1.0, 0.0, 5.0], [3.0, -2.0, 0.0, 5.0]]
    a, b, c = (v.view(np.uint32) for v in x)
    assert np.array_equal(max_f32(a, b).view(np.float32), np.maximum(x[0], x[1]))
    assert np.array_equal(min_f32(a, b).view(np.float32), np.minimum(x[0], x[1]))
    got = VALU["v_max3_f32"](CTX, a, b, c).view(np.float32)
    assert np.array_equal(got, np.max(x, axis=0))
    got = VALU["v_med3_f32"](CTX, a, b, c).view(np.float32)
    assert np.array_equal(got, np.median(x, axis=0))
    # max3 with a NaN in the middle: the NaN is dropped, as v_max_f32 drops it
    assert one("v_max3_f32", f32_bits(1.0), QNAN, f32_bits(3.0)) == f32_bits(3.0)


def test_cvt_f32_u32_is_correctly_rounded():
    for chunk, (src,) in batches(1, extra=512):
        got = VALU["v_cvt_f32_u32"](CTX, src)
        assert [int(g) for g in got] == [round_f32(Fraction(c[0])) for c in chunk]


# --------------------------------------------------------------------- compares
F_CMP = {
    "f": lambda a, b: False, "lt": lambda a, b: a < b, "eq": lambda a, b: a == b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "lg": lambda a, b: a < b or a > b,
    "ge": lambda a, b: a >= b, "o": lambda a, b: a == a and b == b,
    "u": lambda a, b: a != a or b != b, "nge": lambda a, b: not a >= b,
    "nlg": lambda a, b: not (a < b or a > b), "ngt": lambda a, b: not a > b,
    "nle": lambda a, b: not a <= b, "neq": lambda a, b: not a == b,
    "nlt": lambda a, b: not a < b, "tru": lambda a, b: True,
}  # fmt: skip
CMP_F32 = [0, 0x80000000, 1, 0x80000001, f32_bits(1.0), f32_bits(-1.0), f32_bits(2.0), 0x7F800000,
           0xFF800000, QNAN, SNAN, QNAN2]  # fmt: skip


@pytest.mark.parametrize("cond", sorted(F_CMP))
@pytest.mark.parametrize("x", ["cmp", "cmpx"])
def test_f32_compares_follow_ieee_including_nan(cond, x):
    pairs = list(itertools.product(CMP_F32, repeat=2))
    pairs = (pairs * 2)[: 2 * LANES]
    for i in range(0, len(pairs), LANES):
        chunk = pairs[i : i + LANES]
        d, m = VALU[f"v_{x}_{cond}_f32"](
            CTX, lanes(p[0] for p in chunk), lanes(p[1] for p in chunk)
        )
        assert d is None
        want = [F_CMP[cond](bits_f32(p[0]), bits_f32(p[1])) for p in chunk]
        assert list(m) == want, cond


def test_f64_and_f16_compares():
    one_f64 = struct.unpack("<II", struct.pack("<d", 1.0))
    two_f64 = struct.unpack("<II", struct.pack("<d", 2.0))
    nan_f64 = (0, 0x7FF80000)
    assert one("v_cmp_lt_f64", one_f64, two_f64) == (None, True)
    assert one("v_cmp_nge_f64", nan_f64, two_f64) == (None, True)
    assert one("v_cmp_ge_f64", nan_f64, two_f64) == (None, False)
    assert one("v_cmp_lt_f16", 0xFFFF3C00, 0x4000) == (None, True)  # 1.0 < 2.0, high half ignored
    assert one("v_cmp_eq_f16", 0x8000, 0x0000) == (None, True)  # -0 == +0
    assert one("v_cmp_u_f16", 0x7E00, 0x0000) == (None, True)


I_CMP = {"f": lambda a, b: False, "lt": lambda a, b: a < b, "eq": lambda a, b: a == b,
         "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ne": lambda a, b: a != b,
         "ge": lambda a, b: a >= b, "t": lambda a, b: True}  # fmt: skip
I_VIEW = {"i32": s32, "u32": lambda v: v & M32, "i16": lambda v: sx(v, 16),
          "u16": lambda v: v & 0xFFFF}  # fmt: skip


@pytest.mark.parametrize("ty", sorted(I_VIEW))
@pytest.mark.parametrize("cond", sorted(I_CMP))
def test_integer_compares(ty, cond):
    for chunk, (a, b) in itertools.islice(batches(2, extra=64), 4):
        _, m = VALU[f"v_cmp_{cond}_{ty}"](CTX, a, b)
        want = [I_CMP[cond](I_VIEW[ty](x), I_VIEW[ty](y)) for x, y in chunk]
        assert list(m) == want, (ty, cond)


@pytest.mark.parametrize("ty", ["i64", "u64"])
def test_64bit_compares(ty):
    vals = [0, 1, M64, 1 << 63, (1 << 63) - 1, 1 << 32, M32]
    pairs = (list(itertools.product(vals, repeat=2)) * 2)[:LANES]
    a = np.array([[x & M32, x >> 32] for x, _ in pairs], np.uint32)
    b = np.array([[y & M32, y >> 32] for _, y in pairs], np.uint32)
    view = (lambda v: sx(v, 64)) if ty == "i64" else (lambda v: v)
    for cond in ("lt", "gt", "ne", "ge", "le", "eq"):
        _, m = VALU[f"v_cmp_{cond}_{ty}"](CTX, a, b)
        assert list(m) == [I_CMP[cond](view(x), view(y)) for x, y in pairs], (ty, cond)


CLASS_F32 = [SNAN, QNAN, 0xFF800000, f32_bits(-1.0), 0x80000001, 0x80000000, 0, 1,
             f32_bits(1.0), 0x7F800000]  # class k is CLASS_F32[k]  # fmt: skip
CLASS_F16 = [0x7C01, 0x7E00, 0xFC00, 0xBC00, 0x8001, 0x8000, 0, 1, 0x3C00, 0x7C00]


@pytest.mark.parametrize(("ty", "vals"), [("f32", CLASS_F32), ("f16", CLASS_F16)])
def test_cmp_class_each_class_answers_its_bit_only(ty, vals):
    for k, v in enumerate(vals):
        for bit in range(10):
            assert one(f"v_cmp_class_{ty}", v, 1 << bit) == (None, bit == k), (hex(v), bit)
        assert one(f"v_cmp_class_{ty}", v, 0x3FF) == (None, True)
        assert one(f"v_cmp_class_{ty}", v, 0) == (None, False)


def test_cmp_class_f64():
    snan = (1, 0x7FF00000)
    neg_denorm = (1, 0x80000000)
    assert one("v_cmp_class_f64", snan, 1) == (None, True)
    assert one("v_cmp_class_f64", neg_denorm, 1 << 4) == (None, True)
    assert one("v_cmp_class_f64", neg_denorm, 1 << 7) == (None, False)


# --------------------------------------------------------------------- packed f32
def test_packed_f32_ops_work_per_column():
    x = RNG.standard_normal((3, LANES, 2)).astype(np.float32)
    a, b, c = (np.ascontiguousarray(v).view(np.uint32) for v in x)
    got = VALU["v_pk_add_f32"](CTX, a, b).view(np.float32)
    assert got.shape == (LANES, 2) and np.array_equal(got, x[0] + x[1])
    got = VALU["v_pk_mul_f32"](CTX, a, b).view(np.float32)
    assert np.array_equal(got, x[0] * x[1])
    got = VALU["v_pk_fma_f32"](CTX, a, b, c)
    for k in (0, 1):
        want = [
            fma_ref(int(p), int(q), int(r))
            for p, q, r in zip(a[:, k], b[:, k], c[:, k], strict=True)
        ]
        assert [int(g) for g in got[:, k]] == want
    got = VALU["v_pk_mov_b32"](CTX, a, b)
    assert np.array_equal(got[:, 0], a[:, 0]) and np.array_equal(got[:, 1], b[:, 0])


def test_packed_op_rejects_a_32bit_source():
    with pytest.raises(ValueError, match=r"\(64, 2\)"):
        VALU["v_pk_add_f32"](CTX, lanes([0] * LANES), lanes([0] * LANES))


# --------------------------------------------------------------------- the shipped kernels
# Opcodes whose semantics live elsewhere: mono_aot.emulator.numerics (8/16-bit float conversions
# and packing, transcendentals, division helpers, MFMA) and the executor (lane-crossing).
EXECUTOR_OWNED = {"v_readfirstlane_b32", "v_readlane_b32", "v_writelane_b32", "v_mbcnt_lo_u32_b32",
                  "v_mbcnt_hi_u32_b32", "v_permlane16_swap_b32", "v_permlane32_swap_b32",
                  "v_nop"}  # fmt: skip
NUMERICS_OWNED = {"v_exp_f32", "v_log_f32", "v_rcp_f32", "v_rcp_iflag_f32", "v_rsq_f32",
                  "v_sqrt_f32", "v_sin_f32", "v_cos_f32", "v_div_scale_f32", "v_div_fmas_f32",
                  "v_div_fixup_f32"}  # fmt: skip
SMALL_FLOATS = ("fp8", "bf8", "bf16", "f16")


def owner(base: str) -> str:
    if base in EXECUTOR_OWNED:
        return "executor"
    if base in NUMERICS_OWNED or base.startswith("v_mfma"):
        return "numerics"
    if base.startswith("v_cvt") and any(f in base.split("_")[2:] for f in SMALL_FLOATS):
        return "numerics"
    if base.startswith("v_cvt_scalef32") or base == "v_cvt_pkrtz_f16_f32":
        return "numerics"
    return "valu"


def test_no_entry_belongs_to_the_numerics_or_the_executor():
    assert [n for n in VALU if owner(n) != "valu"] == []
    assert owner("v_cvt_pk_fp8_f32") == owner("v_cvt_pk_bf16_f32") == "numerics"
    assert owner("v_cvt_f32_u32") == "valu"


VALU_FORMATS = {"VOP1", "VOP2", "VOPC", "VOP3", "VOP3P", "SDWA"}


def _shipped_code_objects() -> dict[tuple[str, str], bytes]:
    root = os.environ.get("MONO_AOT_TEST_STORE")
    if not root or not Path(root).is_dir():
        pytest.skip(
            "needs MONO_AOT_TEST_STORE: a store with the shipped layout's kernels for gfx942 "
            "and gfx950 (mono-aot build --arch gfx942 --arch gfx950 --store DIR)"
        )
    from mono_aot.keys import served_key
    from mono_aot.spec.layouts import resolve_layout
    from mono_aot.store.store import Store

    lay = resolve_layout("minimax-m3.1-dspark-tp4")
    store = Store.at(root, writable=False)
    out, missing = {}, []
    for arch in ("gfx942", "gfx950"):
        for variant in ("narrow", "wide"):
            hit = store.lookup(served_key(variant, lay, arch))
            if hit is None:
                missing.append(f"{variant}/{arch}")
            else:
                out[(variant, arch)] = hit.data
    if missing:
        pytest.skip(f"MONO_AOT_TEST_STORE={root} lacks {', '.join(missing)} of the shipped layout")
    return out


@pytest.fixture(
    scope="module", params=["test-store", pytest.param("session-compile", marks=pytest.mark.slow)]
)
def shipped_kernels(request):
    """The four shipped kernels, decoded: from ``MONO_AOT_TEST_STORE`` (fast; skipped with the
    reason when absent), and from the session's one compile of them (``shipped`` in
    ``tests/emulator/conftest.py``, shared with the decoder's self-check; marked slow), so a fresh
    clone's ``make test`` checks the table even before a store exists."""
    from mono_aot.emulator.decode import decode_kernel

    if request.param == "test-store":
        objs = _shipped_code_objects()
    else:
        objs = {case: r.code_object for case, r in request.getfixturevalue("shipped").items()}
    return {case: decode_kernel(data) for case, data in objs.items()}


def test_every_valu_opcode_of_the_shipped_kernels_has_an_entry(shipped_kernels):
    seen: dict[str, set[str]] = {}
    for (variant, arch), dk in shipped_kernels.items():
        for inst in dk.instructions:
            if inst.fmt in VALU_FORMATS:
                seen.setdefault(inst.base, set()).add(f"{variant}/{arch}")
    mine = {b for b in seen if owner(b) == "valu"}
    assert len(mine) > 50  # the kernels use many; an empty scan would pass vacuously
    missing = {b: sorted(seen[b]) for b in mine if b not in VALU}
    assert not missing, f"VALU opcodes without an entry (kernels using them): {missing}"


def test_shipped_descriptors_select_the_modelled_float_mode(shipped_kernels):
    for case, dk in shipped_kernels.items():
        d = KernelDescriptor.parse(dk.kernel.descriptor)
        assert (d.ieee_mode, d.float_denorm_mode_32, d.float_round_mode_32) == (1, 3, 0), case
