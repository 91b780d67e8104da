"""The selftest's CPU side: the problems each check runs, the references and the verdict on
answers (the kernel-numerics reference standing in for the kernels: it passes; perturbed
answers fail), the draft model the ranks build, the dead-rank layout, the kernels' miss
policy, and ``mono-aot selftest`` on a machine with no ROCm GPU."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from mono_aot import selftest as st
from mono_aot.reference.fp8 import boundary_distance, boundary_gap, encode, resolve_format
from mono_aot.reference.step import (
    KV_BOUNDARY_TOL,
    KV_ENTRY_BOUNDARY_TOL,
    KV_LATER_LAYER_TOL,
    KV_SPREAD_FACTOR,
    compare_caches,
    later_layer_bound,
    norm_rel_error,
)
from mono_aot.selftest import cases
from mono_aot.spec import abi
from mono_aot.spec.errors import EXIT_NO_DEVICE
from mono_aot.spec.layouts import parse_layout, resolve_layout

LAY = resolve_layout("minimax-m3.1-dspark-tp4")


def _small():
    doc = LAY.model_dump(mode="json")
    doc["model"].update(layers=2, hidden=1024, mlp=2048)
    doc["targets"] = {"gfx942": {"ctas": 16}}
    return parse_layout(doc, "small test layout")


SMALL = _small()


@pytest.fixture(scope="module")
def small_model():
    from mono_aot.reference import random_model

    return random_model(SMALL, "gfx942", 0)


def _problem(model, count, seed=1):
    from mono_aot.reference import make_problem, rope_cache

    prob = make_problem(
        SMALL, "gfx942", st.request_specs(SMALL, count, salt=count), seed=seed, model=model
    )
    return cases.with_rope(prob, rope_cache(cases.max_position(SMALL), 64))


def _answers(ref, tp=4):
    """What correct kernels would answer: the kernel-numerics reference's output and caches."""
    return [
        {"rank": r, "out": ref.refk.ranks[r].out, "caches": ref.caches[r], "health": [0, 0, 0, 0]}
        for r in range(tp)
    ]


# ---------------------------------------------------------------- which steps each check runs


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


def test_multi_launch_steps_mix_narrow_and_wide_over_several_launches():
    # the real model's steps: at most max_reqs = 10 requests (a FULL replay pads 9 to 10)
    counts = st.multi_launch_counts(LAY)
    assert counts == [9, 10]
    assert [cases.describe_launches(LAY, c) for c in counts] == [
        "wide 8 + narrow 1",
        "wide 8 + narrow 2",
    ]
    assert all(len(cases.launches(LAY, c)) >= 2 for c in counts)
    assert st.step_counts(LAY) == list(range(1, 11))
    # a layout that takes more requests a step: wide tails, and several wide launches
    doc = LAY.model_dump(mode="json")
    doc["serving"]["max_reqs"] = 24
    more = parse_layout(doc, "more requests")
    assert st.multi_launch_counts(more) == [9, 10, 11, 16, 19]
    assert cases.describe_launches(more, 19) == "wide 8 + wide 8 + wide 3"
    assert cases.launches(more, 19) == [(0, 8, "wide"), (8, 8, "wide"), (16, 3, "wide")]
    # a layout with no narrow kernel has no narrow tail
    doc["serving"]["wide_base"] = 1
    only_wide = parse_layout(doc, "wide only")
    assert st.multi_launch_counts(only_wide) == [9, 10, 16, 17]
    assert "narrow" not in " ".join(cases.describe_launches(only_wide, c) for c in [9, 10])
    # the checks the CLI offers
    assert st.CHECKS == (
        "narrow", "wide", "multi-launch", "dead-rank", "dead-rank-realign", "late-dispatch",
        "graph-replay",
    )  # fmt: skip
    assert set(st.SHORT_WAIT_CHECKS) == {"dead-rank", "dead-rank-realign", "late-dispatch"}


def test_the_runners_chunking_is_the_one_the_checks_expect(monkeypatch):
    """``cases.launches`` restates ``DrafterRunner.chunks``: they must agree on every count."""
    from mono_aot.runtime.runner import DrafterRunner

    r = DrafterRunner.__new__(DrafterRunner)
    r.layout = LAY
    for count in range(1, 3 * LAY.serving.chunk_reqs + 1):
        assert r.chunks(count) == cases.launches(LAY, count)


