"""Opcode tables of the gfx942 (CDNA3) and gfx950 (CDNA4) instruction encodings.

Sources: "AMD Instinct MI300 / CDNA3 Instruction Set Architecture" reference guide, chapter 12
("Microcode Formats") and chapter 13 ("Instructions"), and "AMD Instinct CDNA4 Instruction Set
Architecture" for the gfx950 additions; the assembly names and operand syntax are those of LLVM's
AMDGPU backend (the "AMDGPU Instruction Syntax" and per-target instruction documents of LLVM,
e.g. "Syntax of gfx940 Instructions"). The tables list what the decoder knows; an opcode that is
not here is a decode error (kernel, offset, bits), never skipped.

Operand types (``T``): the width in dwords of a register operand and how a literal prints.
"""

from __future__ import annotations

from dataclasses import dataclass

# operand type -> dwords
WIDTH = {
    "b16": 1, "f16": 1, "b32": 1, "f32": 1, "b64": 2, "f64": 2, "pf32": 2,
    "x2": 2, "x3": 3, "x4": 4, "x8": 8, "x16": 16,
}  # fmt: skip


@dataclass(frozen=True)
class Op:
    """One opcode: its assembly name, operand types and the variant of its format.

    ``dst``/``srcs`` are operand types (see ``WIDTH``); ``kind`` names a special operand list
    (e.g. carry-out ``vcc``), ``e32`` whether the 32-bit form prints an ``_e32`` suffix (LLVM
    prints it for VOP1/VOP2/VOPC opcodes that also have a VOP3 form).
    """

    name: str
    dst: str | None = "b32"
    srcs: tuple[str, ...] = ()
    kind: str = ""
    e32: bool = True
    opsel_dst: bool = False  # VOP3: op_sel[3] selects the destination half (printed last)


def _op(name: str, dst: str | None, *srcs: str, kind: str = "", e32: bool = True,
        opsel_dst: bool = False) -> Op:  # fmt: skip
    return Op(name, dst, tuple(srcs), kind, e32, opsel_dst)


# ---------------------------------------------------------------------------------- SOP2
SOP2 = {
    0: _op("s_add_u32", "b32", "b32", "b32"),
    1: _op("s_sub_u32", "b32", "b32", "b32"),
    2: _op("s_add_i32", "b32", "b32", "b32"),
    3: _op("s_sub_i32", "b32", "b32", "b32"),
    4: _op("s_addc_u32", "b32", "b32", "b32"),
    5: _op("s_subb_u32", "b32", "b32", "b32"),
    6: _op("s_min_i32", "b32", "b32", "b32"),
    7: _op("s_min_u32", "b32", "b32", "b32"),
    8: _op("s_max_i32", "b32", "b32", "b32"),
    9: _op("s_max_u32", "b32", "b32", "b32"),
    10: _op("s_cselect_b32", "b32", "b32", "b32"),
    11: _op("s_cselect_b64", "b64", "b64", "b64"),
    12: _op("s_and_b32", "b32", "b32", "b32"),
    13: _op("s_and_b64", "b64", "b64", "b64"),
    14: _op("s_or_b32", "b32", "b32", "b32"),
    15: _op("s_or_b64", "b64", "b64", "b64"),
    16: _op("s_xor_b32", "b32", "b32", "b32"),
    17: _op("s_xor_b64", "b64", "b64", "b64"),
    18: _op("s_andn2_b32", "b32", "b32", "b32"),
    19: _op("s_andn2_b64", "b64", "b64", "b64"),
    20: _op("s_orn2_b32", "b32", "b32", "b32"),
    21: _op("s_orn2_b64", "b64", "b64", "b64"),
    22: _op("s_nand_b32", "b32", "b32", "b32"),
    23: _op("s_nand_b64", "b64", "b64", "b64"),
    24: _op("s_nor_b32", "b32", "b32", "b32"),
    25: _op("s_nor_b64", "b64", "b64", "b64"),
    26: _op("s_xnor_b32", "b32", "b32", "b32"),
    27: _op("s_xnor_b64", "b64", "b64", "b64"),
    28: _op("s_lshl_b32", "b32", "b32", "b32"),
    29: _op("s_lshl_b64", "b64", "b64", "b32"),
    30: _op("s_lshr_b32", "b32", "b32", "b32"),
    31: _op("s_lshr_b64", "b64", "b64", "b32"),
    32: _op("s_ashr_i32", "b32", "b32", "b32"),
    33: _op("s_ashr_i64", "b64", "b64", "b32"),
    34: _op("s_bfm_b32", "b32", "b32", "b32"),
    35: _op("s_bfm_b64", "b64", "b32", "b32"),
    36: _op("s_mul_i32", "b32", "b32", "b32"),
    37: _op("s_bfe_u32", "b32", "b32", "b32"),
    38: _op("s_bfe_i32", "b32", "b32", "b32"),
    39: _op("s_bfe_u64", "b64", "b64", "b32"),
    40: _op("s_bfe_i64", "b64", "b64", "b32"),
    42: _op("s_absdiff_i32", "b32", "b32", "b32"),
    44: _op("s_mul_hi_u32", "b32", "b32", "b32"),
    45: _op("s_mul_hi_i32", "b32", "b32", "b32"),
    46: _op("s_lshl1_add_u32", "b32", "b32", "b32"),
    47: _op("s_lshl2_add_u32", "b32", "b32", "b32"),
    48: _op("s_lshl3_add_u32", "b32", "b32", "b32"),
    49: _op("s_lshl4_add_u32", "b32", "b32", "b32"),
    50: _op("s_pack_ll_b32_b16", "b32", "b32", "b32"),
    51: _op("s_pack_lh_b32_b16", "b32", "b32", "b32"),
    52: _op("s_pack_hh_b32_b16", "b32", "b32", "b32"),
}

