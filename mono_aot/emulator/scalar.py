"""Scalar ALU semantics (SOP2, SOPK, SOP1, SOPC) on Python integers.

Per the CDNA3 ISA guide ("AMD Instinct MI300 ISA", chapter "Scalar ALU Operations" and the
SOP2/SOPK/SOP1/SOPC opcode descriptions in "Instructions"); CDNA4 is identical for these. An
operation takes its sources as unsigned integers of their width (32 or 64 bits) and the current
SCC, and returns ``(result, scc)``: ``scc`` None leaves SCC unchanged, ``result`` None writes no
destination (compares). The saveexec family needs EXEC and is handled by the executor.
"""

from __future__ import annotations

from collections.abc import Callable

M32 = 0xFFFFFFFF
M64 = (1 << 64) - 1

SOp = Callable[[int, int, int], tuple[int | None, int | None]]


def s32(x: int) -> int:
    """The signed value of 32 bits."""
    x &= M32
    return x - (1 << 32) if x & 0x80000000 else x


def s64(x: int) -> int:
    x &= M64
    return x - (1 << 64) if x >> 63 else x


def _ovf_add(a: int, b: int, d: int) -> int:
    """Signed overflow of a 32-bit add: operands of one sign, a result of the other."""
    return int(((a ^ d) & (b ^ d)) >> 31 & 1)


def _ovf_sub(a: int, b: int, d: int) -> int:
    return int(((a ^ b) & (a ^ d)) >> 31 & 1)


def _add_u32(a, b, c):
    r = a + b
    return r & M32, r >> 32


def _sub_u32(a, b, c):
    return (a - b) & M32, int(b > a)


def _add_i32(a, b, c):
    d = (a + b) & M32
    return d, _ovf_add(a, b, d)


def _sub_i32(a, b, c):
    d = (a - b) & M32
    return d, _ovf_sub(a, b, d)


def _addc(a, b, c):
    r = a + b + c
    return r & M32, r >> 32


def _subb(a, b, c):
    return (a - b - c) & M32, int(b + c > a)


def _nz32(d: int) -> tuple[int, int]:
    return d & M32, int(d & M32 != 0)


def _nz64(d: int) -> tuple[int, int]:
    return d & M64, int(d & M64 != 0)


def _bfe32(a: int, b: int, signed: bool) -> tuple[int, int]:
    off, width = b & 31, (b >> 16) & 0x7F
    if width == 0:
        return 0, 0
    v = (a >> off) & ((1 << width) - 1)
    if signed and width < 32 and v >> (width - 1) & 1:
        v -= 1 << width
    return _nz32(v)


def _bfe64(a: int, b: int, signed: bool) -> tuple[int, int]:
    off, width = b & 63, (b >> 16) & 0x7F
    if width == 0:
        return 0, 0
    v = (a >> off) & ((1 << width) - 1)
    if signed and width < 64 and v >> (width - 1) & 1:
        v -= 1 << width
    return _nz64(v)


def _lshl_add(n: int) -> SOp:
    def f(a, b, c):
        r = ((a << n) & M32) + b
        # "SCC = carry out" of the shift-and-add (CDNA3 S_LSHL1_ADD_U32 .. S_LSHL4_ADD_U32)
        return r & M32, int(r >> 32 != 0 or (a << n) >> 32 != 0)

    return f


def _ff1(x: int, bits: int) -> int:
    if x == 0:
        return M32  # -1: no bit found
    return (x & -x).bit_length() - 1


def _flbit(x: int, bits: int) -> int:
    if x == 0:
        return M32
    return bits - x.bit_length()


def _brev(x: int, bits: int) -> int:
    return int(f"{x:0{bits}b}"[::-1], 2)


