"""The parts of the drafter kernels' package that run without a GPU or a compile: the provider
protocol, the buffer plans the kernels and the runner share, the GEMV plans, the selftest's
problem choice and verdict functions, and ``mono-aot selftest`` on a machine with no GPU."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from mono_aot import selftest as st
from mono_aot.kernels import KERNEL_NAMES, build_wide, trace_args
from mono_aot.reference.fp8 import boundary_distance, encode, resolve_format
from mono_aot.spec import abi
from mono_aot.spec.errors import BadInput
from mono_aot.spec.layouts import resolve_layout

LAY = resolve_layout("minimax-m3-dspark-tp4")


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


def test_build_wide_rejects_another_base():
    with pytest.raises(BadInput, match="wide_base=3"):
        build_wide(LAY, "gfx942", 4, LAY.wait_ticks)


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
    assert abi.mbox_tokens(LAY) == LAY.variant_tokens("wide") == 64
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


@pytest.mark.parametrize("variant", ["narrow", "wide"])
def test_selftest_problems_cover_every_request_count(variant):
    counts = st.request_counts(LAY, variant)
    lo, hi = LAY.variant_reqs(variant)
    assert counts == list(range(lo, hi + 1))
    specs = st.request_specs(LAY, hi, salt=hi)
    assert len(specs) == hi
    if hi >= 2:
        assert any(s.written is not None and not all(s.written) for s in specs), "slot -1"
    if hi >= 3:
        assert any(s.seq_len is not None and s.seq_len < s.context + LAY.serving.qpr for s in specs)
    ctx = {s.context for s in specs}
    if hi >= 6:
        assert max(ctx) > abi.ATTN_PARTITION, "a split-attention request"


def test_rel_error():
    a = torch.ones(4, 8, dtype=torch.float64)
    assert st.rel_error(a, a) == 0.0
    b = a.clone()
    b[0, 0] = 2.0
    assert st.rel_error(b, a) == pytest.approx(1 / math.sqrt(32))
    b[1, 1] = float("nan")
    assert st.rel_error(b, a) == math.inf


def test_compare_caches_tolerates_only_near_boundary_written_codes():
    fmt = resolve_format("gfx942")
    B = LAY.serving.kv_block
    blocks, D2 = 4, 2 * LAY.model.head_dim
    want = torch.full((blocks, 1, B, D2), fmt.nan_code, dtype=torch.uint8)
    slots = torch.tensor([5, -1, 2 * B + 3], dtype=torch.int64)
    pre = torch.full((1, 3, 1, D2), 1.0, dtype=torch.float64)  # 1.0 is a code, far from a midpoint
    near = 1.0 + 2.0**-4 * (1 + 1e-7)  # just above the midpoint between 1.0 and 1.125
    pre[0, 2, 0, 7] = near
    codes = encode(pre, fmt, saturate=True)
    for t in (0, 2):
        s = int(slots[t])
        want[s // B, :, s % B, :] = codes[0, t]
    assert float(boundary_distance(pre[0, 2, 0, 7:8], fmt)[0]) < st.KV_BOUNDARY_TOL[0]
    got = want.clone()
    assert st.compare_caches(LAY, fmt, [got], [want], slots, pre) == (0, 0)
    got[2, 0, 3, 7] ^= 1  # the near-boundary code, one step off: tolerated
    assert st.compare_caches(LAY, fmt, [got], [want], slots, pre) == (0, 1)
    got[0, 0, 5, 0] ^= 1  # a written code far from any boundary
    got[3, 0, 0, 0] = 0  # a byte nobody may write
    assert st.compare_caches(LAY, fmt, [got], [want], slots, pre) == (2, 1)


def test_selftest_cli_without_a_rocm_device_exits_3():
    if getattr(torch.version, "hip", None) and torch.cuda.is_available():
        pytest.skip("this machine has a ROCm device")
    p = subprocess.run(
        [sys.executable, "-m", "mono_aot", "selftest"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == st.EXIT_NO_DEVICE == 3, p.stderr
    assert "nothing was tested" in p.stderr
    assert "PASS" not in p.stdout
    p = subprocess.run(
        [sys.executable, "-m", "mono_aot", "selftest", "--check", "bogus"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 2


def test_selftest_verdicts_on_a_small_layout(tmp_path):
    """The parent side of a selftest case with no GPU: a problem, its files (the strided block
    table survives the round trip), both references, and the verdict on the kernel-numerics
    reference standing in for the kernels' answers (it passes: that reference is within the
    tolerance of the float64 one, and its caches are the expected ones)."""
    import torch

    from mono_aot.reference import random_model
    from mono_aot.spec.layouts import parse_layout

    doc = LAY.model_dump(mode="json")
    doc["model"].update(layers=2, hidden=1024, mlp=2048)
    doc["targets"] = {"gfx942": {"ctas": 16}}
    small = parse_layout(doc, "small test layout")
    run = st._Run.__new__(st._Run)
    run.torch, run.layout, run.arch, run.seed, run.log = torch, small, "gfx942", 0, print
    run.dir, run.cases = tmp_path, 0
    run.model = random_model(small, "gfx942", 0)
    prob = run.problem(st.request_specs(small, 3, salt=3))
    common, caches = run.save_case(prob)
    c = torch.load(common, weights_only=True)
    bt = c["bt_base"].as_strided(c["bt_shape"], c["bt_stride"], c["bt_offset"])
    assert torch.equal(bt, prob.inputs.block_table) and bt.stride(0) != bt.shape[1]
    assert len(caches) == small.parallel.tp
    refs = run.reference(prob)
    _, refk, final = refs
    answers = [
        {"rank": r, "out": refk.ranks[r].out, "caches": final[r], "health": [0, 0, 0, 0]}
        for r in range(small.parallel.tp)
    ]
    res = run.judge(prob, answers, refs=refs)
    assert res["ok"] and res["kv_bad_bytes"] == 0 and 0 < res["max_rel_error"] < st.TOLERANCE
    # a poisoned output, a stray cache byte and a recorded timeout each fail the verdict
    bad_out = [dict(a, out=torch.full_like(a["out"], float("nan"))) for a in answers]
    assert not run.judge(prob, bad_out, refs=refs)["ok"]
    stray = [dict(a, caches=[t.clone() for t in a["caches"]]) for a in answers]
    stray[1]["caches"][0][-1, 0, 0, 0] ^= 0x11
    assert run.judge(prob, stray, refs=refs)["kv_bad_bytes"] == 1
    sick = [dict(a, health=[abi.STATUS_PEER_TIMEOUT, 6, 3, 0]) for a in answers]
    assert not run.judge(prob, sick, refs=refs)["ok"]