# ---------------------------------------------------------------------------------- SOPK
SOPK = {
    0: _op("s_movk_i32", "b32"),
    1: _op("s_cmovk_i32", "b32"),
    2: _op("s_cmpk_eq_i32", "b32", kind="cmp"),
    3: _op("s_cmpk_lg_i32", "b32", kind="cmp"),
    4: _op("s_cmpk_gt_i32", "b32", kind="cmp"),
    5: _op("s_cmpk_ge_i32", "b32", kind="cmp"),
    6: _op("s_cmpk_lt_i32", "b32", kind="cmp"),
    7: _op("s_cmpk_le_i32", "b32", kind="cmp"),
    8: _op("s_cmpk_eq_u32", "b32", kind="cmp"),
    9: _op("s_cmpk_lg_u32", "b32", kind="cmp"),
    10: _op("s_cmpk_gt_u32", "b32", kind="cmp"),
    11: _op("s_cmpk_ge_u32", "b32", kind="cmp"),
    12: _op("s_cmpk_lt_u32", "b32", kind="cmp"),
    13: _op("s_cmpk_le_u32", "b32", kind="cmp"),
    14: _op("s_addk_i32", "b32"),
    15: _op("s_mulk_i32", "b32"),
}

# ---------------------------------------------------------------------------------- SOP1
SOP1 = {
    0: _op("s_mov_b32", "b32", "b32"),
    1: _op("s_mov_b64", "b64", "b64"),
    2: _op("s_cmov_b32", "b32", "b32"),
    3: _op("s_cmov_b64", "b64", "b64"),
    4: _op("s_not_b32", "b32", "b32"),
    5: _op("s_not_b64", "b64", "b64"),
    6: _op("s_wqm_b32", "b32", "b32"),
    7: _op("s_wqm_b64", "b64", "b64"),
    8: _op("s_brev_b32", "b32", "b32"),
    9: _op("s_brev_b64", "b64", "b64"),
    10: _op("s_bcnt0_i32_b32", "b32", "b32"),
    11: _op("s_bcnt0_i32_b64", "b32", "b64"),
    12: _op("s_bcnt1_i32_b32", "b32", "b32"),
    13: _op("s_bcnt1_i32_b64", "b32", "b64"),
    14: _op("s_ff0_i32_b32", "b32", "b32"),
    15: _op("s_ff0_i32_b64", "b32", "b64"),
    16: _op("s_ff1_i32_b32", "b32", "b32"),
    17: _op("s_ff1_i32_b64", "b32", "b64"),
    18: _op("s_flbit_i32_b32", "b32", "b32"),
    19: _op("s_flbit_i32_b64", "b32", "b64"),
    20: _op("s_flbit_i32", "b32", "b32"),
    21: _op("s_flbit_i32_i64", "b32", "b64"),
    22: _op("s_sext_i32_i8", "b32", "b32"),
    23: _op("s_sext_i32_i16", "b32", "b32"),
    24: _op("s_bitset0_b32", "b32", "b32"),
    25: _op("s_bitset0_b64", "b64", "b32"),
    26: _op("s_bitset1_b32", "b32", "b32"),
    27: _op("s_bitset1_b64", "b64", "b32"),
    28: _op("s_getpc_b64", "b64"),
    29: _op("s_setpc_b64", None, "b64"),  # LLVM's long branch: s_getpc, s_add(c)_u32, s_setpc
    32: _op("s_and_saveexec_b64", "b64", "b64"),
    33: _op("s_or_saveexec_b64", "b64", "b64"),
    34: _op("s_xor_saveexec_b64", "b64", "b64"),
    35: _op("s_andn2_saveexec_b64", "b64", "b64"),
    36: _op("s_orn2_saveexec_b64", "b64", "b64"),
    37: _op("s_nand_saveexec_b64", "b64", "b64"),
    38: _op("s_nor_saveexec_b64", "b64", "b64"),
    39: _op("s_xnor_saveexec_b64", "b64", "b64"),
    40: _op("s_quadmask_b32", "b32", "b32"),
    41: _op("s_quadmask_b64", "b64", "b64"),
    48: _op("s_abs_i32", "b32", "b32"),
    51: _op("s_andn1_saveexec_b64", "b64", "b64"),
    52: _op("s_orn1_saveexec_b64", "b64", "b64"),
    53: _op("s_andn1_wrexec_b64", "b64", "b64"),
    54: _op("s_andn2_wrexec_b64", "b64", "b64"),
    55: _op("s_bitreplicate_b64_b32", "b64", "b32"),
}