def test_the_caches_hold_every_planned_problem():
    from mono_aot.spec.util import ceil_div

    biggest = max(st.multi_launch_counts(LAY))
    specs = st.request_specs(LAY, biggest, salt=biggest)
    need = sum(
        ceil_div(max(s.seq_len or 0, s.context + LAY.serving.qpr), LAY.serving.kv_block)
        for s in specs
    )
    assert need + cases.SPARE_BLOCKS <= cases.cache_blocks(LAY, biggest)
    assert max(cases.CONTEXTS) + LAY.serving.qpr <= cases.max_position(LAY)


# ---------------------------------------------------------------- the verdict math


def test_rel_error():
    a = torch.ones(4, 8, dtype=torch.float64)
    assert norm_rel_error(a, a) == 0.0
    b = a.clone()
    b[0, 0] = 2.0
    assert norm_rel_error(b, a) == pytest.approx(1 / math.sqrt(32))
    b[1, 1] = float("nan")
    assert norm_rel_error(b, a) == math.inf


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
    assert float(boundary_distance(pre[0, 2, 0, 7:8], fmt)[0]) < KV_BOUNDARY_TOL
    got = want.clone()
    assert compare_caches(LAY, fmt, [got], [want], slots, pre) == (0, 0)
    got[2, 0, 3, 7] ^= 1  # the near-boundary code, one step off: tolerated
    assert compare_caches(LAY, fmt, [got], [want], slots, pre) == (0, 1)
    got[0, 0, 5, 0] ^= 1  # a written code far from any boundary
    got[3, 0, 0, 0] = 0  # a byte nobody may write
    found: list = []
    assert compare_caches(LAY, fmt, [got], [want], slots, pre, found) == (2, 1)
    (layer,) = found  # what the verdict tells about them: where, which codes, which value
    assert layer["layer"] == 0 and layer["bad_bytes"] == 2 and layer["unwritten_bytes_changed"] == 1
    written, unwritten = layer["first"]
    assert written == {"block": 0, "kv_head": 0, "position_in_block": 5, "byte": 0, "half": "K",
                       "got": int(want[0, 0, 5, 0]) ^ 1, "want": int(want[0, 0, 5, 0]),
                       "token": 0, "prequant": 1.0, "boundary_gap": 2.0**-5}  # fmt: skip
    assert unwritten["block"] == 3 and unwritten["got"] == 0 and "token" not in unwritten


def test_compare_caches_measures_a_near_zero_value_against_its_entry():
    """A layer-0 value near zero is the result of a cancelling sum, whose fp32 error is set by
    the entry's scale (the RMS of the token's K values in that head), not by the value: a code
    flip there is tolerated when the value is that near a boundary; not when it is farther, nor
    in the other half (V), whose scale is its own."""
    fmt = resolve_format("gfx942")
    B, D = LAY.serving.kv_block, LAY.model.head_dim
    slots = torch.tensor([0], dtype=torch.int64)
    pre = torch.full((1, 1, 1, 2 * D), 64.0, dtype=torch.float64)  # K and V entries of RMS ~64
    mid = 0.0044 - float(boundary_gap(torch.tensor([0.0044]), fmt)[0])  # a midpoint near 0.0044
    pre[0, 0, 0, 9] = mid + 3.9e-6  # the multi-launch step's byte: 6e-8 of its entry's RMS
    pre[0, 0, 0, 10] = 3.0  # a code, 0.125 from its boundaries: a flip is a real error
    pre[0, 0, 0, D:] = 1e-3  # V: an entry of RMS ~1e-3
    pre[0, 0, 0, D + 9] = mid + 3.9e-6
    assert float(boundary_distance(pre[0, 0, 0, 9:10], fmt)[0]) > KV_BOUNDARY_TOL
    want = torch.full((1, 1, B, 2 * D), fmt.nan_code, dtype=torch.uint8)
    want[0, 0, 0] = encode(pre[0, 0, 0], fmt, saturate=True)
    got = want.clone()
    got[0, 0, 0, 9] ^= 1
    assert compare_caches(LAY, fmt, [got], [want], slots, pre) == (0, 1)
    got[0, 0, 0, 10] ^= 1
    got[0, 0, 0, D + 9] ^= 1
    assert compare_caches(LAY, fmt, [got], [want], slots, pre) == (2, 1)
    assert float(boundary_gap(pre[0, 0, 0, 9:10], fmt)[0]) < KV_ENTRY_BOUNDARY_TOL * 64


