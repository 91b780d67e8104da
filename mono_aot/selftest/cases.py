"""The selftest's problems and verdicts, on the CPU: which request counts each check runs, the
requests of a step, the float64 and kernel-numerics references of a whole step, and the verdict
on the ranks' answers. No GPU and no rank process here, so all of it is tested on any machine.

A step of R requests is judged as a whole: the runner splits it into launches of at most
``chunk_reqs`` requests (each its own variant), and a request's rows depend only on its own
inputs and cache blocks, so the reference of the whole step is the oracle for every launch of
it at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mono_aot.reference.step import compare_caches, kv_spread, norm_rel_error
from mono_aot.spec import abi
from mono_aot.spec.util import ceil_div

if TYPE_CHECKING:
    import torch

    from mono_aot.reference import Problem, RequestSpec, TPResult
    from mono_aot.spec.layouts import Layout, Variant

TOLERANCE = 2e-2  # ||out - ref|| / ||ref||
# contexts the problems cycle through: empty, short, around one attention partition, long
CONTEXTS = (0, 23, 255, 256, 700, 3001, 40, 1500)
SPARE_BLOCKS = 3  # make_problem's spare (NaN) blocks, which block-table garbage points at


def request_counts(layout: Layout, variant: Variant) -> list[int]:
    """Every request count one launch of ``variant`` serves."""
    lo, hi = layout.variant_reqs(variant)
    return list(range(lo, hi + 1))


def multi_launch_counts(layout: Layout) -> list[int]:
    """Steps of several launches: a full chunk then the smallest narrow and wide tails (8+1,
    8+2, 8+3 on the shipped layout; a narrow tail only when the layout has a narrow kernel),
    two full chunks, and three launches ending in the smallest wide one (8+8+3)."""
    s = layout.serving
    c, w = s.chunk_reqs, s.wide_base
    counts = {c + 1, c + min(2, c), c + w, 2 * c, 2 * c + w}
    return sorted(n for n in counts if c < n <= s.max_reqs)


def step_counts(layout: Layout, chunks: int = 3) -> list[int]:
    """Every request count of a step up to ``chunks`` launches (capped at ``max_reqs``)."""
    return list(range(1, min(chunks * layout.serving.chunk_reqs, layout.serving.max_reqs) + 1))


def launches(layout: Layout, requests: int) -> list[tuple[int, int, str]]:
    """``(first request, requests, variant)`` of each launch the runner makes for a step (the
    runner's own rule, restated so a problem's description needs no runner)."""
    s = layout.serving
    out = []
    for r0 in range(0, requests, s.chunk_reqs):
        k = min(s.chunk_reqs, requests - r0)
        out.append((r0, k, "wide" if k >= s.wide_base else "narrow"))
    return out


def describe_launches(layout: Layout, requests: int) -> str:
    """``"wide 8 + narrow 1"``."""
    return " + ".join(f"{v} {k}" for _, k, v in launches(layout, requests))


def request_specs(layout: Layout, count: int, salt: int = 0) -> list[RequestSpec]:
    """``count`` requests with mixed contexts: every third has its last three tokens unwritten
    (slot -1), every fourth with a context attends to fewer positions than its block reaches."""
    from mono_aot.reference import RequestSpec

    qpr = layout.serving.qpr
    out = []
    for i in range(count):
        ctx = CONTEXTS[(i + salt) % len(CONTEXTS)]
        written = None
        seq_len = None
        if i % 3 == 1:
            written = tuple(t < qpr - 3 for t in range(qpr))
        if i % 4 == 2 and ctx > 0:
            seq_len = ctx + qpr // 2
        out.append(RequestSpec(context=ctx, written=written, seq_len=seq_len))
    return out


def cache_blocks(layout: Layout, max_requests: int) -> int:
    """KV cache blocks per layer that hold any problem of up to ``max_requests`` requests."""
    s = layout.serving
    per_request = ceil_div(max(CONTEXTS) + s.qpr, s.kv_block)
    return max_requests * per_request + SPARE_BLOCKS


def max_position(layout: Layout) -> int:
    """Rows of the rope cache every problem's positions fit in."""
    return max(CONTEXTS) + layout.serving.qpr + 5