# ---------------------------------------------------------------------------------- SOPC
SOPC = {
    0: _op("s_cmp_eq_i32", None, "b32", "b32"),
    1: _op("s_cmp_lg_i32", None, "b32", "b32"),
    2: _op("s_cmp_gt_i32", None, "b32", "b32"),
    3: _op("s_cmp_ge_i32", None, "b32", "b32"),
    4: _op("s_cmp_lt_i32", None, "b32", "b32"),
    5: _op("s_cmp_le_i32", None, "b32", "b32"),
    6: _op("s_cmp_eq_u32", None, "b32", "b32"),
    7: _op("s_cmp_lg_u32", None, "b32", "b32"),
    8: _op("s_cmp_gt_u32", None, "b32", "b32"),
    9: _op("s_cmp_ge_u32", None, "b32", "b32"),
    10: _op("s_cmp_lt_u32", None, "b32", "b32"),
    11: _op("s_cmp_le_u32", None, "b32", "b32"),
    12: _op("s_bitcmp0_b32", None, "b32", "b32"),
    13: _op("s_bitcmp1_b32", None, "b32", "b32"),
    14: _op("s_bitcmp0_b64", None, "b64", "b32"),
    15: _op("s_bitcmp1_b64", None, "b64", "b32"),
    18: _op("s_cmp_eq_u64", None, "b64", "b64"),
    19: _op("s_cmp_lg_u64", None, "b64", "b64"),
}

# ---------------------------------------------------------------------------------- SOPP
# kind: "" no operand, "imm" a decimal count, "branch" a pc-relative target, "waitcnt"
SOPP = {
    0: _op("s_nop", None, kind="imm"),
    1: _op("s_endpgm", None),
    2: _op("s_branch", None, kind="branch"),
    3: _op("s_wakeup", None),
    4: _op("s_cbranch_scc0", None, kind="branch"),
    5: _op("s_cbranch_scc1", None, kind="branch"),
    6: _op("s_cbranch_vccz", None, kind="branch"),
    7: _op("s_cbranch_vccnz", None, kind="branch"),
    8: _op("s_cbranch_execz", None, kind="branch"),
    9: _op("s_cbranch_execnz", None, kind="branch"),
    10: _op("s_barrier", None),
    12: _op("s_waitcnt", None, kind="waitcnt"),
    14: _op("s_sleep", None, kind="imm"),
    15: _op("s_setprio", None, kind="imm"),
    19: _op("s_icache_inv", None),
}

# ---------------------------------------------------------------------------------- SMEM
# kind: "load" (sdata <- memory), "time" (sdata only), "none" (no operands)
SMEM = {
    0: _op("s_load_dword", "b32", kind="load"),
    1: _op("s_load_dwordx2", "x2", kind="load"),
    2: _op("s_load_dwordx4", "x4", kind="load"),
    3: _op("s_load_dwordx8", "x8", kind="load"),
    4: _op("s_load_dwordx16", "x16", kind="load"),
    32: _op("s_dcache_inv", None, kind="none"),
    33: _op("s_dcache_wb", None, kind="none"),
    34: _op("s_dcache_inv_vol", None, kind="none"),
    35: _op("s_dcache_wb_vol", None, kind="none"),
    36: _op("s_memtime", "b64", kind="time"),
    37: _op("s_memrealtime", "b64", kind="time"),
}

