"""A few lane operations for the executor's own tests, written to the contract of
``mono_aot/emulator/lanes.py``; test-only, so the executor's tests do not depend on the VALU and
numerics tables (``valu.py``, ``numerics.py``), which have their own tests."""

from __future__ import annotations

import numpy as np

from mono_aot.emulator.lanes import as_f32, as_u32


def _u64(x: np.ndarray) -> np.ndarray:
    return x[:, 0].astype(np.uint64) | (x[:, 1].astype(np.uint64) << np.uint64(32))


def _pair(x: np.ndarray) -> np.ndarray:
    out = np.empty((64, 2), dtype=np.uint32)
    out[:, 0] = (x & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    out[:, 1] = (x >> np.uint64(32)).astype(np.uint32)
    return out


def _add_co(ctx, a, b):
    r = a.astype(np.uint64) + b
    return r.astype(np.uint32), r > 0xFFFFFFFF


def _addc(ctx, a, b):
    r = a.astype(np.uint64) + b + ctx.mask
    return r.astype(np.uint32), r > 0xFFFFFFFF


def _fmac(ctx, a, b, c):
    return as_u32((as_f32(a).astype(np.float64) * as_f32(b) + as_f32(c)).astype(np.float32))


TEST_OPS = {
    "v_mov_b32": lambda ctx, a: a.copy(),
    "v_accvgpr_read_b32": lambda ctx, a: a.copy(),
    "v_accvgpr_write_b32": lambda ctx, a: a.copy(),
    "v_add_u32": lambda ctx, a, b: a + b,
    "v_sub_u32": lambda ctx, a, b: a - b,
    "v_and_b32": lambda ctx, a, b: a & b,
    "v_or_b32": lambda ctx, a, b: a | b,
    "v_lshlrev_b32": lambda ctx, a, b: b << (a & np.uint32(31)),
    "v_add_f32": lambda ctx, a, b: as_u32(as_f32(a) + as_f32(b)),
    "v_mul_f32": lambda ctx, a, b: as_u32(as_f32(a) * as_f32(b)),
    "v_cndmask_b32": lambda ctx, a, b: np.where(ctx.mask, b, a),
    "v_cmp_eq_u32": lambda ctx, a, b: (None, a == b),
    "v_cmp_gt_u32": lambda ctx, a, b: (None, a > b),
    "v_cmpx_gt_u32": lambda ctx, a, b: (None, a > b),
    "v_add_co_u32": _add_co,
    "v_addc_co_u32": _addc,
    "v_fmac_f32": _fmac,
    "v_mov_b64": lambda ctx, a: a.copy(),
    "v_ashrrev_i32": lambda ctx, a, b: (
        b.view(np.int32) >> (a & np.uint32(31)).astype(np.int32)
    ).view(np.uint32),
    "v_lshrrev_b32": lambda ctx, a, b: b >> (a & np.uint32(31)),
    "v_xor_b32": lambda ctx, a, b: a ^ b,
    "v_mul_lo_u32": lambda ctx, a, b: (a.astype(np.uint64) * b).astype(np.uint32),
    "v_add3_u32": lambda ctx, a, b, c: a + b + c,
    "v_cmp_ne_u32": lambda ctx, a, b: (None, a != b),
    "v_cmp_lt_u32": lambda ctx, a, b: (None, a < b),
    "v_cmp_gt_i32": lambda ctx, a, b: (None, a.view(np.int32) > b.view(np.int32)),
    "v_cmp_lt_i32": lambda ctx, a, b: (None, a.view(np.int32) < b.view(np.int32)),
    "v_lshl_add_u64": lambda ctx, a, b, c: _pair(
        (_u64(a) << (b[:, 0] & 63).astype(np.uint64)) + _u64(c)
    ),
    "v_pk_add_f32": lambda ctx, a, b: as_u32(as_f32(a) + as_f32(b)),
}
