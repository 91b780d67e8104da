"""The CPU side of the dead-rank-realign and late-dispatch checks: the CU mask of the late
launch, and both verdicts fed with synthetic rank answers (the kernel-numerics reference
standing in for correct kernels: it passes; each way the kernels or the protocol can go wrong
fails it, with a problem naming the rank and what happened)."""

from __future__ import annotations

import pytest
import torch

from mono_aot import selftest as st
from mono_aot.selftest import cases
from mono_aot.spec import abi
from tests.selftest.test_cases import SMALL, _answers, _problem

ARCH = "gfx942"
WAIT = st.DEAD_RANK_WAIT_S
GIVE_UP = st.GIVE_UP_S


@pytest.fixture(scope="module")
def small_model():
    from mono_aot.reference import random_model

    return random_model(SMALL, ARCH, 0)


@pytest.fixture(scope="module")
def step(small_model):
    """A one-launch step of the small layout and its reference."""
    prob = _problem(small_model, 1)
    return prob, cases.reference(SMALL, ARCH, prob)


# ---------------------------------------------------------------- the CU mask


@pytest.mark.parametrize(
    ("cus", "per_cu", "enabled"),
    [(304, 1, 76), (256, 1, 64), (228, 1, 57), (80, 1, 20), (38, 1, 9), (32, 1, 8), (304, 2, 38)],
)
def test_late_mask_enables_the_lowest_cus_a_quarter_of_the_launch_at_most(cus, per_cu, enabled):
    got, words = cases.late_mask(cus, per_cu)
    assert got == enabled
    assert len(words) == -(-cus // 32) and all(0 <= w < 1 << 32 for w in words)
    bits = [(w >> i) & 1 for w in words for i in range(32)]
    assert bits == [1] * enabled + [0] * (32 * len(words) - enabled)


def test_late_mask_always_leaves_workgroups_waiting_and_every_xcd_a_cu():
    for cus in range(32, 305):
        for per_cu in (1, 2):
            enabled, words = cases.late_mask(cus, per_cu)
            assert sum(w.bit_count() for w in words) == enabled
            assert enabled >= cases.LATE_MIN_CUS  # >= 1 CU for each of up to 8 XCDs
            assert enabled * per_cu <= cus // 2  # at least half the workgroups dispatched late


@pytest.mark.parametrize(("cus", "per_cu"), [(8, 1), (16, 2), (32, 4), (0, 1), (304, 0)])
def test_late_mask_refuses_what_cannot_make_a_late_dispatch(cus, per_cu):
    with pytest.raises(ValueError, match=f"late_mask: {cus} CUs"):
        cases.late_mask(cus, per_cu)


# ---------------------------------------------------------------- late-dispatch verdict


def _late_answers(ref, first_step=40):
    """Correct ranks: the late launch recorded a barrier timeout in the embed phase at its
    step after one wait bound and wrote nothing; the second launch is the reference's."""
    out = []
    for a in _answers(ref):
        first = {
            "health": [abi.STATUS_BARRIER_TIMEOUT, abi.PH_EMBED, 0, first_step],
            "seconds": WAIT + 0.02,
            "step": first_step,
            "out_written": 0,
            "kv_changed": 0,
            "mask_cus": 4,
        }
        out.append(dict(a, first=first, step=first_step + 2, seconds=0.01))
    return out


def _with_first(answers, rank, **first):
    out = [dict(a) for a in answers]
    out[rank]["first"] = dict(out[rank]["first"], **first)
    return out


def test_late_verdict_passes_a_recorded_timeout_then_a_clean_launch(step):
    prob, ref = step
    res = cases.late_verdict(
        SMALL, ARCH, prob, ref, _late_answers(ref), wait_s=WAIT, give_up_s=GIVE_UP
    )
    assert res["ok"] and res["problems"] == []
    assert res["first_health"][0].endswith("(layer 0, embed, generation 0, step 40)")
    assert res["mask_cus"] == [4] * 4 and res["kv_bad_bytes"] == 0


@pytest.mark.parametrize(
    ("rank", "change", "says"),
    [
        # the symptom: the late launch left no trace in health
        (1, {"health": [0, 0, 0, 0]}, "rank 1: the late launch recorded 'ok'"),
        (2, {"health": [abi.STATUS_PEER_TIMEOUT, abi.PH_AR_ATTN, 3, 40]}, "rank 2: the late"),
        (0, {"health": [abi.STATUS_BARRIER_TIMEOUT, abi.PH_QKV, 0, 40]}, "expected a grid barrier"),
        (3, {"health": [abi.STATUS_BARRIER_TIMEOUT, abi.PH_EMBED, 0, 39]}, "step 40"),
        (0, {"seconds": WAIT / 2}, "rank 0: the late launch took 0.25 s"),
        (1, {"seconds": GIVE_UP + 1}, "rank 1: the late launch took"),
        (2, {"out_written": 8}, "rank 2: the failed launch wrote 8 output elements"),
        (3, {"kv_changed": 1}, "and 1 cache bytes"),
    ],
)
def test_late_verdict_fails_a_late_launch_that_went_wrong(step, rank, change, says):
    prob, ref = step
    answers = _with_first(_late_answers(ref), rank, **change)
    res = cases.late_verdict(SMALL, ARCH, prob, ref, answers, wait_s=WAIT, give_up_s=GIVE_UP)
    assert not res["ok"]
    assert any(says in p for p in res["problems"]), res["problems"]


def test_late_verdict_fails_a_second_launch_that_did_not_recover(step):
    prob, ref = step
    good = _late_answers(ref)
    # the symptom: the next launch returns an unwritten out with health 0
    unwritten = [dict(a, out=torch.full_like(a["out"], float("nan"))) for a in good]
    res = cases.late_verdict(SMALL, ARCH, prob, ref, unwritten, wait_s=WAIT, give_up_s=GIVE_UP)
    assert not res["ok"] and any(p.startswith("the second launch") for p in res["problems"])
    sick = [dict(a, health=[abi.STATUS_BARRIER_TIMEOUT, abi.PH_EMBED, 0, 41]) for a in good]
    res = cases.late_verdict(SMALL, ARCH, prob, ref, sick, wait_s=WAIT, give_up_s=GIVE_UP)
    assert not res["ok"] and "timed out in a grid barrier" in res["problems"][-1]
    skipped = [dict(a, step=41) if a["rank"] == 2 else a for a in good]
    res = cases.late_verdict(SMALL, ARCH, prob, ref, skipped, wait_s=WAIT, give_up_s=GIVE_UP)
    assert res["problems"] == ["rank 2: step counter 41 after two launches from 40"]


# ---------------------------------------------------------------- dead rank, no re-align


def _dead(start=7, dead=3, tp=4):
    """The dead step as correct kernels answer it: the survivors recorded the peer timeout
    naming the dead rank, their runners advanced the step counter; the dead rank did not."""
    return [
        {
            "rank": r,
            "health": [0, 0, 0, 0] if r == dead else [abi.STATUS_PEER_TIMEOUT, abi.PH_AR_ATTN, dead, start],
            "step": start if r == dead else start + 1,
            "seconds": 0.0 if r == dead else WAIT + 0.05,
        }
        for r in range(tp)
    ]  # fmt: skip


def _after(ref, dead_answers):
    """The next step as it would be if the protocol re-aligned: the reference's answers; a
    rank's health still holds what the dead step recorded (nobody clears it)."""
    return [
        dict(a, health=list(d["health"]), step=d["step"] + 1)
        for a, d in zip(_answers(ref), dead_answers, strict=True)
    ]


def _realign(prob, ref, dead, after):
    return cases.realign_verdict(
        SMALL,
        ARCH,
        prob,
        ref,
        dead,
        after,
        dead_rank=3,
        start_step=7,
        wait_s=WAIT,
        give_up_s=GIVE_UP,
    )


def test_realign_verdict_passes_a_next_step_that_matches_with_health_kept(step):
    prob, ref = step
    dead = _dead()
    res = _realign(prob, ref, dead, _after(ref, dead))
    assert res["ok"] and res["problems"] == []
    assert res["health"][0].endswith("(kept from an earlier launch)") and res["health"][3] == "ok"
    assert res["steps_after_dead"] == {0: 8, 1: 8, 2: 8, 3: 7}
    assert res["steps_after_next"] == {0: 9, 1: 9, 2: 9, 3: 8}


def test_realign_verdict_fails_a_next_step_that_did_not_meet_and_names_the_step_counters(step):
    """What the kernels of this tree are predicted to do: the survivors began the next step at
    step 8, the dead rank at 7, so their all-reduce tags differ; nobody's output is written."""
    prob, ref = step
    dead = _dead()
    after = _after(ref, dead)
    after = [dict(a, out=torch.full_like(a["out"], float("nan"))) for a in after]
    # rank 3 (epoch of step 7) finds the survivors' dead-step flags for layer 0's attention
    # all-reduce matching its tag, reads those stale partials, and times out at the MLP one
    after[3]["health"] = [abi.STATUS_PEER_TIMEOUT, abi.PH_AR_MLP, 0, 7]
    res = _realign(prob, ref, dead, after)
    assert not res["ok"]
    first, second = res["problems"]
    assert first.startswith("the next step (no host reset) failed: rel err inf")
    assert "rank 3: timed out waiting for a peer rank's all-reduce partial (layer 0, MLP" in first
    assert second.startswith("the ranks began the next step with step counters rank 0: 8, ")
    assert "rank 3: 7" in second and f"step * {abi.EPOCH_SEQS} + launch number" in second


@pytest.mark.parametrize(
    ("rank", "change", "says"),
    [
        (1, {"health": [abi.STATUS_PEER_TIMEOUT, abi.PH_AR_ATTN, 2, 7]}, "rank 1: the dead step"),
        (0, {"health": [abi.STATUS_BARRIER_TIMEOUT, abi.PH_EMBED, 0, 7]}, "rank 0: the dead step"),
        (2, {"health": [abi.STATUS_PEER_TIMEOUT, abi.PH_AR_ATTN, 3, 6]}, "expected 'timed out"),
        (3, {"health": [abi.STATUS_PEER_TIMEOUT, abi.PH_AR_ATTN, 0, 7]}, "rank 3 never launched"),
        (2, {"seconds": GIVE_UP + 1}, "rank 2 gave up after"),
    ],
)
def test_realign_verdict_fails_a_dead_step_that_went_wrong(step, rank, change, says):
    prob, ref = step
    dead = _dead()
    after = _after(ref, dead)
    dead[rank] = dict(dead[rank], **change)
    res = _realign(prob, ref, dead, after)
    assert not res["ok"] and any(says in p for p in res["problems"]), res["problems"]


# ---------------------------------------------------------------- dead-rank verdict


def _dead_rank(prob, ref, dead, after):
    return cases.dead_rank_verdict(
        SMALL, ARCH, prob, ref, dead, after, dead_rank=3, wait_s=WAIT, give_up_s=GIVE_UP
    )


def test_dead_rank_verdict_passes_a_bounded_timeout_naming_the_dead_rank(step):
    """The host re-aligned the step counters and cleared health before the next step."""
    prob, ref = step
    res = _dead_rank(prob, ref, _dead(), _answers(ref))
    assert res["ok"] and res["problems"] == []
    assert res["dead_seconds"] == [WAIT + 0.05] * 3 and len(res["dead_health"]) == 3


@pytest.mark.parametrize(
    ("rank", "change", "says"),
    [
        (1, {"health": [abi.STATUS_PEER_TIMEOUT, abi.PH_AR_ATTN, 2, 7]}, "rank 1: the dead step"),
        (0, {"health": [abi.STATUS_PEER_TIMEOUT, abi.PH_AR_MLP, 3, 7]}, "naming rank 3"),
        (2, {"health": [0, 0, 0, 0]}, "rank 2: the dead step recorded 'ok'"),
        (3, {"health": [abi.STATUS_PEER_TIMEOUT, abi.PH_AR_ATTN, 0, 7]}, "rank 3 never launched"),
        (2, {"seconds": GIVE_UP + 1}, "rank 2 gave up after"),
        (1, {"seconds": WAIT / 2}, f"expected {WAIT:g} to"),  # gave up before its bound
    ],
)
def test_dead_rank_verdict_fails_a_dead_step_that_went_wrong(step, rank, change, says):
    prob, ref = step
    dead = _dead()
    dead[rank] = dict(dead[rank], **change)
    res = _dead_rank(prob, ref, dead, _answers(ref))
    assert not res["ok"] and any(says in p for p in res["problems"]), res["problems"]


def test_dead_rank_verdict_fails_a_wrong_step_after_the_failure(step):
    prob, ref = step
    after = _answers(ref)
    after[2] = dict(after[2], out=after[2]["out"] * 1.5)  # stale partials summed, say
    res = _dead_rank(prob, ref, _dead(), after)
    assert not res["ok"] and len(res["problems"]) == 1, res["problems"]
    assert res["problems"][0].startswith("the step after the failure: rel err")


def test_the_gpu_session_has_the_dead_rank_bounds_its_checks_read():
    """``_dead_rank_check`` and the short-wait runner read them from the session (the emulated
    session overrides them): the GPU session must carry its own."""
    assert st.Session.dead_rank_wait_s == WAIT and st.Session.dead_rank_give_up_s == GIVE_UP
    assert st.Session.dead_rank_requests == 1  # the cheapest step on a GPU: one narrow launch


def test_judge_accepts_kept_health_only_when_it_is_exactly_the_earlier_failure(step):
    prob, ref = step
    earlier = [abi.STATUS_PEER_TIMEOUT, abi.PH_AR_ATTN, 3, 7]
    answers = [dict(a, health=list(earlier)) for a in _answers(ref)]
    assert not cases.judge(SMALL, ARCH, prob, ref, answers)["ok"]  # no prior: a failure
    prior = {r: earlier for r in range(4)}
    assert cases.judge(SMALL, ARCH, prob, ref, answers, prior_health=prior)["ok"]
    changed = [dict(a, health=[*earlier[:3], 8]) for a in answers]  # a new failure: step 8
    assert not cases.judge(SMALL, ARCH, prob, ref, changed, prior_health=prior)["ok"]
    clean = {r: [0, 0, 0, 0] for r in range(4)}  # a rank clean before must be clean after
    assert not cases.judge(SMALL, ARCH, prob, ref, answers, prior_health=clean)["ok"]
