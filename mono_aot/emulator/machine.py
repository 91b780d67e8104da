"""The executor: devices, launches, waves and the scheduler that interleaves them.

Dispatch (LLVM "AMDGPUUsage", "Initial Kernel Execution State"; the descriptor is read by
``descriptor.KernelDescriptor``): each wave starts with the user SGPRs its kernel descriptor
enables (only the kernarg segment pointer is supported: the kernarg bytes are copied into a host
buffer mapped in ``Memory``), then the workgroup ids; v0 holds the packed work-item id (X in bits
9:0 on gfx90a and later; the launches are one-dimensional). EXEC starts with the wave's live
lanes. Every workgroup of a launch is dispatched at once (a persistent grid: the kernels wait for
each other across workgroups), except those ``hold`` delays.

Virtual time: each wave has its own clock in core cycles (2.1 GHz); an instruction costs
``CYCLES_PER_INSTRUCTION`` (4: one quarter-rate issue of a 64-lane wave on a 16-lane SIMD),
``s_sleep N`` 64*N more, and a wait for memory advances the clock to the access's issue time plus
a fixed latency (``wave.LATENCY``). ``s_memrealtime`` reads the 100 MHz constant clock
(cycles / 21), ``s_memtime`` the core clock. The scheduler always runs the wave with the
smallest clock (ties broken by a seeded RNG) for a quantum of instructions or until it yields
(s_sleep, s_barrier, s_endpgm, an atomic, an s_waitcnt that waited); ``shuffle`` draws each
quantum at random. The wave it picks takes along the neighbouring waves of its launch that wait
at the same instruction with clocks at most a quantum ahead (``gang.py``): they run the quantum
together, each vector instruction that allows it once for all of them, anything else member by
member in the order the scheduler would have picked them; so a gang reorders no more than a
quantum does, and ``gangs=False`` runs every wave alone. All devices' waves share one
scheduler, so a wave spinning on a flag another device writes lets every clock advance.
Launches on one device run in order (one stream). The host queues a run's launches after the
previous run returned, so none starts before the latest clock of any device: a device that sat
idle (a rank that skipped a step) catches up, or its next launch would begin in the emulated
past and time out waiting for peers still to start.

Memory is sequentially consistent at instruction granularity: a load reads memory when it
executes, a store writes it when it executes, an atomic is one indivisible step per lane (lanes
in increasing order). Caches, their coherence and scopes (sc0/sc1/nt) are not modelled: cache
operations (buffer_wbl2, buffer_inv, s_dcache_*) only count.
"""

from __future__ import annotations

import gc
import heapq
import importlib
import time as _time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn

import numpy as np

from mono_aot.emulator.decode import DecodedKernel, decode_kernel
from mono_aot.emulator.descriptor import KernelDescriptor
from mono_aot.emulator.elf import CodeObject
from mono_aot.emulator.gang import Gang
from mono_aot.emulator.memory import Memory, MemoryFault
from mono_aot.emulator.program import Compiled, Config, LoadError, compile_kernel
from mono_aot.emulator.wave import LANES, Fault, Wave, Workgroup

__all__ = ["EmulatorError", "Launch", "LaunchStats", "LoadedKernel", "Machine", "Memory",
           "RunStats"]  # fmt: skip

CLOCK_HZ = 2.1e9
CYCLES_PER_INSTRUCTION = 4
QUANTUM = 64
PARKED = -1  # ``Wave.seq`` of a wave waiting under its gang's entry (``Machine._run``)