# ---------------------------------------------------------------------------------- VOP2
# kind: "cndmask" (reads vcc), "carryout" (writes vcc), "carry" (reads and writes vcc),
# "mac" (vdst is also an input), "madmk"/"madak" (a literal operand)
VOP2 = {
    0: _op("v_cndmask_b32", "b32", "b32", "b32", kind="cndmask"),
    1: _op("v_add_f32", "f32", "f32", "f32"),
    2: _op("v_sub_f32", "f32", "f32", "f32"),
    3: _op("v_subrev_f32", "f32", "f32", "f32"),
    5: _op("v_mul_f32", "f32", "f32", "f32"),
    6: _op("v_mul_i32_i24", "b32", "b32", "b32"),
    7: _op("v_mul_hi_i32_i24", "b32", "b32", "b32"),
    8: _op("v_mul_u32_u24", "b32", "b32", "b32"),
    9: _op("v_mul_hi_u32_u24", "b32", "b32", "b32"),
    10: _op("v_min_f32", "f32", "f32", "f32"),
    11: _op("v_max_f32", "f32", "f32", "f32"),
    12: _op("v_min_i32", "b32", "b32", "b32"),
    13: _op("v_max_i32", "b32", "b32", "b32"),
    14: _op("v_min_u32", "b32", "b32", "b32"),
    15: _op("v_max_u32", "b32", "b32", "b32"),
    16: _op("v_lshrrev_b32", "b32", "b32", "b32"),
    17: _op("v_ashrrev_i32", "b32", "b32", "b32"),
    18: _op("v_lshlrev_b32", "b32", "b32", "b32"),
    19: _op("v_and_b32", "b32", "b32", "b32"),
    20: _op("v_or_b32", "b32", "b32", "b32"),
    21: _op("v_xor_b32", "b32", "b32", "b32"),
    25: _op("v_add_co_u32", "b32", "b32", "b32", kind="carryout"),
    26: _op("v_sub_co_u32", "b32", "b32", "b32", kind="carryout"),
    27: _op("v_subrev_co_u32", "b32", "b32", "b32", kind="carryout"),
    28: _op("v_addc_co_u32", "b32", "b32", "b32", kind="carry"),
    29: _op("v_subb_co_u32", "b32", "b32", "b32", kind="carry"),
    30: _op("v_subbrev_co_u32", "b32", "b32", "b32", kind="carry"),
    31: _op("v_add_f16", "f16", "f16", "f16"),
    32: _op("v_sub_f16", "f16", "f16", "f16"),
    33: _op("v_subrev_f16", "f16", "f16", "f16"),
    34: _op("v_mul_f16", "f16", "f16", "f16"),
    38: _op("v_add_u16", "b16", "b16", "b16"),
    39: _op("v_sub_u16", "b16", "b16", "b16"),
    40: _op("v_subrev_u16", "b16", "b16", "b16"),
    41: _op("v_mul_lo_u16", "b16", "b16", "b16"),
    42: _op("v_lshlrev_b16", "b16", "b16", "b16"),
    43: _op("v_lshrrev_b16", "b16", "b16", "b16"),
    44: _op("v_ashrrev_i16", "b16", "b16", "b16"),
    45: _op("v_max_f16", "f16", "f16", "f16"),
    46: _op("v_min_f16", "f16", "f16", "f16"),
    47: _op("v_max_u16", "b16", "b16", "b16"),
    48: _op("v_max_i16", "b16", "b16", "b16"),
    49: _op("v_min_u16", "b16", "b16", "b16"),
    50: _op("v_min_i16", "b16", "b16", "b16"),
    52: _op("v_add_u32", "b32", "b32", "b32"),
    53: _op("v_sub_u32", "b32", "b32", "b32"),
    54: _op("v_subrev_u32", "b32", "b32", "b32"),
    59: _op("v_fmac_f32", "f32", "f32", "f32", kind="mac"),
    61: _op("v_xnor_b32", "b32", "b32", "b32"),
}

