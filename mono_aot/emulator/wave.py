"""The state of one wave and of one workgroup, and the memory counters (``s_waitcnt``).

Register files (CDNA3 ISA guide, "Program State" and "Data Sharing"; AMDGPU code object v6 on
gfx90a and later): 102 SGPRs plus the special scalar registers, held in one list indexed by the
scalar operand encoding itself (0-101 SGPRs, 102-103 FLAT_SCRATCH, 104-105 XNACK_MASK, 106-107
VCC, 108-123 TTMP, 124 M0, 126-127 EXEC); the unified vector register file, one row of 64 lanes
per register: ``v[i]`` is row ``i`` and ``a[i]`` row ``accum_offset + i`` (the kernel
descriptor's ``compute_pgm_rsrc3.accum_offset``).

Memory counters ("Data dependency resolution" / "S_WAITCNT" in the ISA guide): every vector
memory instruction (load, store, atomic, cache control) increments VM_CNT and they retire in
issue order; LDS instructions and scalar memory reads increment LGKM_CNT; LDS returns in order
but scalar memory may return out of order, so ``s_waitcnt lgkmcnt(N)`` with scalar loads in
flight guarantees only what the count forces. A load's data is read from memory when it
executes and written to its destination registers when a wait retires it; reading (or
overwriting) such a register before that is reported as the kernel's bug.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

LANES = 64
EXEC_LO, EXEC_HI, VCC_LO, VCC_HI, M0 = 126, 127, 106, 107, 124
_SHIFTS = np.arange(LANES, dtype=np.uint64)
_ALL = np.ones(LANES, dtype=bool)
_ALL.flags.writeable = False


class Fault(Exception):
    """Raised by an instruction; the machine adds kernel, device, workgroup, wave, offset and
    instruction text."""

    def __init__(self, message: str, *, lane: int | None = None, address: int | None = None):
        super().__init__(message)
        self.lane, self.address = lane, address


_MASKS: dict[int, np.ndarray] = {}


def mask_of(value: int) -> np.ndarray:
    """The 64-lane bool mask of a 64-bit value (read-only, cached: masks repeat)."""
    m = _MASKS.get(value)
    if m is None:
        if len(_MASKS) > 65536:
            _MASKS.clear()
        m = ((np.uint64(value) >> _SHIFTS) & np.uint64(1)).astype(bool)
        m.flags.writeable = False
        _MASKS[value] = m
    return m


def bits_of(mask: np.ndarray) -> int:
    """The 64-bit value of a 64-lane bool mask."""
    return int.from_bytes(np.packbits(mask, bitorder="little").tobytes(), "little")


class Pending:
    """A memory instruction in flight: ``kind`` "vm", "lds" or "smem"; ``apply`` writes its
    destination when retired (None for stores and cache operations); ``time`` the clock it
    was issued at, or for a gang's access (one record every member's counters hold) each
    member's clock then."""

    __slots__ = ("kind", "offset", "vrows", "srows", "apply", "time", "done")

    def __init__(self, kind: str, offset: int, vrows: tuple[int, ...], srows: tuple[int, ...],
                 apply: Callable[[Wave], None] | None,
                 time: int | dict[Wave, int]) -> None:  # fmt: skip
        self.kind, self.offset, self.vrows, self.srows = kind, offset, vrows, srows
        self.apply, self.time = apply, time
        self.done = False  # its destination written (once, by the first counters to retire it)

    def completes(self, w: Wave) -> int:
        """The clock at which ``w``'s access completes."""
        t = self.time
        return (t if type(t) is int else t[w]) + LATENCY[self.kind]


# Cycles from issue until a wait can retire an access (a coarse latency model: it only decides
# how far a waiting wave's virtual clock advances, never the values it sees).
LATENCY = {"vm": 500, "lds": 64, "smem": 200}