class EmulatorError(RuntimeError):
    """A fault of the emulated program (or a kernel the emulator cannot run): the message
    names kernel, device, workgroup, wave, byte offset, instruction and lane/address."""

    def __init__(self, message: str, *, kernel: str = "", device: int | None = None,
                 workgroup: int | None = None, wave: int | None = None,
                 offset: int | None = None, instruction: str = "", lane: int | None = None,
                 address: int | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.kernel, self.device, self.workgroup, self.wave = kernel, device, workgroup, wave
        self.offset, self.instruction, self.lane, self.address = offset, instruction, lane, address


def _lane_ops() -> dict[str, Callable]:
    """The lane-operation tables (``valu.VALU``, ``numerics.NUMERICS``) that are installed."""
    ops: dict[str, Callable] = {}
    valu = _optional("valu")
    if valu is not None:
        ops.update(valu.VALU)
    numerics = _optional("numerics")
    if numerics is not None:
        ops.update(numerics.NUMERICS)
    return ops


def _optional(module: str):
    """``mono_aot.emulator.<module>`` when this build has it, else None (the operation tables
    are separate modules; an executor without them still loads kernels and reports which
    operations are missing)."""
    name = f"mono_aot.emulator.{module}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        return None


def _mfma() -> Callable | None:
    numerics = _optional("numerics")
    return getattr(numerics, "mfma", None) if numerics is not None else None


@dataclass
class LoadedKernel:
    """A kernel decoded and compiled once; launch it any number of times on any device."""

    name: str
    arch: str
    decoded: DecodedKernel
    descriptor: KernelDescriptor
    program: Compiled
    vregs: int
    accum: int
    texts: list[str]

    @property
    def missing_ops(self) -> dict[str, int]:
        """Opcodes with no lane operation in this build, with their number of uses."""
        return dict(self.program.missing)


@dataclass
class LaunchStats:
    device: int
    kernel: str
    grid: int
    block: int
    instructions: int = 0
    start_cycles: int = 0
    end_cycles: int = 0
    waves: int = 0

    @property
    def virtual_seconds(self) -> float:
        return (self.end_cycles - self.start_cycles) / CLOCK_HZ


@dataclass
class Launch:
    """One queued launch; ``done`` once every wave ended."""

    device: int
    kernel: LoadedKernel
    grid: int
    block: int
    kernargs: bytes
    dynamic_lds: int
    hold: dict[int, float]
    stats: LaunchStats
    done: bool = False
    live: int = 0
    kernarg_buf: np.ndarray | None = None
    kernarg_base: int = 0
    workgroups: list[Workgroup] = field(default_factory=list)
    waves: list[Wave] = field(default_factory=list)  # in dispatch order: a gang's neighbours
    regs: np.ndarray | None = None  # [register, wave * 64 + lane]: every wave's ``v``
    lds: np.ndarray | None = None  # [workgroup, byte]: every workgroup's LDS, one row each


@dataclass
class RunStats:
    instructions: int  # wave-instructions executed
    seconds: float  # host wall time
    virtual_seconds: float  # the latest clock of any wave, from the run's start
    launches: list[LaunchStats] = field(default_factory=list)

    @property
    def instructions_per_second(self) -> float:
        return self.instructions / self.seconds if self.seconds > 0 else 0.0


class Machine:
    """``devices`` emulated GPUs of ``arch`` sharing one ``Memory`` and one scheduler."""

    def __init__(self, arch: str, devices: int = 4, *, seed: int = 0, shuffle: bool = False,
                 memory: Memory | None = None, gangs: bool = True) -> None:  # fmt: skip
        if arch not in ("gfx942", "gfx950"):
            raise ValueError(f"the emulator runs gfx942 and gfx950 code, not {arch}")
        if devices < 1:
            raise ValueError(f"devices must be at least 1, not {devices}")
        self.arch = arch
        self.devices = devices
        self.memory = memory if memory is not None else Memory()
        self.shuffle = shuffle
        self.gangs = gangs  # run waves at one instruction together (gang.py)
        # called as progress(wave-instructions, seconds) every progress_every wave-instructions
        # of a run (a long emulation's terminal line); it must not touch the machine
        self.progress: Callable[[int, float], None] | None = None
        self.progress_every = 5_000_000
        self.rng = np.random.default_rng(seed)
        self.queues: list[list[Launch]] = [[] for _ in range(devices)]
        self.device_time = [0] * devices  # cycles: when each device's last launch ended
        self.ops: dict[str, Callable] = _lane_ops()  # the lane operations load binds
        # (code object, kernel) -> (the ops it was compiled with, the kernel): every rank
        # loads the same kernels, and a load (decode, compile) takes a second or two
        self._loaded: dict[tuple[bytes, str | None], tuple[Mapping, LoadedKernel]] = {}

    # ------------------------------------------------------------------ loading
    def load(self, code_object: bytes, kernel: str | None = None) -> LoadedKernel:
        """The kernel decoded and compiled (once per machine: it launches on any device)."""
        key = (bytes(code_object), kernel)
        hit = self._loaded.get(key)
        if hit is not None and hit[0] is self.ops:
            return hit[1]
        loaded = self._load(code_object, kernel)
        self._loaded[key] = (self.ops, loaded)
        return loaded

    def _load(self, code_object: bytes, kernel: str | None) -> LoadedKernel:
        co = CodeObject(code_object)
        if co.arch != self.arch:
            raise EmulatorError(f"the code object is for {co.arch}; this machine is {self.arch}")
        dk = decode_kernel(co, kernel)
        name = dk.kernel.name
        desc = KernelDescriptor.parse(dk.kernel.descriptor)
        try:
            desc.initial_sgprs()
        except ValueError as e:
            raise EmulatorError(f"{name}: {e}", kernel=name) from None
        for what, _, _ in desc.initial_sgprs():
            if what not in ("kernarg_segment_ptr", "workgroup_id_x", "workgroup_id_y",
                            "workgroup_id_z"):  # fmt: skip
                raise EmulatorError(f"{name}: the dispatch register {what} is not supported",
                                    kernel=name)  # fmt: skip
        if desc.enable_private_segment or desc.private_segment_fixed_size:
            raise EmulatorError(f"{name}: scratch (private segment) is not supported", kernel=name)
        if desc.wavefront_size32:
            raise EmulatorError(f"{name}: wave32 is not supported", kernel=name)
        vregs = ((desc.rsrc1 & 0x3F) + 1) * 8  # gfx90a+: unified VGPR granules of 8
        accum = desc.accum_offset
        cfg = Config(self.arch, accum, vregs, self.ops, _mfma(), self.memory, name)
        try:
            prog = compile_kernel(cfg, dk)
        except LoadError as e:
            raise EmulatorError(f"{name}: {e}", kernel=name) from None
        texts = [i.text() for i in dk.instructions] + ["<past the end>"]
        return LoadedKernel(name, self.arch, dk, desc, prog, vregs, accum, texts)

    # ------------------------------------------------------------------ launching
    def launch(self, device: int, kernel: LoadedKernel, grid: int, block: int, kernargs: bytes,
               *, dynamic_lds: int = 0, hold: dict[int, float] | None = None) -> Launch:  # fmt: skip
        if not 0 <= device < self.devices:
            raise ValueError(f"device {device} does not exist (this machine has {self.devices})")
        if kernel.arch != self.arch:
            raise ValueError(f"kernel {kernel.name} is for {kernel.arch}, not {self.arch}")
        if grid < 1 or block < 1 or block > 1024:
            raise ValueError(f"launch of {kernel.name}: grid {grid} and block {block} must be "
                             "positive (block at most 1024)")  # fmt: skip
        if len(kernargs) < kernel.descriptor.kernarg_size:
            raise ValueError(
                f"launch of {kernel.name}: {len(kernargs)} kernarg bytes, the kernel reads "
                f"{kernel.descriptor.kernarg_size}"
            )
        hold = dict(hold or {})
        for wg in hold:
            if not 0 <= wg < grid:
                raise ValueError(f"hold names workgroup {wg}, the grid has {grid}")
        st = LaunchStats(device, kernel.name, grid, block)
        ln = Launch(device, kernel, grid, block, bytes(kernargs), dynamic_lds, hold, st)
        self.queues[device].append(ln)
        return ln

    # ------------------------------------------------------------------ running
    def run(self, *, max_instructions: int | None = None) -> RunStats:
        # the run allocates many short-lived objects (closures of retiring loads, lane arrays);
        # without this every collection would also walk the host program's long-lived objects
        # (torch, the session's tensors): 10-15% of the run. ``gc.unfreeze`` restores them.
        gc.freeze()
        try:
            return self._run(max_instructions)
        except BaseException:
            # a fault stops the whole run: its launches still queued are dropped, so the next
            # run starts from an empty queue rather than resuming them
            for q in self.queues:
                q.clear()
            raise
        finally:
            gc.unfreeze()

    def _run(self, max_instructions: int | None) -> RunStats:
        t0 = _time.perf_counter()
        # (clock, tie, seq, wave, parked): ``parked`` the rest of a gang that still waits at
        # one instruction, under the entry of its earliest member (``park``)
        heap: list[tuple[int, float, int, Wave, tuple[Wave, ...] | None]] = []
        seq = 0
        active: dict[int, Launch | None] = {d: None for d in range(self.devices)}
        wave_launch: dict[int, Launch] = {}
        stats: list[LaunchStats] = []
        start = max(self.device_time) if self.devices else 0  # the host's clock (module doc)
        executed = 0
        rng = self.rng

        def push(w: Wave) -> None:
            nonlocal seq
            seq += 1
            w.seq = seq  # the wave's live entry: a gang takes waves out by zeroing it
            w.tie = float(rng.random())
            heapq.heappush(heap, (w.time, w.tie, seq, w, None))

        def park(ready: list[Wave]) -> None:
            """Put the members of a gang that ran back in the schedule as one entry, that of
            the earliest: the others wait under it (``seq`` PARKED), and its gang takes them
            along again (``_gang_of``: those at its instruction) or puts each back in the
            schedule on its own (``unpark``), before any of their own entries would have come.
            Why: a gang of 2,000 members pushed and popped one by one was a tenth of a
            shipped-layout run, and the earliest member's entry is the one popped first."""
            nonlocal seq
            lead = min(ready, key=lambda x: (x.time, x.tie))
            for x in ready:
                x.seq = PARKED
            seq += 1
            lead.seq = seq
            lead.tie = float(rng.random())
            heapq.heappush(heap, (lead.time, lead.tie, seq, lead, tuple(ready)))

        def unpark(parked: tuple[Wave, ...]) -> None:
            for x in parked:
                if x.seq == PARKED:
                    push(x)

        def start_next(dev: int, at: int) -> None:
            while self.queues[dev]:
                ln = self.queues[dev].pop(0)
                waves = self._dispatch(ln, at)
                stats.append(ln.stats)
                if not waves:
                    ln.done = True
                    continue
                active[dev] = ln
                for w in waves:
                    wave_launch[id(w)] = ln
                    push(w)
                return
            active[dev] = None

        for d in range(self.devices):
            start_next(d, start)
        limit = max_instructions
        report, every = self.progress, self.progress_every
        next_report = every
        try:
            while heap:
                _, _, sq, w, parked = heapq.heappop(heap)
                if sq != w.seq:
                    if parked is not None:
                        unpark(parked)  # its lead ran in another gang since
                    continue  # the wave ran in a gang since: its newer entry is in the heap
                w.seq = 0
                ln = wave_launch[id(w)]
                q = int(rng.integers(1, 2 * QUANTUM)) if self.shuffle else QUANTUM
                if limit is not None:
                    q = max(1, min(q, limit - executed))
                members = self._gang_of(w, ln) if self.gangs else (w,)
                if parked is not None:
                    unpark(parked)  # those its gang did not take along now
                if len(members) == 1:
                    n = self._step(w, ln, q)
                else:
                    n = self._step_gang(members, ln, q)
                ready = []
                for m in members:
                    executed += n
                    ln.stats.instructions += n
                    blk = m.block
                    if blk is None:
                        ready.append(m)
                    elif blk == "barrier":
                        self._arrive(m, push)
                    elif blk == "end":
                        self._end(m, ln, push, start_next)
                if len(ready) > 1:
                    park(ready)
                else:
                    for m in ready:
                        push(m)
                if report is not None and executed >= next_report:
                    next_report = executed + every
                    report(executed, _time.perf_counter() - t0)
                if limit is not None and executed >= limit and heap:
                    live = [e for e in heap if e[2] == e[3].seq]
                    live += [(x.time, 0.0, 0, x, None) for e in live if e[4] for x in e[4]
                             if x.seq == PARKED]  # fmt: skip
                    raise EmulatorError(
                        f"instruction limit {limit} reached with {len(live)} waves still running"
                        f" ({self._where(live)})"
                    )
            stuck = [ln for ln in active.values() if ln is not None and not ln.done]
            if stuck:
                raise EmulatorError("deadlock: " + "; ".join(self._stuck(ln) for ln in stuck))
        finally:
            for ln in list(active.values()):
                if ln is not None and ln.kernarg_base:
                    self._release(ln)
        end = max(self.device_time) if self.devices else 0
        return RunStats(executed, _time.perf_counter() - t0, (end - start) / CLOCK_HZ, stats)

    def _dispatch(self, ln: Launch, at: int) -> list[Wave]:
        k = ln.kernel
        buf = np.zeros(max(len(ln.kernargs), 16) + 64, dtype=np.uint8)
        buf[: len(ln.kernargs)] = np.frombuffer(ln.kernargs, dtype=np.uint8)
        base = int(buf.ctypes.data)
        self.memory.map(base, buf, f"kernargs of {k.name}", ln.device)
        ln.kernarg_buf, ln.kernarg_base = buf, base
        ln.stats.start_cycles = at
        lds = k.descriptor.group_segment_fixed_size + ln.dynamic_lds
        nw = -(-ln.block // LANES)
        sg = k.descriptor.initial_sgprs()
        waves = ln.waves
        ln.regs = regs = np.zeros((k.vregs, ln.grid * nw * LANES), dtype=np.uint32)
        # rows a whole number of dwords apart, so that aligned LDS reads gather dwords
        ln.lds = np.zeros((ln.grid, -(-lds // 4) * 4), dtype=np.uint8)
        for wg_id in range(ln.grid):
            t = at + int(round(ln.hold.get(wg_id, 0.0) * CLOCK_HZ))
            wg = Workgroup(wg_id, ln.lds, ln, lds)
            ln.workgroups.append(wg)
            for i in range(nw):
                col = len(waves) * LANES
                w = Wave(wg, i, k.vregs, k.accum, t, regs[:, col : col + LANES])
                for what, first, _n in sg:
                    if what == "kernarg_segment_ptr":
                        w.s[first], w.s[first + 1] = base & 0xFFFFFFFF, base >> 32
                    elif what == "workgroup_id_x":
                        w.s[first] = wg_id
                    else:  # y / z of a one-dimensional launch
                        w.s[first] = 0
                lanes = min(LANES, ln.block - i * LANES)
                w.v[0] = np.arange(i * LANES, i * LANES + LANES, dtype=np.uint32)
                w.set_exec((1 << lanes) - 1)
                wg.waves.append(w)
                waves.append(w)
        ln.live = len(waves)
        ln.stats.waves = len(waves)
        return list(waves)

    def _release(self, ln: Launch) -> None:
        try:
            self.memory.unmap(ln.kernarg_base)
        except MemoryFault:
            pass
        ln.kernarg_base = 0

    def _step(self, w: Wave, ln: Launch, q: int) -> int:
        """Run ``w`` for up to ``q`` instructions; the number executed."""
        prog = ln.kernel.program
        blocks, steps, touch_v, touch_s = prog.blocks, prog.steps, prog.touch_v, prog.touch_s
        pc = w.pc
        n = 0
        w.block = None
        try:
            while n < q:
                cur = pc
                b = blocks[cur]
                if b is not None and n + b.size <= q and w.clear_of_loads(b.touch_v, b.touch_s):
                    # a run of plain VALU instructions as one step (fuse.py)
                    w.time += CYCLES_PER_INSTRUCTION * b.size
                    pc = b.run(w)
                    n += b.size
                    continue
                if w.clear_of_loads(touch_v[cur], touch_s[cur]):
                    w.time += CYCLES_PER_INSTRUCTION  # ``_alone`` without a hazard to name
                    pc = steps[cur](w)
                else:
                    pc = self._alone(w, prog, cur)
                n += 1
                if pc < 0:
                    pc = ~pc
                    break
        except Exception as e:
            self._raise_at(e, w, ln, cur)
        w.pc = pc
        w.icount += n
        return n

    def _gang_of(self, w: Wave, ln: Launch) -> tuple[Wave, ...]:
        """``w`` and its neighbours in dispatch order that wait in the schedule at its
        instruction, with clocks at most a quantum ahead of its own (so running them now
        reorders no more than a quantum does): ``gang.py``."""
        waves, pc = ln.waves, w.pc
        horizon = w.time + QUANTUM * CYCLES_PER_INSTRUCTION
        k = w.wg.id * len(w.wg.waves) + w.index  # dispatch order: workgroup, then wave
        lo = k
        while lo > 0 and (x := waves[lo - 1]).seq and x.pc == pc and x.time <= horizon:
            lo -= 1
        hi = k + 1
        while hi < len(waves) and (x := waves[hi]).seq and x.pc == pc and x.time <= horizon:
            hi += 1
        if hi - lo == 1:
            return (w,)
        for x in waves[lo:hi]:
            x.seq = 0  # its heap entry is stale from now on
        return tuple(waves[lo:hi])

    def _step_gang(self, members: tuple[Wave, ...], ln: Launch, q: int) -> int:
        """Run the gang ``members`` for up to ``q`` instructions each (``gang.py``): a gang-able
        instruction once on all their lanes, any other one member by member, until the
        members' next instructions differ or one yields. The number each executed."""
        prog = ln.kernel.program
        steps, blocks, gangs, gang_steps = prog.steps, prog.blocks, prog.gang, prog.gang_steps
        scalar, memory = prog.scalar, prog.memory
        touch_v, touch_s, writes_exec = prog.touch_v, prog.touch_s, prog.writes_exec
        k = members[0].wg.id * len(members[0].wg.waves) + members[0].index
        g = Gang(members, ln.regs[:, k * LANES : (k + len(members)) * LANES])
        pc = members[0].pc
        n = 0
        for w in members:
            w.block = None
        # member by member, in the order the schedule would have run them one by one
        order = sorted(members, key=lambda x: (x.time, x.tie))
        w = members[0]
        try:
            while n < q:
                cur = pc
                b = blocks[cur]
                if (
                    b is not None
                    and b.gang is not None
                    and n + b.size <= q
                    and g.clear_of_loads(b.touch_v, b.touch_s)
                    and g.uniform(b.gang)
                ):
                    c = CYCLES_PER_INSTRUCTION * b.size
                    for w in members:
                        w.time += c
                    w = members[0]
                    pc = b.run(g)
                    n += b.size
                    continue
                u = gangs[cur]
                if u is not None and g.clear_of_loads(touch_v[cur], touch_s[cur]) and g.uniform(u):
                    for w in members:
                        w.time += CYCLES_PER_INSTRUCTION
                    w = members[0]
                    try:
                        pc = (gang_steps[cur] or steps[cur])(g)
                    except Fault:  # raised before any effect: the members alone name the wave
                        for w in members:
                            w.time -= CYCLES_PER_INSTRUCTION
                    else:
                        if memory[cur]:  # each member's access in flight, or retired
                            g.loads_changed()
                        n += 1
                        if pc < 0:  # every member yields (s_waitcnt that waited, s_barrier)
                            pc = ~pc
                            break
                        continue
                sc = scalar[cur]
                if (
                    sc is not None
                    and g.clear_of_loads(touch_v[cur], touch_s[cur])
                    and g.scalar_agrees(sc[0])
                ):
                    for w in members:
                        w.time += CYCLES_PER_INSTRUCTION
                    w = members[0]
                    pc = steps[cur](w)  # never yields: a scalar ALU op, a branch, a no-op
                    g.copy_scalar(sc[1])
                    n += 1
                    continue
                nexts = []
                if g.clear_of_loads(touch_v[cur], touch_s[cur]):
                    step = steps[cur]  # no member touches a register in flight (``_alone``)
                    for w in order:
                        w.time += CYCLES_PER_INSTRUCTION
                        nexts.append(step(w))
                else:
                    for w in order:
                        nexts.append(self._alone(w, prog, cur))
                g.loads_changed()
                n += 1
                pc = nexts[0]
                if pc < 0 or nexts.count(pc) != len(nexts):  # a yield, or the paths part
                    for w, x in zip(order, nexts, strict=True):
                        w.pc = ~x if x < 0 else x
                        w.icount += n
                    return n
                if writes_exec[cur]:
                    g.sync_exec()
        except Exception as e:
            self._raise_at(e, w, ln, cur)
        for w in members:
            w.pc = pc
            w.icount += n
        return n

    @staticmethod
    def _alone(w: Wave, prog: Compiled, cur: int) -> int:
        """Instruction ``cur`` on ``w`` alone: its next instruction (``~next`` to yield)."""
        if not w.clear_of_loads(prog.touch_v[cur], prog.touch_s[cur]):
            w.hazard(prog.reads_v[cur], prog.writes_v[cur], prog.reads_s[cur],
                     prog.writes_s[cur])  # fmt: skip
        w.time += CYCLES_PER_INSTRUCTION
        return prog.steps[cur](w)

    def _raise_at(self, e: Exception, w: Wave, ln: Launch, cur: int) -> NoReturn:
        """``e``, raised by instruction ``cur`` of ``w`` (or inside the fused block there), as
        the ``EmulatorError`` naming where; a bug in an operation is still named."""
        if isinstance(e, EmulatorError):
            raise e
        cur = getattr(e, "fused_pc", cur)  # inside a fused block (fuse.py)
        if isinstance(e, (Fault, MemoryFault)):
            raise self._error(w, ln, cur, str(e), getattr(e, "lane", None),
                              getattr(e, "address", None)) from None  # fmt: skip
        raise self._error(w, ln, cur, f"{type(e).__name__}: {e}", None, None) from e

    def _error(self, w: Wave, ln: Launch, pc: int, why: str, lane, address) -> EmulatorError:
        k = ln.kernel
        insts = k.decoded.instructions
        off = insts[pc].offset if pc < len(insts) else len(k.decoded.kernel.code)
        text = k.texts[pc]
        where = (f"{k.name} on device {ln.device}, workgroup {w.wg.id}, wave {w.index}, "
                 f"offset 0x{off:x} ({text})")  # fmt: skip
        err = EmulatorError(f"{where}: {why}", kernel=k.name, device=ln.device,
                            workgroup=w.wg.id, wave=w.index, offset=off, instruction=text,
                            lane=lane, address=address)  # fmt: skip
        err.wave_state = w  # the faulting wave's registers, for whoever debugs the kernel
        return err

    def _arrive(self, w: Wave, push: Callable[[Wave], None]) -> None:
        wg = w.wg
        wg.arrived.append(w)
        self._maybe_release(wg, push)

    def _maybe_release(self, wg: Workgroup, push: Callable[[Wave], None]) -> None:
        live = [x for x in wg.waves if x.block != "end"]
        if wg.arrived and len(wg.arrived) == len(live):
            t = max(x.time for x in wg.arrived)
            for x in wg.arrived:
                x.time = t
                x.block = None
                push(x)
            wg.arrived = []

    def _end(self, w: Wave, ln: Launch, push, start_next) -> None:
        if w.in_flight():
            w.wait(0, 0)  # s_endpgm lets outstanding accesses complete
        self._maybe_release(w.wg, push)
        ln.live -= 1
        dev = ln.device
        if w.time > self.device_time[dev]:
            self.device_time[dev] = w.time
        ln.stats.end_cycles = max(ln.stats.end_cycles, w.time)
        if ln.live == 0:
            ln.done = True
            self._release(ln)
            start_next(dev, self.device_time[dev])

    def _where(self, heap) -> str:
        parts = []
        for _, _, _, w, _ in sorted(heap, key=lambda e: e[0])[:4]:
            ln = w.wg.launch
            k = ln.kernel
            off = k.decoded.instructions[w.pc].offset if w.pc < len(k.decoded.instructions) else -1
            parts.append(f"device {ln.device} workgroup {w.wg.id} wave {w.index} at 0x{off:x}")
        return ", ".join(parts)

    def _stuck(self, ln: Launch) -> str:
        k = ln.kernel
        waiting = []
        for wg in ln.workgroups:
            for w in wg.arrived:
                off = k.decoded.instructions[max(w.pc - 1, 0)].offset
                waiting.append(f"workgroup {wg.id} wave {w.index} at s_barrier 0x{off:x}")
        return (f"{k.name} on device {ln.device}: {ln.live} waves never finish: "
                + ", ".join(waiting[:4]))  # fmt: skip
