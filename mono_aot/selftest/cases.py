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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mono_aot.reference.step import compare_caches, norm_rel_error
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


def judge(
    layout: Layout,
    arch: str,
    prob: Problem,
    ref: Reference,
    answers: Sequence[dict[str, Any]],
    ranks: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The verdict on the ranks' answers to one step.

    An answer: ``rank``, ``out`` (the step's output), ``caches`` (the rank's caches after the
    step, the problem's blocks), ``health`` (the runner's health words) and optionally
    ``outside_bad`` (bytes changed in cache blocks past the problem's, which nobody may write).
    Passes when on every rank ``||out - ref64|| / ||ref64|| <= TOLERANCE``, every cache byte
    equals the kernel-numerics reference's (a written code may differ only near an fp8
    rounding boundary), no byte outside changed, and health is OK.
    """
    n = prob.inputs.x.shape[0]
    slots = prob.inputs.slots[:n]
    errs: list[float] = []
    bad = tol = 0
    health: list[list[int]] = []
    for a in answers:
        r = a["rank"]
        if ranks is not None and r not in ranks:
            continue
        errs.append(norm_rel_error(a["out"], ref.ref64.out))
        b, t = compare_caches(
            layout, arch, a["caches"], ref.caches[r], slots, ref.refk.ranks[r].kv_prequant
        )
        bad += b + int(a.get("outside_bad", 0))
        tol += t
        health.append([int(w) for w in a["health"]])
    if not errs:
        raise ValueError("no answer to judge")
    ok = (
        all(e <= TOLERANCE for e in errs)
        and bad == 0
        and all(h[abi.H_STATUS] == abi.STATUS_OK for h in health)
    )
    reqs = len(prob.requests)
    return {
        "requests": reqs,
        "tokens": n,
        "launches": describe_launches(layout, reqs),
        "ok": ok,
        "max_rel_error": max(errs),
        "kv_bad_bytes": bad,
        "kv_near_boundary": tol,
        "health": [abi.describe_health(h) for h in health],
    }
