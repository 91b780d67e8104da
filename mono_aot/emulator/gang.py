"""Neighbouring waves at one instruction, run as one wave of 64 lanes per member.

Why: the kernels' hot loops (the narrow step's GEMVs above all) run in every wave of a launch
with the same control flow, so most of the time the waves of a launch sit at the same
instruction. Running a vector instruction once on all their lanes costs about the numpy calls of
one wave's: the executor's time goes into calls, not into lanes.

What makes it the same computation: the launch's register file is one array ``[register, wave
* 64 + lane]`` (``Machine._dispatch``), each wave's ``v`` its 64 columns, so the gang's ``v`` is
the columns of waves ``first .. first + len(waves) - 1``: a view, written in place. A gang runs
an instruction once only when ``Compiled.gang`` says it may and the scalar registers it reads as
values hold the same value in every member; EXEC and a lane-mask source (a carry-in, a
``v_cndmask`` select) are each member's own, concatenated. Gang-able are the VALU instructions
(their lane operations are elementwise: ``lanes.py``) that write a vector destination under
EXEC), or a lane mask (a compare, a carry-out: each member's lanes of it go to its own SGPRs and
EXEC), ``v_readfirstlane`` (each member's first active lane to its own SGPR), MFMA (one product
per wave), the lane exchanges ``ds_swizzle`` and ``ds_bpermute`` (each lane's source within its
own member) and loads from global memory and LDS: those read memory at once for every member
(each lane from its own workgroup's LDS: the launch's workgroups' LDS are rows of one array) and
put one access in flight in each member, which its own waits retire; ``s_waitcnt`` (each
member's own waits) and ``s_barrier`` (``Compiled.gang_steps`` holds these gang forms). None
of them writes anything another wave can see, so running it for a member before its turn in
the schedule changes no value another wave reads (a load may read memory up to a quantum
earlier than the member alone would, as the quantum already allows). ``ds_write`` is the one
that does: it scatters once for the gang, its members in the order the schedule would run them
alone (a later writer of a byte wins as it would), so it differs from the members alone only
for a wave outside the gang that touches those bytes within the quantum, which the kernels'
barriers between LDS phases rule out. A scalar instruction (the scalar ALU, a branch:
``Compiled.scalar``) whose source SGPRs and SCC agree in every member runs once, on the first,
and the others take the SGPRs it writes and SCC: it is a pure function of its sources, so each
member alone would have computed the same (its destinations may hold anything before: a
workgroup's own value it overwrites). Everything else runs member by member
(``Machine._step_gang``), and the gang breaks up where their paths part.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mono_aot.emulator.wave import EXEC_HI, EXEC_LO, LANES, Counters, Pending, Wave, mask_of


class Gang:
    """The wave-like view of ``waves`` (consecutive waves of one launch) that a gang-able
    instruction's closure runs on: ``v``, ``s``, ``exec_mask``, ``exec_all``, ``lane_mask``."""

    __slots__ = ("waves", "v", "s", "lanes", "exec_mask", "exec_all", "_pend", "_lds")

    def __init__(self, waves: Sequence[Wave], v: np.ndarray) -> None:
        self.waves = waves
        self.v = v
        self.s = waves[0].s  # read only where every member holds the same (``uniform``)
        self.lanes = LANES * len(waves)
        self._pend: tuple[set[int], set[int]] | None = None
        self._lds: tuple[np.ndarray, np.ndarray] | None = None
        self.sync_exec()

    def sync_exec(self) -> None:
        """Refresh the gang's EXEC after a member's changed."""
        self.exec_all = all(w.exec_all for w in self.waves)
        self.exec_mask = np.concatenate([w.exec_mask for w in self.waves])

    def lds_lanes(self) -> tuple[np.ndarray, np.ndarray]:
        """The members' LDS as one flat array and, per gang lane, where its workgroup's bytes
        start in it: an LDS access of the whole gang is then one gather or one scatter (the
        workgroups of a launch are rows of one array, ``Machine._dispatch``)."""
        if self._lds is None:
            rows = self.waves[0].wg.lds_rows
            ids = np.array([w.wg.id for w in self.waves], dtype=np.int64)
            self._lds = (rows.reshape(-1), np.repeat(ids * rows.shape[1], LANES))
        return self._lds

    def lane_mask(self, read: Callable[[Wave], int]) -> np.ndarray:
        return np.concatenate([mask_of(read(w)) for w in self.waves])

    def uniform(self, regs: Sequence[int]) -> bool:
        """Whether every member holds the same value in the scalar registers ``regs``."""
        if not regs:
            return True
        first = self.waves[0].s
        want = [first[r] for r in regs]
        return all([w.s[r] for r in regs] == want for w in self.waves[1:])

    def scalar_agrees(self, regs: Sequence[int]) -> bool:
        """Whether every member holds the same SCC and the same values in ``regs`` (the
        registers a scalar instruction reads)."""
        first = self.waves[0]
        want = [first.s[r] for r in regs]
        return all(w.scc == first.scc and [w.s[r] for r in regs] == want for w in self.waves[1:])

    def copy_scalar(self, regs: Sequence[int]) -> None:
        """Give every member the first member's SCC and ``regs`` (the registers the
        instruction writes; EXEC refreshed if among them): the result of a scalar instruction
        the first ran for all (``scalar_agrees``)."""
        first = self.waves[0]
        vals = [first.s[r] for r in regs]
        execs = EXEC_LO in regs or EXEC_HI in regs
        for w in self.waves[1:]:
            w.scc = first.scc
            for r, x in zip(regs, vals, strict=True):
                w.s[r] = x
            if execs:
                w.sync_exec()
        if execs:
            self.sync_exec()

    def counters(self) -> Counters | None:
        """The one ``Counters`` every member holds, and no other wave does: a gang's access
        is then issued, and its wait retires, once for all (``wave.Counters``). Members whose
        own counters hold the same records (they issued and retired the same accesses since
        they last parted) are given one shared copy first. None when the members' accesses in
        flight differ: each then issues and waits on its own."""
        waves = self.waves
        first = waves[0].mc
        if first.users == len(waves) and all(w.mc is first for w in waves):
            return first
        if not all(w.mc is first or w.mc.same(first) for w in waves):
            return None
        c = first.copy(users=len(waves))
        for w in waves:
            w.mc.users -= 1
            w.mc = c
        return c

    def issue(self, p: Pending) -> None:
        """Put the gang's access ``p`` in flight in every member (one record for all)."""
        c = self.counters()
        if c is not None:
            c.issue(p)
        else:
            for w in self.waves:
                w.issue(p)
        self._pend = None

    def wait(self, vm: int, lgkm: int) -> bool:
        """Every member's ``s_waitcnt vmcnt(vm) lgkmcnt(lgkm)``; True when any member had
        anything outstanding (every member then yields)."""
        waves = self.waves
        c = self.counters()
        if c is None:
            waited = False
            for w in waves:
                waited |= w.wait(vm, lgkm)
        else:
            waited = c.outstanding(vm, lgkm)
            if waited:
                done = c.wait(vm, lgkm, waves[0])
                for w in waves:
                    w.completed(done)
        self._pend = None
        return waited

    def clear_of_loads(self, touch_v: frozenset[int], touch_s: frozenset[int]) -> bool:
        """Whether no member has a load in flight to a register the instruction touches (if
        one has, the members step alone, and ``Wave.hazard`` names the register).

        Why a union: asked of every member, this was an eighth of a shipped-layout run (a gang
        has about 2,000 members and the GEMVs keep loads in flight). The union of the members'
        registers in flight changes only where an access is issued or retired, after which the
        machine calls ``loads_changed``; members sharing one ``Counters`` count once."""
        if self._pend is None:
            pv: set[int] = set()
            ps: set[int] = set()
            seen = None
            for w in self.waves:
                c = w.mc
                if c is not seen and (c.pend_v or c.pend_s):
                    seen = c
                    pv.update(c.pend_v)
                    ps.update(c.pend_s)
            self._pend = (pv, ps)
        pv, ps = self._pend
        return (not pv or touch_v.isdisjoint(pv)) and (not ps or touch_s.isdisjoint(ps))

    def loads_changed(self) -> None:
        """A member issued or retired a memory access: ``clear_of_loads`` must look again."""
        self._pend = None
