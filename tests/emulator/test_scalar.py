"""Scalar ALU semantics (``mono_aot/emulator/scalar.py``) against hand-computed values from the
CDNA3 ISA guide's opcode descriptions: results and SCC, edges of carries, signed overflow,
shift amounts, bit-field extracts and the saveexec family."""

from __future__ import annotations

import pytest

from mono_aot.emulator import scalar as S

M32 = 0xFFFFFFFF


@pytest.mark.parametrize(
    ("name", "a", "b", "scc", "want"),
    [
        ("s_add_u32", M32, 1, 0, (0, 1)),
        ("s_addc_u32", M32, 0, 1, (0, 1)),
        ("s_sub_u32", 0, 1, 0, (M32, 1)),
        ("s_subb_u32", 5, 4, 1, (0, 0)),
        ("s_add_i32", 0x7FFFFFFF, 1, 0, (0x80000000, 1)),  # signed overflow
        ("s_sub_i32", 0x80000000, 1, 0, (0x7FFFFFFF, 1)),
        ("s_min_i32", M32, 3, 0, (M32, 1)),  # -1 < 3
        ("s_max_u32", M32, 3, 0, (M32, 1)),
        ("s_lshl_b32", 1, 33, 0, (2, 1)),  # amount masked to 5 bits
        ("s_lshl_b64", 1, 63, 0, (1 << 63, 1)),
        ("s_ashr_i32", 0x80000000, 31, 0, (M32, 1)),
        ("s_lshr_b32", 1, 1, 1, (0, 0)),
        ("s_bfe_u32", 0xABCD, 4 | 8 << 16, 0, (0xBC, 1)),
        ("s_bfe_i32", 0x0F0, 4 | 4 << 16, 0, (M32, 1)),  # 0xF sign-extended from 4 bits
        ("s_mul_hi_i32", M32, 2, 0, (M32, None)),  # -1 * 2 = -2: high word all ones
        ("s_mul_i32", 0x10000, 0x10000, 1, (0, None)),
        ("s_cselect_b32", 7, 9, 0, (9, None)),
        ("s_andn2_b64", (1 << 64) - 1, 1, 0, ((1 << 64) - 2, 1)),
        ("s_pack_lh_b32_b16", 0x1234, 0xABCD0000, 0, (0xABCD1234, None)),
    ],
)
def test_sop2(name, a, b, scc, want):
    assert S.SOP2[name](a, b, scc) == want


def test_sop1_sopk_sopc():
    assert S.SOP1["s_bcnt1_i32_b64"]((1 << 64) - 1, 0, 0) == (64, 1)
    assert S.SOP1["s_brev_b32"](1, 0, 0) == (0x80000000, None)
    assert S.SOP1["s_ff1_i32_b64"](1 << 40, 0, 0) == (40, None)
    assert S.SOP1["s_ff1_i32_b32"](0, 0, 0) == (M32, None)
    assert S.SOP1["s_abs_i32"](0x80000000, 0, 0) == (0x80000000, 1)  # |INT_MIN| wraps
    assert S.SOP1["s_cmov_b32"](5, 9, 0) == (9, None)
    assert S.SOPK["s_movk_i32"](0, 0xFFFB, 0) == (0xFFFFFFFB, None)
    assert S.SOPK["s_addk_i32"](0x7FFFFFFF, 1, 0) == (0x80000000, 1)
    assert S.SOPK["s_cmpk_lt_i32"](M32, 0, 0) == (None, 1)
    assert S.SOPK["s_cmpk_lt_u32"](M32, 0, 0) == (None, 0)
    assert S.SOPC["s_cmp_gt_i32"](1, M32, 0) == (None, 1)
    assert S.SOPC["s_cmp_gt_u32"](1, M32, 0) == (None, 0)
    assert S.SOPC["s_bitcmp1_b64"](1 << 35, 35, 0) == (None, 1)


def test_saveexec_family():
    e, s = 0b1100, 0b1010
    assert S.SAVEEXEC["s_and_saveexec_b64"](s, e) == 0b1000
    assert S.SAVEEXEC["s_andn2_saveexec_b64"](s, e) == 0b0010
    assert S.SAVEEXEC["s_or_saveexec_b64"](s, e) == 0b1110
    assert S.SAVEEXEC["s_xor_saveexec_b64"](s, e) == 0b0110
    assert S.WREXEC["s_andn1_wrexec_b64"](s, e) == 0b0100