# ---------------------------------------------------------------------------------- VOP1
VOP1 = {
    0: _op("v_nop", None),
    1: _op("v_mov_b32", "b32", "b32"),
    2: _op("v_readfirstlane_b32", "b32", "b32", kind="readlane", e32=False),
    3: _op("v_cvt_i32_f64", "b32", "f64"),
    4: _op("v_cvt_f64_i32", "f64", "b32"),
    5: _op("v_cvt_f32_i32", "f32", "b32"),
    6: _op("v_cvt_f32_u32", "f32", "b32"),
    7: _op("v_cvt_u32_f32", "b32", "f32"),
    8: _op("v_cvt_i32_f32", "b32", "f32"),
    10: _op("v_cvt_f16_f32", "f16", "f32"),
    11: _op("v_cvt_f32_f16", "f32", "f16"),
    12: _op("v_cvt_rpi_i32_f32", "b32", "f32"),
    13: _op("v_cvt_flr_i32_f32", "b32", "f32"),
    15: _op("v_cvt_f32_f64", "f32", "f64"),
    16: _op("v_cvt_f64_f32", "f64", "f32"),
    17: _op("v_cvt_f32_ubyte0", "f32", "b32"),
    18: _op("v_cvt_f32_ubyte1", "f32", "b32"),
    19: _op("v_cvt_f32_ubyte2", "f32", "b32"),
    20: _op("v_cvt_f32_ubyte3", "f32", "b32"),
    27: _op("v_fract_f32", "f32", "f32"),
    28: _op("v_trunc_f32", "f32", "f32"),
    29: _op("v_ceil_f32", "f32", "f32"),
    30: _op("v_rndne_f32", "f32", "f32"),
    31: _op("v_floor_f32", "f32", "f32"),
    32: _op("v_exp_f32", "f32", "f32"),
    33: _op("v_log_f32", "f32", "f32"),
    34: _op("v_rcp_f32", "f32", "f32"),
    35: _op("v_rcp_iflag_f32", "f32", "f32"),
    36: _op("v_rsq_f32", "f32", "f32"),
    39: _op("v_sqrt_f32", "f32", "f32"),
    41: _op("v_sin_f32", "f32", "f32"),
    42: _op("v_cos_f32", "f32", "f32"),
    43: _op("v_not_b32", "b32", "b32"),
    44: _op("v_bfrev_b32", "b32", "b32"),
    45: _op("v_ffbh_u32", "b32", "b32"),
    46: _op("v_ffbl_b32", "b32", "b32"),
    47: _op("v_ffbh_i32", "b32", "b32"),
    51: _op("v_frexp_exp_i32_f32", "b32", "f32"),
    52: _op("v_frexp_mant_f32", "f32", "f32"),
    56: _op("v_mov_b64", "b64", "b64"),
    84: _op("v_cvt_f32_fp8", "f32", "b32"),
    85: _op("v_cvt_f32_bf8", "f32", "b32"),
    86: _op("v_cvt_pk_f32_fp8", "pf32", "b32"),
    87: _op("v_cvt_pk_f32_bf8", "pf32", "b32"),
}
VOP1_GFX950 = {
    89: _op("v_permlane16_swap_b32", "b32", "b32", kind="swap"),
    90: _op("v_permlane32_swap_b32", "b32", "b32", kind="swap"),
}

# ---------------------------------------------------------------------------------- VOPC
_FCMP = ("f", "lt", "eq", "le", "gt", "lg", "ge", "o", "u", "nge", "nlg", "ngt", "nle", "neq",
         "nlt", "tru")  # fmt: skip
_ICMP = ("f", "lt", "eq", "le", "gt", "ne", "ge", "t")


def _vopc() -> dict[int, Op]:
    t: dict[int, Op] = {}
    for x, sfx in ((0, "cmp"), (0x10, "cmpx")):
        for base, ty in ((0x20, "f16"), (0x40, "f32"), (0x60, "f64")):
            for i, c in enumerate(_FCMP):
                t[base + x + i] = _op(f"v_{sfx}_{c}_{ty}", None, ty, ty, kind=sfx)
        for base, ty, w in ((0xA0, "i16", "b16"), (0xA8, "u16", "b16"), (0xC0, "i32", "b32"),
                            (0xC8, "u32", "b32"), (0xE0, "i64", "b64"), (0xE8, "u64", "b64")):  # fmt: skip
            for i, c in enumerate(_ICMP):
                t[base + x + i] = _op(f"v_{sfx}_{c}_{ty}", None, w, w, kind=sfx)
    for i, ty in enumerate(("f32", "f64", "f16")):
        t[0x10 + 2 * i] = _op(f"v_cmp_class_{ty}", None, ty, "b32", kind="cmp")
        t[0x11 + 2 * i] = _op(f"v_cmpx_class_{ty}", None, ty, "b32", kind="cmpx")
    return t