def test_compare_caches_judges_a_later_layers_written_values_as_a_whole():
    """Layer 1 reads the hidden state the kernel computed with its own roundings: its written
    codes may move by a step near any boundary as long as the values stay within
    ``KV_LATER_LAYER_TOL`` as a whole; a misplaced row, or an unwritten byte, still fails."""
    fmt = resolve_format("gfx942")
    B = LAY.serving.kv_block
    D2 = 2 * LAY.model.head_dim
    slots = torch.tensor([1, 2], dtype=torch.int64)
    gen = torch.Generator().manual_seed(0)
    vals = torch.randn((2, 1, D2), generator=gen, dtype=torch.float64)
    pre = [vals, vals]
    want0 = torch.full((2, 1, B, D2), fmt.nan_code, dtype=torch.uint8)
    want0[0, :, 1:3, :] = encode(vals, fmt, saturate=True).transpose(0, 1)
    want = [want0, want0.clone()]
    got = [w.clone() for w in want]
    got[1][0, 0, 1, :8] += 1  # layer 1: a few codes one step off
    assert compare_caches(LAY, fmt, got, want, slots, pre) == (0, 8)
    got[0][0, 0, 1, :8] += 1  # the same in layer 0, far from boundaries: bad
    assert compare_caches(LAY, fmt, got, want, slots, pre) == (8, 8)
    got = [w.clone() for w in want]
    got[1][0, 0, 1], got[1][0, 0, 2] = want[1][0, 0, 2], want[1][0, 0, 1]  # rows swapped
    bad, _ = compare_caches(LAY, fmt, got, want, slots, pre)
    assert bad > 0 and KV_LATER_LAYER_TOL < 1
    got = [w.clone() for w in want]
    got[1][1, 0, 0, 0] = 0  # a byte nobody may write
    assert compare_caches(LAY, fmt, got, want, slots, pre) == (1, 0)


def test_a_later_layers_bound_follows_the_spread_of_legal_numerics():
    """Where the float64 and kernel-numerics references are themselves far apart (deep, wide
    layouts: README, "What has run"), a layer's written values may be as far from the
    kernel-numerics reference as ``KV_SPREAD_FACTOR`` spreads; a misplaced row still fails."""
    fmt = resolve_format("gfx942")
    B = LAY.serving.kv_block
    D2 = 2 * LAY.model.head_dim
    slots = torch.arange(1, B, dtype=torch.int64)
    gen = torch.Generator().manual_seed(1)
    vals = torch.randn((len(slots), 1, D2), generator=gen, dtype=torch.float64) * 20
    moved = vals * (1 + 0.01 * torch.randn(vals.shape, generator=gen, dtype=torch.float64))
    want0 = torch.full((1, 1, B, D2), fmt.nan_code, dtype=torch.uint8)
    want0[0, :, 1:, :] = encode(vals, fmt, saturate=True).transpose(0, 1)
    got0 = want0.clone()
    got0[0, :, 1:, :] = encode(moved, fmt, saturate=True).transpose(0, 1)
    want, got, pre = [want0, want0], [want0, got0], [vals, vals]
    found: list = []
    bad, _ = compare_caches(LAY, fmt, got, want, slots, pre, found)
    err = found[0]["written_norm_rel_error"]
    assert bad > 0 and KV_LATER_LAYER_TOL < err < 2 * KV_LATER_LAYER_TOL  # about 3 %
    assert found[0]["bound"] == KV_LATER_LAYER_TOL
    # two legal numerics 2 % apart in layer 1: 3 % is within two spreads
    assert compare_caches(LAY, fmt, got, want, slots, pre, spread=[0.0, 0.02])[0] == 0
    assert later_layer_bound(0.02) == KV_SPREAD_FACTOR * 0.02
    # but not a 3 % error where the references agree to 1 %, nor a row moved by one
    assert compare_caches(LAY, fmt, got, want, slots, pre, spread=[0.0, 0.01])[0] > 0
    swapped = want0.clone()
    swapped[0, 0, 1:] = want0[0, 0, 1:].roll(1, dims=0)
    bad, _ = compare_caches(LAY, fmt, [want0, swapped], want, slots, pre, spread=[0.0, 0.02])
    assert bad > 0