def _quadmask(x: int, bits: int) -> int:
    r = 0
    for i in range(bits // 4):
        if (x >> (4 * i)) & 0xF:
            r |= 1 << i
    return r


def _wqm(x: int, bits: int) -> int:
    r = 0
    for i in range(bits // 4):
        if (x >> (4 * i)) & 0xF:
            r |= 0xF << (4 * i)
    return r


def _cmp(fn: Callable[[int, int], bool]) -> SOp:
    return lambda a, b, c: (None, int(fn(a, b)))


SOP2: dict[str, SOp] = {
    "s_add_u32": _add_u32,
    "s_sub_u32": _sub_u32,
    "s_add_i32": _add_i32,
    "s_sub_i32": _sub_i32,
    "s_addc_u32": _addc,
    "s_subb_u32": _subb,
    "s_min_i32": lambda a, b, c: (a if s32(a) < s32(b) else b, int(s32(a) < s32(b))),
    "s_min_u32": lambda a, b, c: (a if a < b else b, int(a < b)),
    "s_max_i32": lambda a, b, c: (a if s32(a) > s32(b) else b, int(s32(a) > s32(b))),
    "s_max_u32": lambda a, b, c: (a if a > b else b, int(a > b)),
    "s_cselect_b32": lambda a, b, c: (a if c else b, None),
    "s_cselect_b64": lambda a, b, c: (a if c else b, None),
    "s_and_b32": lambda a, b, c: _nz32(a & b),
    "s_and_b64": lambda a, b, c: _nz64(a & b),
    "s_or_b32": lambda a, b, c: _nz32(a | b),
    "s_or_b64": lambda a, b, c: _nz64(a | b),
    "s_xor_b32": lambda a, b, c: _nz32(a ^ b),
    "s_xor_b64": lambda a, b, c: _nz64(a ^ b),
    "s_andn2_b32": lambda a, b, c: _nz32(a & ~b),
    "s_andn2_b64": lambda a, b, c: _nz64(a & ~b),
    "s_orn2_b32": lambda a, b, c: _nz32(a | ~b),
    "s_orn2_b64": lambda a, b, c: _nz64(a | ~b),
    "s_nand_b32": lambda a, b, c: _nz32(~(a & b)),
    "s_nand_b64": lambda a, b, c: _nz64(~(a & b)),
    "s_nor_b32": lambda a, b, c: _nz32(~(a | b)),
    "s_nor_b64": lambda a, b, c: _nz64(~(a | b)),
    "s_xnor_b32": lambda a, b, c: _nz32(~(a ^ b)),
    "s_xnor_b64": lambda a, b, c: _nz64(~(a ^ b)),
    "s_lshl_b32": lambda a, b, c: _nz32(a << (b & 31)),
    "s_lshl_b64": lambda a, b, c: _nz64(a << (b & 63)),
    "s_lshr_b32": lambda a, b, c: _nz32(a >> (b & 31)),
    "s_lshr_b64": lambda a, b, c: _nz64(a >> (b & 63)),
    "s_ashr_i32": lambda a, b, c: _nz32(s32(a) >> (b & 31)),
    "s_ashr_i64": lambda a, b, c: _nz64(s64(a) >> (b & 63)),
    "s_bfm_b32": lambda a, b, c: ((((1 << (a & 31)) - 1) << (b & 31)) & M32, None),
    "s_bfm_b64": lambda a, b, c: ((((1 << (a & 63)) - 1) << (b & 63)) & M64, None),
    "s_mul_i32": lambda a, b, c: ((s32(a) * s32(b)) & M32, None),
    "s_bfe_u32": lambda a, b, c: _bfe32(a, b, False),
    "s_bfe_i32": lambda a, b, c: _bfe32(a, b, True),
    "s_bfe_u64": lambda a, b, c: _bfe64(a, b, False),
    "s_bfe_i64": lambda a, b, c: _bfe64(a, b, True),
    "s_absdiff_i32": lambda a, b, c: _nz32(abs(s32(a) - s32(b))),
    "s_mul_hi_u32": lambda a, b, c: ((a * b) >> 32, None),
    "s_mul_hi_i32": lambda a, b, c: (((s32(a) * s32(b)) >> 32) & M32, None),
    "s_lshl1_add_u32": _lshl_add(1),
    "s_lshl2_add_u32": _lshl_add(2),
    "s_lshl3_add_u32": _lshl_add(3),
    "s_lshl4_add_u32": _lshl_add(4),
    "s_pack_ll_b32_b16": lambda a, b, c: ((a & 0xFFFF) | (b & 0xFFFF) << 16, None),
    "s_pack_lh_b32_b16": lambda a, b, c: ((a & 0xFFFF) | (b & 0xFFFF0000), None),
    "s_pack_hh_b32_b16": lambda a, b, c: ((a >> 16) | (b & 0xFFFF0000), None),
}

# SOPK: ``a`` is the destination register's value, ``b`` the 16-bit immediate (raw)
SOPK: dict[str, SOp] = {
    "s_movk_i32": lambda a, b, c: (s16(b) & M32, None),
    "s_cmovk_i32": lambda a, b, c: ((s16(b) & M32) if c else a, None),
    "s_cmpk_eq_i32": _cmp(lambda a, b: s32(a) == s16(b)),
    "s_cmpk_lg_i32": _cmp(lambda a, b: s32(a) != s16(b)),
    "s_cmpk_gt_i32": _cmp(lambda a, b: s32(a) > s16(b)),
    "s_cmpk_ge_i32": _cmp(lambda a, b: s32(a) >= s16(b)),
    "s_cmpk_lt_i32": _cmp(lambda a, b: s32(a) < s16(b)),
    "s_cmpk_le_i32": _cmp(lambda a, b: s32(a) <= s16(b)),
    "s_cmpk_eq_u32": _cmp(lambda a, b: a == b),
    "s_cmpk_lg_u32": _cmp(lambda a, b: a != b),
    "s_cmpk_gt_u32": _cmp(lambda a, b: a > b),
    "s_cmpk_ge_u32": _cmp(lambda a, b: a >= b),
    "s_cmpk_lt_u32": _cmp(lambda a, b: a < b),
    "s_cmpk_le_u32": _cmp(lambda a, b: a <= b),
    "s_addk_i32": lambda a, b, c: _add_i32(a, s16(b) & M32, c),
    "s_mulk_i32": lambda a, b, c: ((s32(a) * s16(b)) & M32, None),
}


def s16(x: int) -> int:
    x &= 0xFFFF
    return x - 0x10000 if x & 0x8000 else x


# SOP1: ``a`` the source, ``c`` SCC (``b`` unused); 64-bit forms take/return 64-bit values
SOP1: dict[str, SOp] = {
    "s_mov_b32": lambda a, b, c: (a, None),
    "s_mov_b64": lambda a, b, c: (a, None),
    "s_cmov_b32": lambda a, b, c: (a if c else b, None),  # b: the old destination
    "s_cmov_b64": lambda a, b, c: (a if c else b, None),
    "s_not_b32": lambda a, b, c: _nz32(~a),
    "s_not_b64": lambda a, b, c: _nz64(~a),
    "s_wqm_b32": lambda a, b, c: _nz32(_wqm(a, 32)),
    "s_wqm_b64": lambda a, b, c: _nz64(_wqm(a, 64)),
    "s_brev_b32": lambda a, b, c: (_brev(a, 32), None),
    "s_brev_b64": lambda a, b, c: (_brev(a, 64), None),
    "s_bcnt0_i32_b32": lambda a, b, c: _nz32(32 - bin(a).count("1")),
    "s_bcnt0_i32_b64": lambda a, b, c: _nz32(64 - bin(a).count("1")),
    "s_bcnt1_i32_b32": lambda a, b, c: _nz32(bin(a).count("1")),
    "s_bcnt1_i32_b64": lambda a, b, c: _nz32(bin(a).count("1")),
    "s_ff0_i32_b32": lambda a, b, c: (_ff1(~a & M32, 32), None),
    "s_ff0_i32_b64": lambda a, b, c: (_ff1(~a & M64, 64), None),
    "s_ff1_i32_b32": lambda a, b, c: (_ff1(a, 32), None),
    "s_ff1_i32_b64": lambda a, b, c: (_ff1(a, 64), None),
    "s_flbit_i32_b32": lambda a, b, c: (_flbit(a, 32), None),
    "s_flbit_i32_b64": lambda a, b, c: (_flbit(a, 64), None),
    "s_sext_i32_i8": lambda a, b, c: (((a & 0xFF) ^ 0x80) - 0x80 & M32, None),
    "s_sext_i32_i16": lambda a, b, c: (s16(a) & M32, None),
    "s_bitset0_b32": lambda a, b, c: (b & ~(1 << (a & 31)) & M32, None),
    "s_bitset0_b64": lambda a, b, c: (b & ~(1 << (a & 63)) & M64, None),
    "s_bitset1_b32": lambda a, b, c: (b | (1 << (a & 31)), None),
    "s_bitset1_b64": lambda a, b, c: (b | (1 << (a & 63)), None),
    "s_quadmask_b32": lambda a, b, c: _nz32(_quadmask(a, 32)),
    "s_quadmask_b64": lambda a, b, c: _nz64(_quadmask(a, 64)),
    "s_abs_i32": lambda a, b, c: _nz32(abs(s32(a))),
}
# SOP1 opcodes whose result depends on the old destination (passed as ``b``)
SOP1_READS_DST = {"s_cmov_b32", "s_cmov_b64", "s_bitset0_b32", "s_bitset0_b64",
                  "s_bitset1_b32", "s_bitset1_b64"}  # fmt: skip

# saveexec: (s0, exec) -> new exec; the destination receives the old EXEC (CDNA3 S_*_SAVEEXEC)
SAVEEXEC: dict[str, Callable[[int, int], int]] = {
    "s_and_saveexec_b64": lambda s, e: s & e,
    "s_or_saveexec_b64": lambda s, e: s | e,
    "s_xor_saveexec_b64": lambda s, e: s ^ e,
    "s_andn2_saveexec_b64": lambda s, e: s & ~e & M64,
    "s_orn2_saveexec_b64": lambda s, e: (s | ~e) & M64,
    "s_nand_saveexec_b64": lambda s, e: ~(s & e) & M64,
    "s_nor_saveexec_b64": lambda s, e: ~(s | e) & M64,
    "s_xnor_saveexec_b64": lambda s, e: ~(s ^ e) & M64,
    "s_andn1_saveexec_b64": lambda s, e: ~s & e & M64,
    "s_orn1_saveexec_b64": lambda s, e: (~s | e) & M64,
}
# wrexec: EXEC = f(s0, exec) and the destination receives the NEW EXEC
WREXEC: dict[str, Callable[[int, int], int]] = {
    "s_andn1_wrexec_b64": lambda s, e: ~s & e & M64,
    "s_andn2_wrexec_b64": lambda s, e: s & ~e & M64,
}

SOPC: dict[str, SOp] = {
    "s_cmp_eq_i32": _cmp(lambda a, b: a == b),
    "s_cmp_lg_i32": _cmp(lambda a, b: a != b),
    "s_cmp_gt_i32": _cmp(lambda a, b: s32(a) > s32(b)),
    "s_cmp_ge_i32": _cmp(lambda a, b: s32(a) >= s32(b)),
    "s_cmp_lt_i32": _cmp(lambda a, b: s32(a) < s32(b)),
    "s_cmp_le_i32": _cmp(lambda a, b: s32(a) <= s32(b)),
    "s_cmp_eq_u32": _cmp(lambda a, b: a == b),
    "s_cmp_lg_u32": _cmp(lambda a, b: a != b),
    "s_cmp_gt_u32": _cmp(lambda a, b: a > b),
    "s_cmp_ge_u32": _cmp(lambda a, b: a >= b),
    "s_cmp_lt_u32": _cmp(lambda a, b: a < b),
    "s_cmp_le_u32": _cmp(lambda a, b: a <= b),
    "s_bitcmp0_b32": _cmp(lambda a, b: not (a >> (b & 31)) & 1),
    "s_bitcmp1_b32": _cmp(lambda a, b: (a >> (b & 31)) & 1),
    "s_bitcmp0_b64": _cmp(lambda a, b: not (a >> (b & 63)) & 1),
    "s_bitcmp1_b64": _cmp(lambda a, b: (a >> (b & 63)) & 1),
    "s_cmp_eq_u64": _cmp(lambda a, b: a == b),
    "s_cmp_lg_u64": _cmp(lambda a, b: a != b),
}