VOPC = _vopc()

# ---------------------------------------------------------------------------------- VOP3
# VOP3-only opcodes (VOPC are 0x000-0x0ff, VOP2 0x100 + op, VOP1 0x140 + op in VOP3 form).
# kind "vop3b": a scalar carry/condition destination (sdst) after vdst.
VOP3 = {
    0x1C0: _op("v_mad_legacy_f32", "f32", "f32", "f32", "f32"),
    0x1C1: _op("v_mad_f32", "f32", "f32", "f32", "f32"),
    0x1C2: _op("v_mad_i32_i24", "b32", "b32", "b32", "b32"),
    0x1C3: _op("v_mad_u32_u24", "b32", "b32", "b32", "b32"),
    0x1C8: _op("v_bfe_u32", "b32", "b32", "b32", "b32"),
    0x1C9: _op("v_bfe_i32", "b32", "b32", "b32", "b32"),
    0x1CA: _op("v_bfi_b32", "b32", "b32", "b32", "b32"),
    0x1CB: _op("v_fma_f32", "f32", "f32", "f32", "f32"),
    0x1CC: _op("v_fma_f64", "f64", "f64", "f64", "f64"),
    0x1CE: _op("v_alignbit_b32", "b32", "b32", "b32", "b32"),
    0x1CF: _op("v_alignbyte_b32", "b32", "b32", "b32", "b32"),
    0x1D0: _op("v_min3_f32", "f32", "f32", "f32", "f32"),
    0x1D1: _op("v_min3_i32", "b32", "b32", "b32", "b32"),
    0x1D2: _op("v_min3_u32", "b32", "b32", "b32", "b32"),
    0x1D3: _op("v_max3_f32", "f32", "f32", "f32", "f32"),
    0x1D4: _op("v_max3_i32", "b32", "b32", "b32", "b32"),
    0x1D5: _op("v_max3_u32", "b32", "b32", "b32", "b32"),
    0x1D6: _op("v_med3_f32", "f32", "f32", "f32", "f32"),
    0x1D7: _op("v_med3_i32", "b32", "b32", "b32", "b32"),
    0x1D8: _op("v_med3_u32", "b32", "b32", "b32", "b32"),
    0x1DE: _op("v_div_fixup_f32", "f32", "f32", "f32", "f32"),
    0x1E0: _op("v_div_scale_f32", "f32", "f32", "f32", "f32", kind="vop3b"),
    0x1E2: _op("v_div_fmas_f32", "f32", "f32", "f32", "f32"),
    0x1E8: _op("v_mad_u64_u32", "b64", "b32", "b32", "b64", kind="vop3b"),
    0x1E9: _op("v_mad_i64_i32", "b64", "b32", "b32", "b64", kind="vop3b"),
    0x1ED: _op("v_perm_b32", "b32", "b32", "b32", "b32"),
    0x1F3: _op("v_xad_u32", "b32", "b32", "b32", "b32"),
    0x1FD: _op("v_lshl_add_u32", "b32", "b32", "b32", "b32"),
    0x1FE: _op("v_add_lshl_u32", "b32", "b32", "b32", "b32"),
    0x1FF: _op("v_add3_u32", "b32", "b32", "b32", "b32"),
    0x200: _op("v_lshl_or_b32", "b32", "b32", "b32", "b32"),
    0x201: _op("v_and_or_b32", "b32", "b32", "b32", "b32"),
    0x202: _op("v_or3_b32", "b32", "b32", "b32", "b32"),
    0x208: _op("v_lshl_add_u64", "b64", "b64", "b32", "b64"),
    0x280: _op("v_add_f64", "f64", "f64", "f64"),
    0x281: _op("v_mul_f64", "f64", "f64", "f64"),
    0x282: _op("v_min_f64", "f64", "f64", "f64"),
    0x283: _op("v_max_f64", "f64", "f64", "f64"),
    0x284: _op("v_ldexp_f64", "f64", "f64", "b32"),
    0x285: _op("v_mul_lo_u32", "b32", "b32", "b32"),
    0x286: _op("v_mul_hi_u32", "b32", "b32", "b32"),
    0x287: _op("v_mul_hi_i32", "b32", "b32", "b32"),
    0x288: _op("v_ldexp_f32", "f32", "f32", "b32"),
    0x289: _op("v_readlane_b32", "b32", "b32", "b32", kind="readlane"),
    0x28A: _op("v_writelane_b32", "b32", "b32", "b32"),
    0x28B: _op("v_bcnt_u32_b32", "b32", "b32", "b32"),
    0x28C: _op("v_mbcnt_lo_u32_b32", "b32", "b32", "b32"),
    0x28D: _op("v_mbcnt_hi_u32_b32", "b32", "b32", "b32"),
    0x28F: _op("v_lshlrev_b64", "b64", "b32", "b64"),
    0x290: _op("v_lshrrev_b64", "b64", "b32", "b64"),
    0x291: _op("v_ashrrev_i64", "b64", "b32", "b64"),
    0x293: _op("v_bfm_b32", "b32", "b32", "b32"),
    0x296: _op("v_cvt_pkrtz_f16_f32", "b32", "f32", "f32"),
    0x2A2: _op("v_cvt_pk_fp8_f32", "b32", "f32", "f32", opsel_dst=True),
    0x2A3: _op("v_cvt_pk_bf8_f32", "b32", "f32", "f32", opsel_dst=True),
}
VOP3_GFX950 = {
    0x268: _op("v_cvt_pk_bf16_f32", "b32", "f32", "f32"),
    0x269: _op("v_cvt_scalef32_pk_bf16_fp8", "b32", "b32", "f32", opsel_dst=True),
}

