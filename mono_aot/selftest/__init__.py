"""``mono-aot selftest``: run the stored drafter kernels on this machine's GPUs and judge them.

It checks the bytes that ship: the code objects come out of the store through the runtime's
loader (``load_launcher``, by the same lookup key vLLM would use) and run through the runtime's
own ``DrafterRunner``, ``PeerBuffer`` (HIP IPC over a gloo group) and launchers. A kernel
missing from the store follows the runtime's miss policy (``mono_aot.selftest.artifacts``):
strict mode is an error, otherwise it is built once, before the ranks start; only that build
needs FlyDSL.

The checks (each prints one verdict):

- ``narrow`` / ``wide``: one step for every request count the variant serves in one launch.
  Each problem (``mono_aot.reference.make_problem``) has mixed contexts including split
  attention, slot -1 tokens, a short ``seq_len``, blocks in random order, a strided block
  table, garbage past every input's end, NaN codes in every cache byte no request may read and
  a NaN-poisoned output. Judged against the float64 reference (``mono_aot.selftest.cases``):
  ``||out - ref|| / ||ref|| <= 2e-2`` on every rank, health 0, written K/V bytes equal to the
  kernel-numerics reference's (a code may differ only within rounding error of an fp8 rounding
  boundary), every other byte untouched.
- ``multi-launch``: steps of several launches, which the runner makes above ``chunk_reqs``
  requests (8+1, 8+2, 8+3, 8+8 and 8+8+3 on the shipped layout: narrow and wide launches in one
  step), judged the same way as a whole.
- ``dead-rank``: the last rank never launches; the others must finish (a layout with a short
  wait bound: its own kernels) with a peer timeout in layer 0 recorded against that rank in
  ``health``; then a full step on the same peer buffers must pass again (the host sets every
  rank's step counter to one value and clears health before it).
- ``dead-rank-realign``: the last rank skips a step (the others must record the peer timeout
  naming it, as above), then the next step runs on every rank with no host reset of ``step``
  or ``health`` and must pass against the reference (``cases.realign_verdict``): the promise
  that a rank that missed a step is back in line at the next one. A rank that never called
  ``forward`` did not advance its step counter, from which the kernels derive their all-reduce
  tags; when the check fails, its detail gives every rank's step counter.
- ``late-dispatch``: per variant, one launch on a stream whose CU mask enables at most a
  quarter of the CUs (``cases.late_mask``), so most workgroups are dispatched only after the
  first ones gave up at the first grid barrier, past the wait bound; it must record a grid
  barrier timeout (embed phase) and write no output or cache byte. Then, health read and
  cleared, the next launch on the same scratch with every CU must pass against the reference
  (``cases.late_verdict``).
- ``graph-replay``: one step captured as a graph on every rank and replayed ``replays`` times
  with no host reset; health stays 0 and output and caches still match the reference.

The ranks are processes of a ``mono_aot.selftest.cluster.Cluster``, one GPU each. Without a
usable set of GPUs the selftest raises ``NoDevice`` (exit code 3) and claims nothing.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mono_aot.selftest.cases import (
    CONTEXTS,
    TOLERANCE,
    describe_launches,
    launches,
    multi_launch_counts,
    request_counts,
    request_specs,
    step_counts,
)
from mono_aot.spec import abi
from mono_aot.spec.errors import EXIT_NO_DEVICE, BadInput, MonoError

if TYPE_CHECKING:
    from mono_aot.reference import Problem
    from mono_aot.selftest.cases import Reference
    from mono_aot.selftest.cluster import Cluster
    from mono_aot.spec.layouts import Layout, Variant

CHECKS: tuple[str, ...] = (
    "narrow",
    "wide",
    "multi-launch",
    "dead-rank",
    "dead-rank-realign",
    "late-dispatch",
    "graph-replay",
)
SHORT_WAIT_CHECKS = ("dead-rank", "dead-rank-realign", "late-dispatch")  # the 0.5 s kernels
DEFAULT_REPLAYS = 100
DEAD_RANK_WAIT_S = 0.5  # the wait bound of the short-wait kernels (seconds)
GIVE_UP_S = 10 * DEAD_RANK_WAIT_S + 20  # the most a failing short-wait step may take
INIT_TIMEOUT_S = 900.0  # weights onto the GPU, kernels loaded, peer buffers mapped
STEP_TIMEOUT_S = 600.0  # one step, results read back

__all__ = [
    "CHECKS",
    "CONTEXTS",
    "DEAD_RANK_WAIT_S",
    "DEFAULT_REPLAYS",
    "SHORT_WAIT_CHECKS",
    "TOLERANCE",
    "CheckResult",
    "NoDevice",
    "SelftestFailure",
    "Session",
    "find_devices",
    "multi_launch_counts",
    "request_counts",
    "request_specs",
    "run_selftest",
    "step_counts",
]


class NoDevice(MonoError):
    """This machine cannot run the selftest (no ROCm GPU, too few, or the wrong kind)."""

    exit_code = EXIT_NO_DEVICE


class SelftestFailure(MonoError):
    """A check could not run to its verdict (a rank crashed or hung)."""


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str
    seconds: float = 0.0
    cases: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "check": self.name,
            "ok": self.ok,
            "detail": self.detail,
            "seconds": round(self.seconds, 1),
            "cases": self.cases,
        }


# ---------------------------------------------------------------- devices


def find_devices(layout: Layout) -> tuple[str, list[int]]:
    """``(arch, device indices)`` of ``tp`` GPUs of one targeted arch with the layout's CU
    count, or ``NoDevice`` saying why not. Needs a ROCm torch, never FlyDSL."""
    try:
        import torch
    except ImportError:
        raise NoDevice("torch is not installed (nothing was tested)") from None
    if not getattr(torch.version, "hip", None):
        raise NoDevice(
            "this torch is not a ROCm build: no AMD GPU can be used (nothing was tested)"
        )
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise NoDevice("no ROCm device is visible (nothing was tested)")
    from mono_aot.spec.arch import base_arch

    tp = layout.parallel.tp
    by_arch: dict[str, list[int]] = {}
    why = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        arch = base_arch(getattr(props, "gcnArchName", ""))
        if arch not in layout.targets:
            why.append(
                f"GPU {i} is {arch or 'unknown'}, layout {layout.name} targets "
                f"{', '.join(layout.archs)}"
            )
            continue
        if props.multi_processor_count != layout.ctas(arch):
            why.append(
                f"GPU {i} ({arch}) has {props.multi_processor_count} CUs; the kernels need "
                f"{layout.ctas(arch)} co-resident workgroups"
            )
            continue
        by_arch.setdefault(arch, []).append(i)
    for arch, devs in sorted(by_arch.items()):
        if len(devs) >= tp:
            return arch, devs[:tp]
    found = ", ".join(f"{len(d)} x {a}" for a, d in sorted(by_arch.items())) or "none usable"
    raise NoDevice(
        f"the selftest runs the {tp} TP ranks on {tp} GPUs of one kind; found {found}"
        + (f" ({'; '.join(why)})" if why else "")
        + " (nothing was tested)"
    )


# ---------------------------------------------------------------- a session: model + ranks


class Session:
    """One selftest run: a random fp8-exact model, its rank processes (one GPU each, each with
    a ``DrafterRunner`` over the model), and the steps run on them and judged.

    ``max_requests``: the largest step any case will run (sizes the KV caches); ``dead_rank``:
    also build a runner over the short-wait layout (``runner="short"`` in ``step``; the
    dead-rank, dead-rank-realign and late-dispatch checks).
    """

    # the short-wait kernels' bound (``short``: this or the layout's own if shorter), the most
    # a live rank may take to give up on a dead peer (host launch and sync included) and the
    # dead-rank check's step; the emulated session (mono_aot/selftest/emulated.py) has its own
    dead_rank_wait_s = DEAD_RANK_WAIT_S
    dead_rank_give_up_s = GIVE_UP_S
    dead_rank_requests = 1

    @property
    def short_wait_s(self) -> float:
        """The wait bound the short-wait runner's kernels run with."""
        assert self.short is not None, "a session built without dead_rank has no short runner"
        return self.short.serving.peer_wait_s

    def __init__(
        self,
        layout: Layout,
        arch: str,
        devices: Sequence[int],
        *,
        seed: int = 0,
        max_requests: int | None = None,
        dead_rank: bool = False,
        log: Callable[[str], None] = lambda s: None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        import torch

        from mono_aot.reference import random_packed_model, rope_cache
        from mono_aot.reference.fp8 import resolve_format
        from mono_aot.selftest import artifacts
        from mono_aot.selftest.cases import cache_blocks, max_position
        from mono_aot.selftest.cluster import Cluster
        from mono_aot.selftest.rank import init_rank

        self.torch = torch
        self.layout = layout
        self.arch = arch
        self.seed = seed
        self.log = log
        self.devices = list(devices)
        self.cases = 0
        self.cluster: Cluster | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="mono-aot-selftest-")
        self.dir = Path(self._tmp.name)
        try:
            self.short = (
                artifacts.short_wait_layout(layout, self.dead_rank_wait_s) if dead_rank else None
            )
            status = artifacts.ensure_kernels(
                artifacts.needs(layout, self.short), arch, self.dir, log=log, env=env
            )
            log("kernels: " + ", ".join(f"{k} {v}" for k, v in status.items()))
            log(f"random fp8-exact model (seed {seed}) ...")
            self.model = random_packed_model(layout, arch, seed)
            self.rope = rope_cache(max_position(layout), layout.model.rotary_dim)
            rope_path = self.dir / "rope.pt"
            torch.save(self.rope, rope_path)
            weights = []
            for r, w in enumerate(self.model):
                p = self.dir / f"weights-rank{r}.pt"
                torch.save(
                    {
                        "packed": dict(w.packed), "norms": dict(w.norms), "k_scale": w.k_scale,
                        "v_scale": w.v_scale, "final_norm": w.final_norm,
                    },
                    p,
                )  # fmt: skip
                weights.append(p)
            self.weight_files = weights  # by rank: what each rank process loads
            self.max_requests = max_requests or layout.serving.chunk_reqs
            blocks = cache_blocks(layout, self.max_requests)
            nan_code = resolve_format(arch).nan_code
            tp = layout.parallel.tp
            log(f"starting {tp} rank processes on GPUs {self.devices} ...")
            self.cluster = Cluster(
                tp, envs=[{"MONO_AOT_STRICT": "1"}] * tp, workdir=self.dir / "ranks"
            )
            msgs = [
                {
                    "device": self.devices[r], "layout": layout, "short": self.short,
                    "weights": str(weights[r]), "blocks": blocks, "rope": str(rope_path),
                    "nan_code": nan_code,
                }
                for r in range(tp)
            ]  # fmt: skip
            self.kernels = self.cluster.run(init_rank, msgs, timeout=INIT_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    # ---- problems and references (CPU)

    def problem(self, specs: Sequence[Any]) -> Problem:
        from mono_aot.reference import make_problem
        from mono_aot.selftest.cases import SPARE_BLOCKS, with_rope

        self.cases += 1
        prob = make_problem(
            self.layout,
            self.arch,
            specs,
            seed=self.seed + self.cases,
            model=self.model,
            spare_blocks=SPARE_BLOCKS,
        )
        return with_rope(prob, self.rope)

    def reference(self, prob: Problem) -> Reference:
        from mono_aot.selftest.cases import reference

        return reference(self.layout, self.arch, prob)

    def judge(
        self,
        prob: Problem,
        answers: Sequence[dict[str, Any]],
        ranks: Sequence[int] | None = None,
        ref: Reference | None = None,
    ) -> dict[str, Any]:
        from mono_aot.selftest.cases import judge

        ref = ref if ref is not None else self.reference(prob)
        return judge(self.layout, self.arch, prob, ref, answers, ranks)

    def save_case(self, prob: Problem) -> tuple[Path, list[Path]]:
        """The step's inputs (one file, the strided block table kept as a view of its base)
        and each rank's pre-step caches (one file each)."""
        return save_case(prob, self.dir, self.cases)

    # ---- steps (GPU)

    def step(
        self, prob: Problem, *, launch: Sequence[bool] | None = None, **extra: Any
    ) -> list[dict[str, Any]]:
        """Run ``prob`` as one step on every rank (``extra``: see ``rank.run_step``)."""
        from mono_aot.selftest.rank import run_step

        assert self.cluster is not None
        reqs = len(prob.requests)
        if reqs > self.max_requests:
            raise BadInput(f"a step of {reqs} requests; this session holds {self.max_requests}")
        common, caches = self.save_case(prob)
        tp = self.layout.parallel.tp
        launch = list(launch) if launch is not None else [True] * tp
        msgs = [
            {"case": str(common), "caches": str(caches[r]), "launch": launch[r], **extra}
            for r in range(tp)
        ]
        timeout = STEP_TIMEOUT_S + 5.0 * int(extra.get("replays", 0))
        return self.cluster.run(run_step, msgs, timeout=timeout)

    def run_counts(self, counts: Sequence[int], label: str) -> list[dict[str, Any]]:
        """One judged step per request count; each verdict also checks the launches the
        runner made are the ones ``cases.launches`` says."""
        out = []
        for count in counts:
            prob = self.problem(request_specs(self.layout, count, salt=count))
            answers = self.step(prob)
            res = self.judge(prob, answers)
            want = [list(c) for c in launches(self.layout, count)]
            got = [[list(c) for c in a["chunks"]] for a in answers]
            if any(g != want for g in got):
                res["ok"] = False
                res["launch_mismatch"] = f"the runner launched {got[0]}, expected {want}"
            self.log(
                f"  {label} {count} request(s) ({res['launches']}): rel err "
                f"{res['max_rel_error']:.2e}, K/V bad bytes {res['kv_bad_bytes']}"
                + ("" if res["ok"] else " FAIL")
            )
            out.append(res)
        return out

    def close(self) -> None:
        if self.cluster is not None and not self.cluster.closed:
            from mono_aot.selftest.rank import close_rank

            try:
                self.cluster.run(close_rank, timeout=120.0)
            except MonoError:
                pass  # the cluster is killed either way
            self.cluster.close()
        self._tmp.cleanup()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def case_inputs(prob: Problem) -> dict[str, Any]:
    """The step's inputs as ``mono_aot.selftest.rank.stage_step`` reads them: the strided
    block table kept as a view of its contiguous base."""
    inp = prob.inputs
    bt = inp.block_table
    base = bt._base if bt._base is not None and bt._base.is_contiguous() else bt.contiguous()
    if base is not bt._base:  # bt itself re-laid out: its own strides
        bt = base
    return {
        "x": inp.x, "positions": inp.positions, "slots": inp.slots,
        "seq_lens": inp.seq_lens, "bt_base": base.contiguous(),
        "bt_shape": tuple(bt.shape), "bt_stride": tuple(bt.stride()),
        "bt_offset": bt.storage_offset() - base.storage_offset(),
    }  # fmt: skip


def save_case(prob: Problem, directory: Path, index: int) -> tuple[Path, list[Path]]:
    """``case_inputs`` in one file, and each rank's pre-step caches in one file each."""
    import torch

    path = directory / f"case-{index}.pt"
    torch.save(case_inputs(prob), path)
    caches = []
    for r, rank_caches in enumerate(prob.caches()):
        p = directory / f"case-{index}-rank{r}.pt"
        torch.save(rank_caches, p)
        caches.append(p)
    return path, caches


# ---------------------------------------------------------------- the checks


def _summary(name: str, cases: list[dict[str, Any]], t0: float) -> CheckResult:
    ok = all(c["ok"] for c in cases)
    worst = max(c["max_rel_error"] for c in cases)
    detail = (
        f"{len(cases)} steps ({', '.join(str(c['requests']) for c in cases)} requests): max rel "
        f"err {worst:.2e} (limit {TOLERANCE:g}), K/V bad bytes "
        f"{sum(c['kv_bad_bytes'] for c in cases)}, near-boundary codes tolerated "
        f"{sum(c['kv_near_boundary'] for c in cases)}"
    )
    if not ok:
        bad = [c for c in cases if not c["ok"]]
        detail += "; failed: " + "; ".join(
            f"{c['requests']} requests ({c['launches']}): rel err {c['max_rel_error']:.2e}, "
            f"K/V bad bytes {c['kv_bad_bytes']}, health "
            + ", ".join(h for h in c["health"] if h != "ok")
            + (f", {c['launch_mismatch']}" if "launch_mismatch" in c else "")
            for c in bad
        )
    return CheckResult(name, ok, detail, time.perf_counter() - t0, cases)


def _variant_check(s: Session, variant: Variant, only: Sequence[int] = ()) -> CheckResult:
    """Every request count ``variant`` serves, or those of ``only`` (which it must serve)."""
    t0 = time.perf_counter()
    counts = request_counts(s.layout, variant)
    if only:
        wrong = [n for n in only if n not in counts]
        if wrong:
            raise BadInput(
                f"{variant} launches serve {counts[0]}..{counts[-1]} requests, not "
                f"{', '.join(map(str, wrong))}",
                field="requests",
                value=",".join(map(str, wrong)),
            )
        counts = [n for n in counts if n in only]
    return _summary(variant, s.run_counts(counts, variant), t0)


def _multi_launch_check(s: Session, only: Sequence[int] = ()) -> CheckResult:
    """The steps of ``multi_launch_counts``, or those of ``only`` (each above one launch)."""
    t0 = time.perf_counter()
    counts = list(only) or multi_launch_counts(s.layout)
    r = _summary("multi-launch", s.run_counts(counts, "multi-launch"), t0)
    r.detail = (
        "steps of "
        + ", ".join(f"{c} ({describe_launches(s.layout, c)})" for c in counts)
        + f" requests: {r.detail}"
    )
    return r


def _dead_rank_check(s: Session) -> CheckResult:
    """The last rank never launches a step; the others must give up within the bound naming it,
    and the next step (the host re-aligning step counters and health) must pass
    (``cases.dead_rank_verdict``)."""
    from mono_aot.selftest.cases import dead_rank_verdict

    t0 = time.perf_counter()
    lay = s.layout
    tp = lay.parallel.tp
    dead = tp - 1
    count = s.dead_rank_requests
    prob = s.problem(request_specs(lay, count))
    launch = [r != dead for r in range(tp)]
    answers = s.step(prob, launch=launch, runner="short", reset_health=True)
    # everyone back in step: the same step counter on every rank, health cleared, the same
    # peer buffers (stale mailbox contents must not pass for current ones)
    nxt = max(a["step"] for a in answers) + 1
    prob2 = s.problem(request_specs(lay, count, salt=1))
    answers2 = s.step(prob2, runner="short", set_step=nxt, reset_health=True)
    res = dead_rank_verdict(
        lay, s.arch, prob2, s.reference(prob2), answers, answers2,
        dead_rank=dead, wait_s=s.short_wait_s, give_up_s=s.dead_rank_give_up_s,
    )  # fmt: skip
    if res["ok"]:
        detail = (
            f"rank {dead} never launched ({describe_launches(lay, count)}); ranks "
            f"0..{dead - 1} gave up after {max(res['dead_seconds']):.4g} s with "
            f"'{res['dead_health'][0]}'; the next full step: rel err "
            f"{res['max_rel_error']:.2e}"
        )
    else:
        detail = "; ".join(res["problems"])
    return CheckResult("dead-rank", res["ok"], detail, time.perf_counter() - t0, [res])


def _fresh_step(s: Session, runner: str) -> int:
    """A step counter value no launch of ``runner`` used yet on any rank."""
    from mono_aot.selftest.rank import runner_state

    assert s.cluster is not None
    tp = s.layout.parallel.tp
    states = s.cluster.run(runner_state, [{"runner": runner}] * tp, timeout=STEP_TIMEOUT_S)
    return max(int(a["step"]) for a in states) + 1


def _dead_rank_realign_check(s: Session) -> CheckResult:
    """The last rank skips a step; the next step runs on every rank with no host reset of
    ``step`` or ``health`` (``cases.realign_verdict``): the README's "a rank that missed a step
    is back in line at the next one". Setup only, before the dead step: every rank's step
    counter is set to one no launch used yet and health cleared, so the ranks start in line."""
    from mono_aot.selftest.cases import realign_verdict

    t0 = time.perf_counter()
    lay = s.layout
    tp = lay.parallel.tp
    dead = tp - 1
    start = _fresh_step(s, "short")
    prob = s.problem(request_specs(lay, 1, salt=5))
    launch = [r != dead for r in range(tp)]
    answers = s.step(prob, launch=launch, runner="short", set_step=start, reset_health=True)
    prob2 = s.problem(request_specs(lay, 1, salt=6))
    answers2 = s.step(prob2, runner="short")  # no set_step, no reset_health
    res = realign_verdict(
        lay, s.arch, prob2, s.reference(prob2), answers, answers2,
        dead_rank=dead, start_step=start, wait_s=s.short_wait_s,
        give_up_s=s.dead_rank_give_up_s,
    )  # fmt: skip
    if res["ok"]:
        detail = (
            f"rank {dead} skipped step {start}; ranks 0..{tp - 2} recorded "
            f"'{abi.describe_health(answers[0]['health'])}'; the next step with no host reset: "
            f"rel err {res['max_rel_error']:.2e}, K/V bad bytes {res['kv_bad_bytes']}, step "
            f"counters {res['steps_after_next']}"
        )
    else:
        detail = "; ".join(res["problems"])
    return CheckResult("dead-rank-realign", res["ok"], detail, time.perf_counter() - t0, [res])


def _late_dispatch_check(s: Session) -> CheckResult:
    """Per variant: a launch whose workgroups are dispatched past the wait bound (a CU-masked
    stream, ``rank.run_late_dispatch``) must fail with a recorded grid-barrier timeout, and the
    next launch on the same scratch must pass (``cases.late_verdict``)."""
    from mono_aot.selftest.cases import late_verdict
    from mono_aot.selftest.rank import run_late_dispatch

    t0 = time.perf_counter()
    lay = s.layout
    assert s.cluster is not None
    out = []
    for variant in lay.variants():
        count = lay.variant_reqs(variant)[0]
        prob = s.problem(request_specs(lay, count, salt=7))
        common, caches = s.save_case(prob)
        start = _fresh_step(s, "short")
        msgs = [
            {
                "case": str(common), "caches": str(caches[r]), "runner": "short",
                "set_step": start,
            }
            for r in range(lay.parallel.tp)
        ]  # fmt: skip
        answers = s.cluster.run(run_late_dispatch, msgs, timeout=STEP_TIMEOUT_S)
        res = late_verdict(
            lay, s.arch, prob, s.reference(prob), answers,
            wait_s=s.short_wait_s, give_up_s=s.dead_rank_give_up_s,
        )  # fmt: skip
        res["variant"] = variant
        s.log(
            f"  late-dispatch {variant} {count} request(s): first launch "
            f"{res['first_health'][0]} after {max(res['first_seconds']):.2f} s on "
            f"{min(res['mask_cus'])} CUs; second: rel err {res['max_rel_error']:.2e}"
            + ("" if res["ok"] else " FAIL")
        )
        out.append(res)
    ok = all(r["ok"] for r in out)
    detail = "; ".join(
        f"{r['variant']}: "
        + (
            f"late launch on {min(r['mask_cus'])} CUs recorded '{r['first_health'][0]}' after "
            f"{max(r['first_seconds']):.2f} s, the next launch: rel err "
            f"{r['max_rel_error']:.2e}, K/V bad bytes {r['kv_bad_bytes']}"
            if r["ok"]
            else "; ".join(r["problems"])
        )
        for r in out
    )
    return CheckResult("late-dispatch", ok, detail, time.perf_counter() - t0, out)


def _graph_check(s: Session, replays: int) -> CheckResult:
    from mono_aot.reference.step import norm_rel_error

    t0 = time.perf_counter()
    lay = s.layout
    count = lay.variant_reqs("wide")[0]
    prob = s.problem(request_specs(lay, count, salt=3))
    answers = s.step(prob, replays=replays, reset_health=True)
    res = s.judge(prob, answers)
    first = [norm_rel_error(a["out_before_replay"], a["out"]) for a in answers]
    steps = {a["step"] for a in answers}
    ok = res["ok"] and len(steps) == 1 and all(a["health"][abi.H_STATUS] == 0 for a in answers)
    detail = (
        f"{replays} replays of a captured {count}-request step on every rank, no host reset: "
        f"health {res['health'][0]}, rel err {res['max_rel_error']:.2e}, K/V bad bytes "
        f"{res['kv_bad_bytes']}, step counters {sorted(steps)}, first vs last output "
        f"{max(first):.1e}"
    )
    return CheckResult("graph-replay", ok, detail, time.perf_counter() - t0, [res])


def run_selftest(
    layout: Layout,
    checks: Sequence[str] = CHECKS,
    *,
    seed: int = 0,
    replays: int = DEFAULT_REPLAYS,
    log: Callable[[str], None] = lambda s: None,
) -> list[CheckResult]:
    """Run ``checks`` on this machine's GPUs; ``NoDevice`` when they cannot run here."""
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise BadInput(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECKS)}")
    wanted = [c for c in CHECKS if c in checks]
    wanted = [c for c in wanted if c != "narrow" or "narrow" in layout.variants()]
    arch, devices = find_devices(layout)
    log(f"{len(devices)} x {arch}: GPUs {devices}")
    biggest = max(
        [layout.serving.chunk_reqs]
        + (multi_launch_counts(layout) if "multi-launch" in wanted else [])
    )
    results: list[CheckResult] = []
    from mono_aot.selftest.cluster import ClusterError

    try:
        with Session(
            layout,
            arch,
            devices,
            seed=seed,
            max_requests=biggest,
            dead_rank=any(c in SHORT_WAIT_CHECKS for c in wanted),
            log=log,
        ) as s:
            for c in wanted:
                log(f"check {c} ...")
                if c in ("narrow", "wide"):
                    results.append(_variant_check(s, c))  # type: ignore[arg-type]
                elif c == "multi-launch":
                    results.append(_multi_launch_check(s))
                elif c == "dead-rank":
                    results.append(_dead_rank_check(s))
                elif c == "dead-rank-realign":
                    results.append(_dead_rank_realign_check(s))
                elif c == "late-dispatch":
                    results.append(_late_dispatch_check(s))
                else:
                    results.append(_graph_check(s, replays))
    except ClusterError as e:
        raise SelftestFailure(f"a rank could not finish ({e})") from None
    return results