class Counters:
    """The memory counters of a wave: its accesses in flight in issue order (``vm`` for
    VM_CNT, ``lgkm`` for LGKM_CNT) and, per register, the access that will write it.

    Why shared: the members of a gang issue the same accesses at the same instructions, and
    their waits retire the same ones, so one ``Counters`` (``users`` waves hold it) serves
    them all: one record and one wait per gang access instead of one per member
    (``gang.Gang.counters``). A wave that issues or retires alone first takes its own copy
    (``Wave.own_counters``); the records stay shared, and a record's destination is written
    once, by the first of its holders to retire it: writing a wave's registers before its own
    wait changes nothing it can see, since touching a register a load in flight writes is a
    fault (``Wave.hazard``) until its own wait retires the load."""

    __slots__ = ("vm", "lgkm", "pend_v", "pend_s", "users")

    def __init__(self) -> None:
        self.vm: deque[Pending] = deque()
        self.lgkm: deque[Pending] = deque()
        self.pend_v: dict[int, Pending] = {}
        self.pend_s: dict[int, Pending] = {}
        self.users = 1

    def copy(self, users: int = 1) -> Counters:
        c = Counters()
        c.vm, c.lgkm = deque(self.vm), deque(self.lgkm)
        c.pend_v, c.pend_s = dict(self.pend_v), dict(self.pend_s)
        c.users = users
        return c

    def same(self, other: Counters) -> bool:
        """Whether ``other`` holds the same records in flight, in the same order."""
        return (self.vm == other.vm and self.lgkm == other.lgkm
                and self.pend_v == other.pend_v and self.pend_s == other.pend_s)  # fmt: skip

    def issue(self, p: Pending) -> None:
        (self.vm if p.kind == "vm" else self.lgkm).append(p)
        for r in p.vrows:
            self.pend_v[r] = p
        for r in p.srows:
            self.pend_s[r] = p

    def outstanding(self, vm: int, lgkm: int) -> bool:
        """Whether ``s_waitcnt vmcnt(vm) lgkmcnt(lgkm)`` waits."""
        return len(self.vm) > vm or len(self.lgkm) > lgkm

    def wait(self, vm: int, lgkm: int, w: Wave) -> list[Pending]:
        """Retire what ``s_waitcnt vmcnt(vm) lgkmcnt(lgkm)`` forces (``w``: the wave a
        record's writer is given); the records retired."""
        done: list[Pending] = []
        q = self.vm
        while len(q) > vm:
            done.append(q.popleft())
        q = self.lgkm
        if len(q) > lgkm:
            if lgkm == 0:
                done.extend(q)
                q.clear()
            else:
                # at least len(q) - lgkm completed; scalar loads may be any of them, LDS
                # accesses complete in order: retire only the LDS prefix the count forces
                smem = sum(1 for p in q if p.kind == "smem")
                force = len(q) - lgkm - smem
                if force > 0:
                    keep: deque[Pending] = deque()
                    for p in q:
                        if p.kind == "lds" and force > 0:
                            done.append(p)
                            force -= 1
                        else:
                            keep.append(p)
                    self.lgkm = keep
        pv, ps = self.pend_v, self.pend_s
        for p in done:
            if p.apply is not None and not p.done:
                p.done = True
                p.apply(w)
            for r in p.vrows:
                if pv.get(r) is p:
                    del pv[r]
            for r in p.srows:
                if ps.get(r) is p:
                    del ps[r]
        return done


class Workgroup:
    __slots__ = ("id", "lds", "lds_rows", "waves", "arrived", "launch")

    def __init__(self, wid: int, lds_rows: np.ndarray, launch: object,
                 size: int | None = None) -> None:  # fmt: skip
        """``lds_rows``: its launch's one array of every workgroup's LDS, row ``wid`` its
        own (its first ``size`` bytes; all of it by default), so that a gang's LDS access
        reads or writes all of them as one (``gang.Gang.lds_lanes``)."""
        self.id = wid
        self.lds_rows = lds_rows
        self.lds = lds_rows[wid, : lds_rows.shape[1] if size is None else size]
        self.waves: list[Wave] = []
        self.arrived: list[Wave] = []
        self.launch = launch


