"""Which all-reduce tag each rank's launch uses, across the dead-rank checks' steps: a model of
``mono_aot.kernels.sync.launch_start`` (the peer header's ticket, parity slots and launch
number) and of the epoch in ``mono_aot.kernels.drafter`` (``step * EPOCH_SEQS + seq``), driven
the way ``DrafterRunner.forward`` drives the kernels (one launch per chunk, then ``step += 1``).

Two ranks meet in an all-reduce only when their launches carry the same epoch. The model shows
why the dead-rank check re-aligns ``step`` on the host, and that without it (the
dead-rank-realign check) the rank that skipped a step stays one epoch behind for good.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from mono_aot.spec import abi

CTAS = 304
TP = 4


@dataclass
class Rank:
    step: int = 0  # the runner's device step counter
    ticket: int = 0  # the peer header's ticket counter
    slots: list[list[int]] = field(default_factory=lambda: [[0, 0], [0, 0]])  # (step, seq)

    def launch(self) -> int:
        """One launch (every workgroup takes a ticket); its epoch."""
        hp = abi.launch_id(self.ticket, CTAS) & 1
        self.ticket += CTAS
        h_step, h_seq = self.slots[hp]
        seq = h_seq + 1 if h_step == self.step else 0
        self.slots[1 - hp] = [self.step, seq]
        return self.step * abi.EPOCH_SEQS + seq % abi.EPOCH_SEQS

    def forward(self, launches: int = 1) -> list[int]:
        epochs = [self.launch() for _ in range(launches)]
        self.step += 1
        return epochs


def _steps(ranks, n=1, launches=1, skip=()):
    """``n`` steps on every rank but ``skip``; each step's epochs by rank (None: skipped)."""
    return [
        [None if r in skip else rank.forward(launches) for r, rank in enumerate(ranks)]
        for _ in range(n)
    ]


def _in_line(step_epochs):
    got = [e for e in step_epochs if e is not None]
    return all(e == got[0] for e in got)


def test_ranks_that_run_every_step_agree_on_every_launch():
    ranks = [Rank() for _ in range(TP)]
    for epochs in _steps(ranks, 5, launches=3):
        assert _in_line(epochs)
        assert len(set(epochs[0])) == 3  # the launches of a step never share a tag


def test_the_dead_rank_check_is_in_line_after_its_host_re_align():
    ranks = [Rank() for _ in range(TP)]
    _steps(ranks, 2)
    (dead,) = _steps(ranks, skip={TP - 1})
    assert _in_line(dead)  # the survivors agree with each other (and time out on rank 3)
    nxt = max(r.step for r in ranks) + 1
    for r in ranks:  # the check's set_step
        r.step = nxt
    assert all(_in_line(e) for e in _steps(ranks, 3))


def test_a_late_rank_that_still_launched_is_back_in_line():
    """A rank whose launch ran (late, failed) advanced its step like the others."""
    ranks = [Rank() for _ in range(TP)]
    _steps(ranks, 2)
    assert _in_line(_steps(ranks)[0])  # its epoch was right; it only came late
    assert all(_in_line(e) for e in _steps(ranks, 3))


@pytest.mark.xfail(
    strict=True,
    reason="kernel protocol: the epoch derives from the runner's step counter, which a rank "
    "that never called forward did not advance, so it stays one step behind for good "
    "(dead-rank-realign fails on a GPU)",
)
def test_a_rank_that_skipped_a_step_is_back_in_line_at_the_next_one():
    ranks = [Rank() for _ in range(TP)]
    _steps(ranks, 2)
    _steps(ranks, skip={TP - 1})
    after = _steps(ranks, 3)
    assert all(_in_line(e) for e in after), after


def test_the_skipped_rank_is_one_step_behind_at_every_later_step():
    """The prediction the dead-rank-realign check tests on hardware, in numbers."""
    ranks = [Rank() for _ in range(TP)]
    _steps(ranks, 2)
    _steps(ranks, skip={TP - 1})
    for epochs in _steps(ranks, 4, launches=2):
        survivors = {tuple(e) for e in epochs[: TP - 1]}
        assert len(survivors) == 1
        (mine,) = survivors
        assert [a - b for a, b in zip(mine, epochs[TP - 1], strict=True)] == [abi.EPOCH_SEQS] * 2