def test_selftest_verdicts_on_a_small_layout(tmp_path, small_model):
    """The parent side of a one-launch step with no GPU: a problem, its files (the strided
    block table survives the round trip), both references, and the verdict on the
    kernel-numerics reference standing in for the kernels' answers (it passes: that reference
    is within the tolerance of the float64 one, and its caches are the expected ones)."""
    prob = _problem(small_model, 3)
    common, caches = st.save_case(prob, tmp_path, 1)
    c = torch.load(common, weights_only=True)
    bt = c["bt_base"].as_strided(c["bt_shape"], c["bt_stride"], c["bt_offset"])
    assert torch.equal(bt, prob.inputs.block_table) and bt.stride(0) != bt.shape[1]
    assert len(caches) == SMALL.parallel.tp
    saved = torch.load(caches[2], weights_only=True)
    assert all(torch.equal(a, b) for a, b in zip(saved, prob.caches()[2], strict=True))
    ref = cases.reference(SMALL, "gfx942", prob)
    answers = _answers(ref)
    res = cases.judge(SMALL, "gfx942", prob, ref, answers)
    assert res["ok"] and res["kv_bad_bytes"] == 0 and 0 < res["max_rel_error"] < st.TOLERANCE
    assert res["launches"] == "wide 3" and res["requests"] == 3 and res["tokens"] == 21
    # a poisoned output, a stray cache byte and a recorded timeout each fail the verdict
    bad_out = [dict(a, out=torch.full_like(a["out"], float("nan"))) for a in answers]
    assert not cases.judge(SMALL, "gfx942", prob, ref, bad_out)["ok"]
    stray = [dict(a, caches=[t.clone() for t in a["caches"]]) for a in answers]
    stray[1]["caches"][0][-1, 0, 0, 0] ^= 0x11
    assert cases.judge(SMALL, "gfx942", prob, ref, stray)["kv_bad_bytes"] == 1
    sick = [dict(a, health=[abi.STATUS_PEER_TIMEOUT, 6, 3, 0]) for a in answers]
    assert not cases.judge(SMALL, "gfx942", prob, ref, sick)["ok"]
    # a byte written past the problem's blocks (the ranks count them) fails too
    outside = [dict(a, outside_bad=2 if a["rank"] == 3 else 0) for a in answers]
    verdict = cases.judge(SMALL, "gfx942", prob, ref, outside)
    assert not verdict["ok"] and verdict["kv_bad_bytes"] == 2
    # judged on a subset of ranks (the dead-rank check's survivors)
    assert cases.judge(SMALL, "gfx942", prob, ref, sick[:1] + answers[1:], ranks=[1, 2, 3])["ok"]


def _chunk(inputs, r0, k, qpr):
    from mono_aot.reference import StepInputs

    a, b = r0 * qpr, (r0 + k) * qpr
    return StepInputs(
        x=inputs.x[a:b],
        positions=inputs.positions[a:],
        slots=inputs.slots[a:],
        block_table=inputs.block_table[r0:],
        seq_lens=inputs.seq_lens[r0:],
        cos_sin=inputs.cos_sin,
    )


