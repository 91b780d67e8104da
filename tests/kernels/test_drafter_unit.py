"""The parts of the drafter kernels' package that run without a GPU or a compile: the provider
protocol, the buffer plans the kernels and the runner share, the GEMV plans. (The selftest's
problems and verdicts are tested in ``tests/selftest/``.)"""

from __future__ import annotations

import pytest

from mono_aot.kernels import KERNEL_NAMES, trace_args
from mono_aot.spec import abi
from mono_aot.spec.layouts import resolve_layout

LAY = resolve_layout("minimax-m3.1-dspark-tp4")


def test_provider_protocol():
    assert set(KERNEL_NAMES) == {"narrow", "wide"}
    assert len(set(KERNEL_NAMES.values())) == 2
    args = abi.kernel_args(LAY.parallel.tp)
    for v in KERNEL_NAMES:
        vals = trace_args(v, LAY)
        assert len(vals) == len(args) == 28
        assert all(isinstance(x, int) for x in vals)
        named = dict(zip((a.name for a in args), vals, strict=True))
        assert named["n"] == LAY.variant_tokens(v)
        assert named["bt_stride"] >= 1


def _disjoint(plan: abi.BufferPlan) -> None:
    end = 0
    for name, off, size in plan.regions:
        assert off % abi.REGION_ALIGN == 0, name
        assert off >= end, f"{name} overlaps the region before it"
        assert size > 0, name
        end = off + size
    assert plan.total >= end


@pytest.mark.parametrize("variant", ["narrow", "wide"])
def test_scratch_plan(variant):
    plan = abi.scratch_plan(LAY, variant)
    _disjoint(plan)
    t, h = LAY.variant_tokens(variant), LAY.model.hidden
    assert plan.size("x") == t * h * 4
    assert plan.size("h") == t * h * 2
    assert plan.size("ss") == 2 * (2 * LAY.model.layers + 1) * t * 4
    assert plan.size("sync") == abi.SYNC_BYTES
    assert abi.SYNC_TICKET >= 2 * abi.SYNC_HALF and abi.SYNC_TICKET % 8 == 0
    assert abi.SYNC_TICKET + 8 <= abi.SYNC_BYTES
    assert max(abi.SYNC_COUNT, abi.SYNC_GEN, abi.SYNC_ABORT) + 4 <= abi.SYNC_HALF
    assert LAY.scratch_bytes(variant) == plan.total


def test_peer_plan_holds_every_workgroups_block_on_every_arch():
    plan = abi.peer_plan(LAY)
    _disjoint(plan)
    tp = LAY.parallel.tp
    rows = abi.mbox_rows(LAY)
    assert rows % 8 == 0  # whole 16-byte vectors of bf16 per token
    for arch in LAY.archs:
        ctas = LAY.ctas(arch)
        owned = [
            ((c + 1) * LAY.model.hidden) // ctas - (c * LAY.model.hidden) // ctas
            for c in range(ctas)
        ]
        assert max(owned) <= rows
        for kind in abi.AR_KINDS:
            for p in (0, 1):
                assert plan.size(f"flags_{kind}{p}") >= ctas * tp * 4
                assert plan.size(f"mbox_{kind}{p}") >= tp * ctas * abi.mbox_tokens(LAY) * rows * 2
    assert abi.mbox_tokens(LAY) == LAY.variant_tokens("wide") == 56  # 8 requests x 7
    assert LAY.peer_bytes == plan.total


def test_health_descriptions():
    assert abi.describe_health([0, 0, 0, 0]) == "ok"
    text = abi.describe_health([abi.STATUS_PEER_TIMEOUT, 3 * 16 + abi.PH_AR_MLP, 2, 41])
    assert "peer" in text and "layer 3" in text and "MLP all-reduce" in text and "rank 2" in text
    assert "step 41" in text
    text = abi.describe_health([abi.STATUS_BAD_N, abi.PH_LAUNCH, 200, 3])
    assert "n is 0, above" in text and "launch arguments" in text and "n=200" in text
    text = abi.describe_health([abi.STATUS_BARRIER_TIMEOUT, abi.PH_QKV, 7, 0])
    assert "grid barrier" in text and "qkv" in text and "generation 7" in text
    assert len(set(abi.PHASE_NAMES)) == len(abi.PHASE_NAMES) and max(abi.PHASE_NAMES) < 16


def test_gemv_plans_for_the_shipped_layout():
    from mono_aot.kernels.gemv import KT, GemvPlan

    h, mlp = LAY.model.hidden, LAY.mlp_per_rank
    for arch in LAY.archs:
        for variant in ("narrow", "wide"):
            common = {"ctas": LAY.ctas(arch), "max_tokens": LAY.variant_tokens(variant)}
            plans = [
                GemvPlan(LAY.qkv_rows_per_rank, h, **common),
                GemvPlan(h, LAY.o_cols_per_rank, **common),
                GemvPlan(2 * mlp, h, pairs=True, **common),
                GemvPlan(h, mlp, **common),
            ]
            for p in plans:
                assert p.values_per_lane <= 64 and p.red_values <= 64
                assert p.per_wave * p.waves >= p.local_rows
                assert p.groups * p.group >= p.max_tokens
                assert p.lds_bytes <= 48 * 1024
                assert p.cols % KT == 0
    with pytest.raises(ValueError, match="multiple of the 1024-wide K tile"):
        GemvPlan(64, 1000, ctas=4, max_tokens=8)
    with pytest.raises(ValueError, match="every one needs a row"):
        GemvPlan(4, 1024, ctas=8, max_tokens=8)