class Wave:
    __slots__ = ("s", "scc", "v", "exec_mask", "exec_all", "time", "pc", "mc", "wg", "index",
                 "block", "icount", "seq", "tie", "accum")  # fmt: skip

    lanes = LANES  # the lanes an instruction's arrays span (a ``Gang`` spans several waves')

    def __init__(self, wg: Workgroup, index: int, vregs: int, accum: int, time: int,
                 v: np.ndarray | None = None) -> None:  # fmt: skip
        self.s = [0] * 128
        self.scc = 0
        # ``v``: this wave's columns of its launch's register file (``machine.Machine``), so
        # that neighbouring waves' registers form one array a ``Gang`` runs an instruction on
        self.v = np.zeros((vregs, LANES), dtype=np.uint32) if v is None else v
        self.exec_mask = _ALL
        self.exec_all = True
        self.time = time
        self.pc = 0
        self.mc = Counters()
        self.wg = wg
        self.index = index
        self.block: str | None = None  # "barrier", "end" after a yielding instruction
        self.icount = 0
        self.seq = 0  # the scheduler's live heap entry (0: not waiting in it)
        self.tie = 0.0  # and the seeded draw that breaks ties of clocks there
        self.accum = accum

    # ------------------------------------------------------------------ EXEC
    def set_exec(self, value: int) -> None:
        self.s[EXEC_LO] = value & 0xFFFFFFFF
        self.s[EXEC_HI] = value >> 32
        self.sync_exec()

    def sync_exec(self) -> None:
        """Refresh the cached EXEC mask after anything wrote EXEC_LO/EXEC_HI."""
        value = self.s[EXEC_LO] | self.s[EXEC_HI] << 32
        self.exec_all = value == 0xFFFFFFFFFFFFFFFF
        self.exec_mask = _ALL if self.exec_all else mask_of(value)

    @property
    def exec(self) -> int:
        return self.s[EXEC_LO] | self.s[EXEC_HI] << 32

    def lane_mask(self, read: Callable[[Wave], int]) -> np.ndarray:
        """The per-lane bits of the 64-bit scalar value ``read`` takes (a carry-in, a select)."""
        return mask_of(read(self))

    # ------------------------------------------------------------------ memory counters
    def own_counters(self) -> Counters:
        """This wave's counters, copied first if other waves hold them too (``Counters``)."""
        c = self.mc
        if c.users > 1:
            c.users -= 1
            c = self.mc = c.copy()
        return c

    def issue(self, p: Pending) -> None:
        self.own_counters().issue(p)

    def wait(self, vm: int, lgkm: int) -> bool:
        """``s_waitcnt vmcnt(vm) lgkmcnt(lgkm)``; True when anything was outstanding."""
        if not self.mc.outstanding(vm, lgkm):
            return False
        self.completed(self.own_counters().wait(vm, lgkm, self))
        return True

    def completed(self, done: list[Pending]) -> None:
        """Advance the clock to the latest completion of the accesses ``done`` retired."""
        for p in done:
            t = p.completes(self)
            if t > self.time:
                self.time = t

    def in_flight(self) -> bool:
        """Whether any access is outstanding (``s_endpgm`` lets them complete)."""
        c = self.mc
        return bool(c.vm or c.lgkm or c.pend_v or c.pend_s)

    def vname(self, row: int) -> str:
        return f"v{row}" if row < self.accum else f"a{row - self.accum}"

    def clear_of_loads(self, touch_v: frozenset[int], touch_s: frozenset[int]) -> bool:
        """Whether no load in flight writes a register of ``touch_v``/``touch_s`` (if one does,
        ``hazard`` names it)."""
        c = self.mc
        pv, ps = c.pend_v, c.pend_s
        return (not pv or touch_v.isdisjoint(pv)) and (not ps or touch_s.isdisjoint(ps))

    def hazard(self, reads_v, writes_v, reads_s, writes_s) -> None:
        """Raise when the instruction touches a register a load in flight will write."""
        for rows, pend, what, name in (
            (reads_v, self.mc.pend_v, "read", self.vname),
            (writes_v, self.mc.pend_v, "write", self.vname),
            (reads_s, self.mc.pend_s, "read", _sname),
            (writes_s, self.mc.pend_s, "write", _sname),
        ):
            if not pend:
                continue
            for r in rows:
                p = pend.get(r)
                if p is not None:
                    raise Fault(
                        f"{what} of {name(r)} before s_waitcnt retired the load at "
                        f"0x{p.offset:x} (a register a memory access in flight writes)"
                    )


_SPECIAL_NAMES = {102: "flat_scratch_lo", 103: "flat_scratch_hi", 104: "xnack_mask_lo",
                  105: "xnack_mask_hi", 106: "vcc_lo", 107: "vcc_hi", 124: "m0",
                  126: "exec_lo", 127: "exec_hi"}  # fmt: skip


def _sname(i: int) -> str:
    if i <= 101:
        return f"s{i}"
    if 108 <= i <= 123:
        return f"ttmp{i - 108}"
    return _SPECIAL_NAMES.get(i, f"scalar register {i}")