@pytest.mark.slow
def test_a_multi_launch_step_is_judged_as_a_whole(small_model):
    """8+8+3 requests: the float64 reference of the whole step equals the runner's three
    launches run one after another on the sliced inputs (``bt[r0:]``, ``positions[a:]``, ...),
    output and caches; so the whole step's reference judges every launch. The reference's own
    answers pass; a perturbation confined to the last launch's rows, or to a cache byte only
    the first launch writes, fails."""
    from mono_aot.reference import run_tp

    count = 2 * SMALL.serving.chunk_reqs + SMALL.serving.wide_base
    prob = _problem(small_model, count, seed=5)
    qpr, tp = SMALL.serving.qpr, SMALL.parallel.tp
    whole_caches = prob.caches()
    whole = run_tp(SMALL, "gfx942", prob.ranks, whole_caches, prob.inputs, "float64")
    chunk_caches = prob.caches()
    outs = []
    for r0, k, _ in cases.launches(SMALL, count):
        res = run_tp(SMALL, "gfx942", prob.ranks, chunk_caches, _chunk(prob.inputs, r0, k, qpr))
        outs.append(res.out)
    assert norm_rel_error(torch.cat(outs), whole.out) < 1e-12
    for r in range(tp):
        for a, b in zip(chunk_caches[r], whole_caches[r], strict=True):
            assert torch.equal(a, b)

    ref = cases.reference(SMALL, "gfx942", prob)
    answers = _answers(ref)
    res = cases.judge(SMALL, "gfx942", prob, ref, answers)
    assert res["ok"], res
    assert res["launches"] == "wide 8 + wide 8 + wide 3" and res["tokens"] == count * qpr
    # the last launch's rows off by 10 % of their norm: the step fails
    tail = slice(16 * qpr, count * qpr)
    off = [dict(a, out=a["out"].clone()) for a in answers]
    for a in off:
        noise = torch.randn(a["out"][tail].shape, generator=torch.Generator().manual_seed(0))
        a["out"][tail] += (0.1 * ref.ref64.out.norm() / noise.norm() * noise).to(a["out"].dtype)
    assert not cases.judge(SMALL, "gfx942", prob, ref, off)["ok"]
    # a layer-0 K byte of the first request's first written token, on rank 0, flipped far from
    # any fp8 boundary by xor 0x40 (the exponent): a bad byte
    slot = int(prob.inputs.slots[0])
    B = SMALL.serving.kv_block
    flipped = [dict(a, caches=[t.clone() for t in a["caches"]]) for a in answers]
    flipped[0]["caches"][0][slot // B, 0, slot % B, 5] ^= 0x40
    verdict = cases.judge(SMALL, "gfx942", prob, ref, flipped)
    assert not verdict["ok"] and verdict["kv_bad_bytes"] >= 1
    # in a later layer, that token's whole K/V row written into the next slot instead
    moved = [dict(a, caches=[t.clone() for t in a["caches"]]) for a in answers]
    kv = moved[0]["caches"][1]
    nxt = slot + 1
    kv[nxt // B, 0, nxt % B], kv[slot // B, 0, slot % B] = (
        kv[slot // B, 0, slot % B].clone(),
        kv[nxt // B, 0, nxt % B].clone(),
    )
    verdict = cases.judge(SMALL, "gfx942", prob, ref, moved)
    assert not verdict["ok"] and verdict["kv_bad_bytes"] >= 1


@pytest.mark.slow
def test_a_mixed_narrow_wide_step_passes_on_the_reference(small_model):
    count = SMALL.serving.chunk_reqs + 2  # wide 8 + narrow 2
    prob = _problem(small_model, count, seed=9)
    ref = cases.reference(SMALL, "gfx942", prob)
    res = cases.judge(SMALL, "gfx942", prob, ref, _answers(ref))
    assert res["ok"] and res["launches"] == "wide 8 + narrow 2", res


# ---------------------------------------------------------------- the ranks' model


def test_the_ranks_draft_model_feeds_the_runner_the_problems_weights(small_model):
    """The model a rank builds has vLLM's attribute paths; the runner's own readers
    (``layer_weights``, ``kv_cache_of``) take from it exactly the reference's packed tensors,
    and the runner's stacking gives back the reference's stacked ones."""
    from mono_aot.runtime.runner import PROJECTIONS, kv_cache_of, layer_weights
    from mono_aot.selftest.rank import draft_model

    prob = _problem(small_model, 1)
    rope = prob.inputs.cos_sin
    for r, w in enumerate(prob.ranks):
        weights = {
            "packed": dict(w.packed), "norms": dict(w.norms), "k_scale": w.k_scale,
            "v_scale": w.v_scale, "final_norm": w.final_norm,
        }  # fmt: skip
        caches = prob.caches()[r]
        model = draft_model(weights, caches, rope)
        assert len(model.layers) == SMALL.model.layers
        assert model._rope_cos_sin_cache is rope and model.norm.weight is w.final_norm
        got = [layer_weights(x, SMALL, f"layer {i}") for i, x in enumerate(model.layers)]
        for i, g in enumerate(got):
            want = w.layer(i)
            assert set(g) == set(want)
            for name, t in want.items():
                assert torch.equal(g[name].reshape(t.shape), t), (r, i, name)
            assert kv_cache_of(model.layers[i]) is caches[i]
            assert model.layers[i].self_attn.attn.layer_name == f"model.layers.{i}.self_attn.attn"
        for p, _ in PROJECTIONS:
            for k in ("w", "s"):
                stacked = torch.stack([g[f"{p}_{k}"] for g in got])
                assert torch.equal(stacked, w.packed[f"{p}_{k}"])
        assert got[1]["k_scale"].data_ptr() == w.k_scale[1:].data_ptr()  # a view, not a copy


# ---------------------------------------------------------------- kernels and devices


def test_the_dead_rank_layout_is_its_own_kernels(tmp_path):
    from mono_aot.keys import served_key
    from mono_aot.selftest.artifacts import short_wait_layout
    from mono_aot.spec.layouts import load_layout, write_spec

    short = short_wait_layout(LAY, st.DEAD_RANK_WAIT_S)
    assert short.serving.peer_wait_s == 0.5 and short.wait_ticks == 50_000_000
    assert short.name == "minimax-m3.1-dspark-tp4-wait500ms"
    for v in LAY.variants():
        assert served_key(v, short, "gfx942") != served_key(v, LAY, "gfx942")
    path = write_spec(short, tmp_path)
    back = load_layout(path)
    assert back.digest == short.digest and back.targets == short.targets
    assert back.model_dump() == short.model_dump()
    assert write_spec(LAY, tmp_path / "..").name == "minimax-m3.1-dspark-tp4.toml"


def test_a_miss_follows_the_runtimes_policy(tmp_path, monkeypatch):
    from mono_aot.selftest import artifacts

    env = {"MONO_AOT_CACHE_DIR": str(tmp_path / "cache"), "MONO_AOT_STRICT": "1"}
    short = artifacts.short_wait_layout(LAY, st.DEAD_RANK_WAIT_S)
    wanted = artifacts.needs(LAY, short)
    assert [(n.layout.name, n.variant, n.shipped) for n in wanted] == [
        ("minimax-m3.1-dspark-tp4", "narrow", True),
        ("minimax-m3.1-dspark-tp4", "wide", True),
        ("minimax-m3.1-dspark-tp4-wait500ms", "narrow", False),
        ("minimax-m3.1-dspark-tp4-wait500ms", "wide", False),
    ]
    with pytest.raises(Exception, match="MONO_AOT_STRICT=1 and 4 kernel") as e:
        artifacts.ensure_kernels(wanted, "gfx942", tmp_path, env=env)
    msg = str(e.value)
    assert "mono-aot build --layout minimax-m3.1-dspark-tp4 --arch gfx942 --variant wide" in msg
    assert "minimax-m3.1-dspark-tp4-wait500ms.toml --arch gfx942 --variant narrow" in msg
    assert wanted[3].key("gfx942") in msg
    monkeypatch.setattr("mono_aot.runtime.miss.compiler_available", lambda: False)
    env.pop("MONO_AOT_STRICT")
    with pytest.raises(Exception, match="no compiler here to build them"):
        artifacts.ensure_kernels(wanted[:1], "gfx950", tmp_path, env=env)


_NO_DEVICE_PROBE = """
import sys
from mono_aot import selftest as st
from mono_aot.spec.layouts import resolve_layout
try:
    st.run_selftest(resolve_layout("minimax-m3.1-dspark-tp4"))
except st.NoDevice as e:
    print("NoDevice", e.exit_code, e)
print("flydsl" in sys.modules, "mono_aot.kernels" in sys.modules, "mono_aot.compiler" in sys.modules)
"""


def test_run_selftest_without_a_rocm_device_is_no_device_without_flydsl():
    if getattr(torch.version, "hip", None) and torch.cuda.is_available():
        pytest.skip("this machine has a ROCm device")
    p = subprocess.run(
        [sys.executable, "-c", _NO_DEVICE_PROBE], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    first, last = p.stdout.strip().splitlines()
    assert first.startswith(f"NoDevice {EXIT_NO_DEVICE} ") and "nothing was tested" in first
    assert last == "False False False"


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
    assert p.returncode == EXIT_NO_DEVICE == 3, p.stderr
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
    p = subprocess.run(
        [sys.executable, "-m", "mono_aot", "selftest", "--check", "multi-launch"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == EXIT_NO_DEVICE, p.stderr
