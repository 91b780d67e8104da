"""A discrete model of the drafter kernels' launch-level sync state, run on the CPU.

Workgroups are generators that do one memory action per scheduler step (a load, a store or one
atomic), interleaved by a seeded scheduler on a global clock; every wait polls with the same
bound as the kernel (``WAIT`` steps) and watches its half's abort word. The memory is the
scratch ``sync`` region as ``mono_aot.spec.abi`` lays it out (ticket / launch counter, two
parity halves of count, generation and abort word) plus the per-parity norm sums.

Two protocols are modelled:

- ``old`` (the protocol before launch tickets): each workgroup reads the launch counter at start, workgroup 0
  zeroes the other half at start and publishes ``launches + 1`` after the first grid barrier;
- ``new`` (``mono_aot.kernels.sync.launch_start``): each workgroup takes a ticket (one atomic
  add), its launch is ``ticket // ctas``; workgroup 0 zeroes the other half at start; nothing is
  published; a launch whose ``n`` is bad takes no ticket and writes only ``health``.

The property: the host clears ``health`` after every failed launch (as the runner does), and a
launch that ends with ``health == 0`` must have written its whole ``out`` from its own norm
sums. A workgroup dispatched after the first barrier timed out breaks it under ``old`` and never
under ``new``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from mono_aot.spec import abi

WAIT = 400  # scheduler steps a wait may take (the kernel's wait ticks)
BARRIERS = 4  # grid barriers per launch in the model (embed, then a few phases)
ST_ABORTED = 0x100  # local status, as in mono_aot.kernels.sync


@dataclass
class Memory:
    words: dict[int, int] = field(default_factory=dict)  # scratch sync region, by byte offset
    ss: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0})  # norm sums per parity
    health: list[int] = field(default_factory=lambda: [0, 0, 0, 0])

    def get(self, off: int) -> int:
        return self.words.get(off, 0)

    def put(self, off: int, v: int) -> None:
        self.words[off] = v

    def add(self, off: int, v: int) -> int:
        old = self.get(off)
        self.words[off] = old + v
        return old


def half(par: int, word: int) -> int:
    return par * abi.SYNC_HALF + word


@dataclass
class Launch:
    ctas: int
    n_ok: bool = True
    out: dict[int, str] = field(default_factory=dict)  # workgroup -> what it wrote


class Sim:
    def __init__(self, protocol: str, ctas: int, seed: int) -> None:
        self.protocol = protocol
        self.ctas = ctas
        self.mem = Memory()
        self.rng = random.Random(seed)
        self.now = 0

    # ---- one workgroup ----
    def record_failure(self, par: int, code: int, what: int, detail: int):
        h = self.mem.health
        if h[0] == 0:  # one compare-and-swap
            h[:] = [code, what, detail, 0]
        yield
        self.mem.put(half(par, abi.SYNC_ABORT), 1)
        yield

    def wait_gen(self, par: int, g: int, what: int):
        t0 = self.now
        while True:
            v = self.mem.get(half(par, abi.SYNC_GEN))
            yield
            a = self.mem.get(half(par, abi.SYNC_ABORT))
            yield
            if v != g:
                return 0
            if a:
                return ST_ABORTED
            if self.now - t0 >= WAIT:
                yield from self.record_failure(par, abi.STATUS_BARRIER_TIMEOUT, what, g)
                return abi.STATUS_BARRIER_TIMEOUT

    def barrier(self, par: int, st: int, what: int):
        if st:
            return st
        g = self.mem.get(half(par, abi.SYNC_GEN))
        yield
        old = self.mem.add(half(par, abi.SYNC_COUNT), 1)
        yield
        if old == self.ctas - 1:
            self.mem.put(half(par, abi.SYNC_COUNT), 0)
            yield
            self.mem.add(half(par, abi.SYNC_GEN), 1)
            yield
            return 0
        return (yield from self.wait_gen(par, g, what))

    def workgroup(self, launch: Launch, bid: int):
        mem = self.mem
        if self.protocol == "new":
            if not launch.n_ok:  # the n check: nothing but health is written
                if bid == 0 and mem.health[0] == 0:
                    mem.health[:] = [abi.STATUS_BAD_N, abi.PH_LAUNCH, 0, 0]
                yield
                return
            ticket = mem.add(abi.SYNC_TICKET, 1)
            par = abi.launch_id(ticket, self.ctas) & 1
        else:
            par = mem.get(abi.SYNC_TICKET) & 1  # the old launch counter, same word
        yield
        if bid == 0:  # zero the other half and the other parity's norm sums
            for w in (abi.SYNC_COUNT, abi.SYNC_GEN, abi.SYNC_ABORT):
                mem.put(half(1 - par, w), 0)
                yield
            mem.ss[1 - par] = 0
            yield
        mem.ss[par] += 1  # embed: this workgroup's rows' sum of squares
        yield
        st = yield from self.barrier(par, 0, abi.PH_EMBED)
        if self.protocol == "old" and bid == 0:
            mem.put(abi.SYNC_TICKET, mem.get(abi.SYNC_TICKET) + 1)  # publish_launch
            yield
        for b in range(1, BARRIERS):
            st = yield from self.barrier(par, st, 16 + b)
        if st == 0:
            # the final norm reads the launch's sums: every workgroup's, and only theirs
            launch.out[bid] = "ok" if mem.ss[par] == self.ctas else f"ss={mem.ss[par]}"
            yield

    # ---- one launch: workgroups dispatched at given steps, run until all finish ----
    def run(self, launch: Launch, delays: dict[int, int]) -> None:
        pending = {bid: self.now + delays.get(bid, 0) for bid in range(launch.ctas)}
        live: dict[int, object] = {}
        while pending or live:
            for bid, at in list(pending.items()):
                if at <= self.now:
                    live[bid] = self.workgroup(launch, bid)
                    del pending[bid]
            if live:
                bid = self.rng.choice(sorted(live))
                try:
                    next(live[bid])
                except StopIteration:
                    del live[bid]
            self.now += 1


def violations(protocol: str, seed: int, late: list[int | None], bad_n: set[int] = frozenset()):
    """Run one launch per entry of ``late`` (a workgroup dispatched that many WAITs late, or
    None); the host clears health after each failed launch. -> the launches that ended with
    health 0 but an incomplete or wrong ``out``."""
    ctas = 6
    sim = Sim(protocol, ctas, seed)
    bad = []
    failed = []
    for i, lateness in enumerate(late):
        launch = Launch(ctas, n_ok=i not in bad_n)
        delays = {} if lateness is None else {sim.rng.randrange(ctas): int(lateness * WAIT)}
        sim.run(launch, delays)
        health = list(sim.mem.health)
        complete = launch.out == {b: "ok" for b in range(ctas)}
        if health[0] == abi.STATUS_OK and not complete:
            bad.append((i, launch.out))
        if health[0] != abi.STATUS_OK:
            failed.append(i)
        if i in bad_n:
            assert health[:2] == [abi.STATUS_BAD_N, abi.PH_LAUNCH] or protocol == "old"
            assert not launch.out
        sim.mem.health = [0, 0, 0, 0]  # the runner raises, then clears health
    return bad, failed


LATE_AFTER_TIMEOUT = [None, 3.0, None, None, 2.5, None, None]


def test_the_old_protocol_fails_after_a_late_workgroup():
    """The issue's finding, reproduced: a workgroup dispatched after the first barrier timed out
    works in the other parity half and the next launch returns an unwritten out with health 0."""
    bad = [v for seed in range(20) for v in violations("old", seed, LATE_AFTER_TIMEOUT)[0]]
    assert bad, "the model should expose the old protocol's bug"


def test_the_new_protocol_leaves_every_later_launch_clean():
    for seed in range(40):
        bad, failed = violations("new", seed, LATE_AFTER_TIMEOUT)
        assert bad == [], seed
        assert failed == [1, 4], (seed, failed)  # the late launches fail and record it


@pytest.mark.parametrize("seed", range(30))
def test_random_late_dispatches_and_bad_n(seed):
    """Random lateness (some before, some after the timeout) and launches with a bad n: under
    the new protocol every launch with health 0 wrote all of out from its own sums."""
    rng = random.Random(1000 + seed)
    late = [rng.choice([None, None, 0.3, 0.9, 1.5, 4.0]) for _ in range(10)]
    bad_n = {i for i in range(10) if rng.random() < 0.2}
    bad, failed = violations("new", seed, late, bad_n)
    assert bad == []
    assert set(failed) >= bad_n | {i for i, x in enumerate(late) if x is not None and x > 1}


def test_a_failed_launch_then_a_failing_one_records_its_own_failure():
    """After a failed launch (health cleared by the host), a launch that fails again records it."""
    sim = Sim("new", 4, 7)
    for _ in range(2):
        sim.run(Launch(4), {1: 3 * WAIT})
        assert sim.mem.health[0] == abi.STATUS_BARRIER_TIMEOUT
        sim.mem.health = [0, 0, 0, 0]
    launch = Launch(4)
    sim.run(launch, {})
    assert sim.mem.health[0] == abi.STATUS_OK
    assert launch.out == {b: "ok" for b in range(4)}