@dataclass
class Reference:
    """What a step is judged against: the float64 result, the kernel-numerics result (its
    ``kv_prequant`` places fp8 rounding boundaries) and the caches after that step."""

    ref64: TPResult
    refk: TPResult
    caches: list[list[torch.Tensor]]


def with_rope(prob: Problem, cos_sin: torch.Tensor) -> Problem:
    """``prob`` with the rope cache the ranks hold (a longer one: row p is the same)."""
    return dataclasses.replace(prob, inputs=dataclasses.replace(prob.inputs, cos_sin=cos_sin))


def reference(layout: Layout, arch: str, prob: Problem) -> Reference:
    from mono_aot.reference import run_tp

    ranks, inputs = prob.ranks, prob.inputs
    ref64 = run_tp(layout, arch, ranks, prob.caches(), inputs, "float64")
    caches = prob.caches()
    refk = run_tp(layout, arch, ranks, caches, inputs, "kernel")
    return Reference(ref64, refk, caches)


def _on_own_bytes(
    layout: Layout, arch: str, prob: Problem, ref: Reference, answers: Sequence[dict[str, Any]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 step's and the stock-numerics model's outputs given the K/V bytes each
    answering rank wrote at the step's written slots (see ``judge``)."""
    from mono_aot.reference import run_tp

    n = prob.inputs.x.shape[0]
    slots = prob.inputs.slots[:n]
    written = (slots >= 0).nonzero().flatten()
    s = slots[written]
    B = layout.serving.kv_block
    forced = [r.kv.clone() for r in ref.refk.ranks]
    for a in answers:
        kv = forced[a["rank"]]
        for li, cache in enumerate(a["caches"]):
            kv[li, written] = cache[s // B, :, s % B, :]
    return tuple(
        run_tp(layout, arch, prob.ranks, prob.caches(), prob.inputs, numerics, forced).out
        for numerics in ("float64", "stock")
    )


def judge(
    layout: Layout,
    arch: str,
    prob: Problem,
    ref: Reference,
    answers: Sequence[dict[str, Any]],
    ranks: Sequence[int] | None = None,
    prior_health: Mapping[int, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """The verdict on the ranks' answers to one step.

    An answer: ``rank``, ``out`` (the step's output), ``caches`` (the rank's caches after the
    step, the problem's blocks), ``health`` (the runner's health words) and optionally
    ``outside_bad`` (bytes changed in cache blocks past the problem's, which nobody may write).
    Passes when on every rank ``||out - own|| / ||own|| <= TOLERANCE``, every cache byte
    equals the kernel-numerics reference's (a written code may differ only near an fp8
    rounding boundary), no byte outside changed, and health is OK.

    ``own`` is the float64 step run on the K/V bytes the kernels wrote (``force_kv``; a rank
    not judged contributes the kernel-numerics reference's bytes). The step is chaotic at the
    fp8 level: bf16 storage moves values across fp8 rounding midpoints, each such code moves
    by ~6 %, and over 5 layers the two legal executions drift apart -- the kernel-numerics
    reference itself lands 2.1e-2 (small layout) and 6.8e-2 (shipped geometry) from the
    free-running float64 one, but 5e-3 and 6.7e-3 from the float64 step on its own bytes. The
    bytes are judged on their own (``compare_caches``); the output, given those bytes. Reported,
    not judged: the free-running distance (``float64_rel_error``) and, for comparison, how far
    a model of vLLM's stock numerics (``"stock"`` in ``mono_aot/reference/step.py``: bf16
    activations quantised to MXFP8 into every projection) lands from the same float64 step on
    the same bytes (``stock_rel_error``).

    ``prior_health``: by rank, the health words an earlier launch recorded and nobody cleared
    (the runner never clears them, and the kernels keep the first failure): on such a rank
    health passes when it still holds exactly those words; the output and caches decide.
    """
    n = prob.inputs.x.shape[0]
    slots = prob.inputs.slots[:n]
    judged = [a for a in answers if ranks is None or a["rank"] in ranks]
    if not judged:
        raise ValueError("no answer to judge")
    own, stock = _on_own_bytes(layout, arch, prob, ref, judged)
    errs: list[float] = []
    free: list[float] = []
    bad = tol = 0
    findings: list[dict[str, Any]] = []
    health: list[list[int]] = []
    health_ok: list[bool] = []
    kept: list[bool] = []
    for a in judged:
        r = a["rank"]
        errs.append(norm_rel_error(a["out"], own))
        free.append(norm_rel_error(a["out"], ref.ref64.out))
        found: list[dict[str, Any]] = []
        b, t = compare_caches(
            layout, arch, a["caches"], ref.caches[r], slots, ref.refk.ranks[r].kv_prequant, found,
            kv_spread(ref.ref64.ranks[r], ref.refk.ranks[r], arch),
        )  # fmt: skip
        findings += [{"rank": r, **x} for x in found]
        bad += b + int(a.get("outside_bad", 0))
        tol += t
        h = [int(w) for w in a["health"]]
        prior = [int(w) for w in prior_health[r]] if prior_health and r in prior_health else None
        health.append(h)
        kept.append(prior is not None and prior[abi.H_STATUS] != abi.STATUS_OK and h == prior)
        health_ok.append(h[abi.H_STATUS] == abi.STATUS_OK or kept[-1])
    ok = all(e <= TOLERANCE for e in errs) and bad == 0 and all(health_ok)
    reqs = len(prob.requests)
    return {
        "requests": reqs,
        "tokens": n,
        "launches": describe_launches(layout, reqs),
        "ok": ok,
        "max_rel_error": max(errs),
        "float64_rel_error": max(free),
        "stock_rel_error": norm_rel_error(stock, own),
        "kv_bad_bytes": bad,
        "kv_near_boundary": tol,
        **({"kv_findings": findings} if findings else {}),
        "health": [
            abi.describe_health(h) + (" (kept from an earlier launch)" if k else "")
            for h, k in zip(health, kept, strict=True)
        ],
    }


# ---------------------------------------------------------------- dead rank


def dead_step_problems(
    dead: Sequence[dict[str, Any]],
    dead_rank: int,
    want: Sequence[int],
    wait_s: float,
    give_up_s: float,
    expected: str,
) -> tuple[list[str], dict[int, list[int]]]:
    """What is wrong with the answers to a step ``dead_rank`` never launched, and each rank's
    health words: every other rank must have recorded ``want`` (the first health words;
    ``expected`` says it in words) after waiting at least ``wait_s`` (the kernels' bound: giving
    up sooner would break a slow but live peer) and at most ``give_up_s``; the dead rank's
    health must still be 0."""
    problems: list[str] = []
    health: dict[int, list[int]] = {}
    for a in dead:
        r, h = a["rank"], [int(w) for w in a["health"]]
        health[r] = h
        if r == dead_rank:
            if h[abi.H_STATUS] != abi.STATUS_OK:
                problems.append(f"rank {r} never launched yet has health {abi.describe_health(h)}")
            continue
        if h[: len(want)] != list(want):
            problems.append(
                f"rank {r}: the dead step recorded '{abi.describe_health(h)}', expected {expected}"
            )
        if not wait_s <= a["seconds"] <= give_up_s:
            problems.append(
                f"rank {r} gave up after {a['seconds']:.4g} s (expected {wait_s:g} to "
                f"{give_up_s:g} s: one wait bound, then the launch ends)"
            )
    return problems, health


def dead_rank_verdict(
    layout: Layout,
    arch: str,
    prob: Problem,
    ref: Reference,
    dead: Sequence[dict[str, Any]],
    after: Sequence[dict[str, Any]],
    *,
    dead_rank: int,
    wait_s: float,
    give_up_s: float,
) -> dict[str, Any]:
    """The dead-rank check: ``dead`` are the answers to a step in which ``dead_rank`` never
    launched (health cleared before it); ``after`` the answers to the next step on every rank,
    the host having set one step counter on all of them and cleared health, judged against
    ``prob``'s reference.

    Passes when every other rank recorded a peer timeout in layer 0's attention all-reduce
    naming ``dead_rank`` between ``wait_s`` and ``give_up_s`` (``dead_step_problems``), the
    dead rank's health stayed 0, and the next step passes ``judge``.
    """
    want = [abi.STATUS_PEER_TIMEOUT, abi.PH_AR_ATTN, dead_rank]
    problems, _ = dead_step_problems(
        dead, dead_rank, want, wait_s, give_up_s,
        f"a peer timeout in layer 0's attention all-reduce naming rank {dead_rank}",
    )  # fmt: skip
    res = judge(layout, arch, prob, ref, after)
    if not res["ok"]:
        problems.append(
            f"the step after the failure: rel err {res['max_rel_error']:.2e}, K/V bad bytes "
            f"{res['kv_bad_bytes']}, health " + ", ".join(res["health"])
        )
    live = [a for a in dead if a["rank"] != dead_rank]
    res.update(
        ok=not problems,
        problems=problems,
        dead_health=[abi.describe_health(a["health"]) for a in live],
        dead_seconds=[float(a["seconds"]) for a in live],
    )
    return res


# ---------------------------------------------------------------- dead rank, no host re-align


def realign_verdict(
    layout: Layout,
    arch: str,
    prob: Problem,
    ref: Reference,
    dead: Sequence[dict[str, Any]],
    after: Sequence[dict[str, Any]],
    *,
    dead_rank: int,
    start_step: int,
    wait_s: float,
    give_up_s: float,
) -> dict[str, Any]:
    """The dead-rank-realign check: ``dead`` are the answers to a step every rank began at
    ``start_step`` with health 0, in which ``dead_rank`` never launched; ``after`` are the
    answers to the next step on every rank with no host reset of ``step`` or ``health``, judged
    against ``prob``'s reference.

    Passes when every other rank gave up between ``wait_s`` and ``give_up_s`` with a peer
    timeout in layer 0's attention all-reduce naming ``dead_rank`` at ``start_step``
    (``dead_step_problems``), the dead rank's health stayed 0, and the next step matches the
    reference on every rank, each rank's health being 0 or still the failure the dead step
    recorded (the kernels keep the first failure; nobody clears it).
    """
    want = [abi.STATUS_PEER_TIMEOUT, abi.PH_AR_ATTN, dead_rank, start_step]
    problems, prior = dead_step_problems(
        dead, dead_rank, want, wait_s, give_up_s, f"'{abi.describe_health(want)}'"
    )
    res = judge(layout, arch, prob, ref, after, prior_health=prior)
    steps_dead = {a["rank"]: int(a["step"]) for a in dead}
    steps_after = {a["rank"]: int(a["step"]) for a in after}
    if not res["ok"]:
        problems.append(
            f"the next step (no host reset) failed: rel err {res['max_rel_error']:.2e}, K/V bad "
            f"bytes {res['kv_bad_bytes']}, health "
            + "; ".join(f"rank {a['rank']}: {h}" for a, h in zip(after, res["health"], strict=True))
        )
        if len(set(steps_dead.values())) > 1:
            problems.append(
                "the ranks began the next step with step counters "
                + ", ".join(f"rank {r}: {s}" for r, s in sorted(steps_dead.items()))
                + f" (the all-reduce tags derive from it: epoch = step * {abi.EPOCH_SEQS} + "
                "launch number), and nothing re-aligned them"
            )
    res.update(
        ok=not problems,
        problems=problems,
        steps_after_dead=steps_dead,
        steps_after_next=steps_after,
    )
    return res


# ---------------------------------------------------------------- late dispatch

# Each XCD of the device (8 on MI300X/MI355X, 6 on MI300A) needs a CU of a masked stream: the
# driver deals mask bits to the XCDs in turn, and a queue that leaves one without a CU never
# runs the workgroups dispatched to it.
LATE_MIN_CUS = 8


def late_mask(cus: int, per_cu: int) -> tuple[int, list[int]]:
    """``(enabled CUs, uint32 words)``: the CU mask of the late-dispatch check's first launch.
    The lowest ``max(LATE_MIN_CUS, cus // (4 * per_cu))`` CUs, where ``per_cu`` workgroups of the
    kernel fit on one CU, so at most a quarter of the launch's ``cus`` workgroups are resident
    at once and the rest are dispatched only after those gave up waiting."""
    if cus <= 0 or per_cu <= 0:
        raise ValueError(f"late_mask: {cus} CUs, {per_cu} workgroups per CU")
    enabled = max(LATE_MIN_CUS, cus // (4 * per_cu))
    if enabled * per_cu >= cus:
        raise ValueError(
            f"late_mask: {cus} CUs with {per_cu} workgroups per CU: {enabled} CUs (at least "
            f"{LATE_MIN_CUS}) would hold all {cus} workgroups, none would be dispatched late"
        )
    words = [(1 << min(32, max(0, enabled - 32 * w))) - 1 for w in range(ceil_div(cus, 32))]
    return enabled, words


def late_verdict(
    layout: Layout,
    arch: str,
    prob: Problem,
    ref: Reference,
    answers: Sequence[dict[str, Any]],
    *,
    wait_s: float,
    give_up_s: float,
) -> dict[str, Any]:
    """The late-dispatch check: each answer's ``first`` is a launch of ``prob`` on a stream
    whose CU mask keeps most workgroups waiting for a CU until the others gave up (``health``,
    ``seconds``, ``step`` at launch, ``out_written``: output elements no longer NaN,
    ``kv_changed``: cache bytes that differ from before it, ``mask_cus``); the rest of the
    answer is the second launch of ``prob`` on the same scratch, health cleared in between.

    Passes when on every rank the first launch recorded a grid-barrier timeout in the embed
    phase at its own step after waiting at least ``wait_s`` and at most ``give_up_s``, wrote
    no output and no cache byte, and the second passes ``judge`` at the next step.
    """
    problems: list[str] = []
    for a in answers:
        r, f = a["rank"], a["first"]
        h = [int(w) for w in f["health"]]
        want = [abi.STATUS_BARRIER_TIMEOUT, abi.PH_EMBED]
        if h[: abi.H_PEER] != want or h[abi.H_STEP] != f["step"]:
            problems.append(
                f"rank {r}: the late launch recorded '{abi.describe_health(h)}', expected a grid "
                f"barrier timeout in layer 0, embed, step {f['step']}"
            )
        if not wait_s <= f["seconds"] <= give_up_s:
            problems.append(
                f"rank {r}: the late launch took {f['seconds']:.2f} s (expected {wait_s:g} to "
                f"{give_up_s:g} s: one wait bound, then the late workgroups skip everything)"
            )
        if f["out_written"] or f["kv_changed"]:
            problems.append(
                f"rank {r}: the failed launch wrote {f['out_written']} output elements and "
                f"{f['kv_changed']} cache bytes"
            )
        if int(a["step"]) != f["step"] + 2:
            problems.append(
                f"rank {r}: step counter {a['step']} after two launches from {f['step']}"
            )
    res = judge(layout, arch, prob, ref, answers)
    if not res["ok"]:
        problems.append(
            f"the second launch: rel err {res['max_rel_error']:.2e}, K/V bad bytes "
            f"{res['kv_bad_bytes']}, health " + ", ".join(res["health"])
        )
    res.update(
        ok=not problems,
        problems=problems,
        first_health=[abi.describe_health(a["first"]["health"]) for a in answers],
        first_seconds=[round(float(a["first"]["seconds"]), 3) for a in answers],
        mask_cus=[a["first"]["mask_cus"] for a in answers],
    )
    return res