# ---------------------------------------------------------------------------------- VOP3P
VOP3P = {
    0x30: _op("v_pk_fma_f32", "pf32", "pf32", "pf32", "pf32"),
    0x31: _op("v_pk_mul_f32", "pf32", "pf32", "pf32"),
    0x32: _op("v_pk_add_f32", "pf32", "pf32", "pf32"),
    0x33: _op("v_pk_mov_b32", "b64", "b64", "b64"),
    # moves between the VGPR and AGPR files (LLVM spills VGPRs into AGPRs when a kernel's
    # register budget allows more than 256 of them, e.g. 256-thread workgroups)
    0x58: _op("v_accvgpr_read_b32", "b32", "b32", kind="acc_read"),
    0x59: _op("v_accvgpr_write_b32", "b32", "b32", kind="acc_write"),
}
# MFMA (VOP3P-MAI): dst and srcC are the accumulator tile, srcA/srcB the operand fragments.
MAI_GFX942 = {
    0x61: _op("v_mfma_f32_16x16x16_bf16", "x4", "x2", "x2", "x4", kind="mfma"),
}
MAI_GFX950 = {
    0x35: _op("v_mfma_f32_16x16x32_bf16", "x4", "x4", "x4", "x4", kind="mfma"),
}

# ---------------------------------------------------------------------------------- DS
# kind: "read" vdst, addr; "write" addr, data0; "read2"/"write2" with offset0/offset1;
# "rtn" vdst, addr, data0; "swizzle"; "permute" vdst, addr, data0
DS = {
    0x0D: _op("ds_write_b32", None, "b32", kind="write"),
    0x0E: _op("ds_write2_b32", None, "b32", kind="write2"),
    0x0F: _op("ds_write2st64_b32", None, "b32", kind="write2"),
    0x1E: _op("ds_write_b8", None, "b32", kind="write"),
    0x1F: _op("ds_write_b16", None, "b32", kind="write"),
    0x36: _op("ds_read_b32", "b32", kind="read"),
    0x37: _op("ds_read2_b32", "x2", kind="read2"),
    0x38: _op("ds_read2st64_b32", "x2", kind="read2"),
    0x39: _op("ds_read_i8", "b32", kind="read"),
    0x3A: _op("ds_read_u8", "b32", kind="read"),
    0x3B: _op("ds_read_i16", "b32", kind="read"),
    0x3C: _op("ds_read_u16", "b32", kind="read"),
    0x3D: _op("ds_swizzle_b32", "b32", kind="swizzle"),
    0x3E: _op("ds_permute_b32", "b32", "b32", kind="permute"),
    0x3F: _op("ds_bpermute_b32", "b32", "b32", kind="permute"),
    0x4D: _op("ds_write_b64", None, "x2", kind="write"),
    0x4E: _op("ds_write2_b64", None, "x2", kind="write2"),
    0x4F: _op("ds_write2st64_b64", None, "x2", kind="write2"),
    0x76: _op("ds_read_b64", "x2", kind="read"),
    0x77: _op("ds_read2_b64", "x4", kind="read2"),
    0x78: _op("ds_read2st64_b64", "x4", kind="read2"),
    0xDE: _op("ds_write_b96", None, "x3", kind="write"),
    0xDF: _op("ds_write_b128", None, "x4", kind="write"),
    0xFE: _op("ds_read_b96", "x3", kind="read"),
    0xFF: _op("ds_read_b128", "x4", kind="read"),
}

# ---------------------------------------------------------------------------------- FLAT
# kind: "load" vdst; "store" data; "atomic" data (vdst when sc0 asks for the old value)
FLAT = {
    0x10: _op("load_ubyte", "b32", kind="load"),
    0x11: _op("load_sbyte", "b32", kind="load"),
    0x12: _op("load_ushort", "b32", kind="load"),
    0x13: _op("load_sshort", "b32", kind="load"),
    0x14: _op("load_dword", "b32", kind="load"),
    0x15: _op("load_dwordx2", "x2", kind="load"),
    0x16: _op("load_dwordx3", "x3", kind="load"),
    0x17: _op("load_dwordx4", "x4", kind="load"),
    0x18: _op("store_byte", None, "b32", kind="store"),
    0x19: _op("store_byte_d16_hi", None, "b32", kind="store"),
    0x1A: _op("store_short", None, "b32", kind="store"),
    0x1B: _op("store_short_d16_hi", None, "b32", kind="store"),
    0x1C: _op("store_dword", None, "b32", kind="store"),
    0x1D: _op("store_dwordx2", None, "x2", kind="store"),
    0x1E: _op("store_dwordx3", None, "x3", kind="store"),
    0x1F: _op("store_dwordx4", None, "x4", kind="store"),
    0x40: _op("atomic_swap", "b32", "b32", kind="atomic"),
    0x41: _op("atomic_cmpswap", "b32", "x2", kind="atomic"),
    0x42: _op("atomic_add", "b32", "b32", kind="atomic"),
    0x43: _op("atomic_sub", "b32", "b32", kind="atomic"),
    0x44: _op("atomic_smin", "b32", "b32", kind="atomic"),
    0x45: _op("atomic_umin", "b32", "b32", kind="atomic"),
    0x46: _op("atomic_smax", "b32", "b32", kind="atomic"),
    0x47: _op("atomic_umax", "b32", "b32", kind="atomic"),
    0x48: _op("atomic_and", "b32", "b32", kind="atomic"),
    0x49: _op("atomic_or", "b32", "b32", kind="atomic"),
    0x4A: _op("atomic_xor", "b32", "b32", kind="atomic"),
    0x4B: _op("atomic_inc", "b32", "b32", kind="atomic"),
    0x4C: _op("atomic_dec", "b32", "b32", kind="atomic"),
    0x4D: _op("atomic_add_f32", "b32", "b32", kind="atomic"),
    0x60: _op("atomic_swap_x2", "x2", "x2", kind="atomic"),
    0x61: _op("atomic_cmpswap_x2", "x2", "x4", kind="atomic"),
    0x62: _op("atomic_add_x2", "x2", "x2", kind="atomic"),
    0x63: _op("atomic_sub_x2", "x2", "x2", kind="atomic"),
}
FLAT_SEGMENTS = {0: "flat", 2: "global"}  # 1 = scratch: not used by the kernels

# ---------------------------------------------------------------------------------- MUBUF
# Only the cache-control operations (no address operands) are used by the kernels.
MUBUF = {
    0x28: _op("buffer_wbl2", None, kind="cache"),
    0x29: _op("buffer_inv", None, kind="cache"),
}


def tables(arch: str) -> dict[str, dict[int, Op]]:
    """The opcode tables of ``arch`` (gfx942 or gfx950)."""
    if arch not in ("gfx942", "gfx950"):
        raise ValueError(f"no instruction tables for {arch}")
    vop1, vop3, mai = dict(VOP1), dict(VOP3), dict(MAI_GFX942)
    if arch == "gfx950":
        vop1.update(VOP1_GFX950)
        vop3.update(VOP3_GFX950)
        mai.update(MAI_GFX950)
    return {
        "SOP2": SOP2, "SOPK": SOPK, "SOP1": SOP1, "SOPC": SOPC, "SOPP": SOPP, "SMEM": SMEM,
        "VOP2": VOP2, "VOP1": vop1, "VOPC": VOPC, "VOP3": vop3, "VOP3P": VOP3P, "MAI": mai,
        "DS": DS, "FLAT": FLAT, "MUBUF": MUBUF,
    }  # fmt: skip
