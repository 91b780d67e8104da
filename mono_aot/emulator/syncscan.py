"""Structural checks of the sync protocol in a decoded kernel: acquires after poll loops,
releases before peer flag stores.

The instruction sequences are those of LLVM's memory model for these targets: AMDGPUUsage,
section "Memory Model GFX942" (table "AMDHSA Memory Model Code Sequences GFX942"; called
"Memory Model GFX940" in older LLVM releases). gfx950 gets the same sequences: the shipped
gfx950 kernels carry exactly these (``tests/kernels/test_sync_isa.py`` checks both archs). On
these targets the vector L1 and, between agents, the L2 are not coherent, so

* a monotonic (relaxed) atomic load is ``global_load`` with ``sc1`` at agent scope and
  ``sc0 sc1`` at system scope (it reads through the caches); a plain load has neither bit;
* an acquire at agent / system scope is ``s_waitcnt vmcnt(0)`` (the load that observed the flag
  has completed) then ``buffer_inv sc1`` / ``buffer_inv sc0 sc1`` (later loads miss the stale
  cache lines);
* a release at agent / system scope is ``buffer_wbl2 sc1`` / ``buffer_wbl2 sc0 sc1`` (write
  back the L2) then ``s_waitcnt vmcnt(0)`` (every earlier store and the write-back are done),
  before the store or atomic that publishes; a system-scope atomic has ``sc1``, a system-scope
  store ``sc0 sc1``.

The protocol (``mono_aot/kernels/sync.py`` ``wait_word`` and ``grid_barrier``,
``mono_aot/kernels/allreduce.py`` ``push`` and ``receive``): one thread polls a flag with
relaxed loads in a loop that sleeps (``s_sleep``) and is bounded by ``s_memrealtime``, then
fences (acquire); the workgroup meets at ``s_barrier`` and every wave fences (acquire) again
before reading what the flag guards. A push stores its data with plain stores from every wave,
every wave fences (system release), the workgroup meets at ``s_barrier``, and then a few lanes
of one wave store the tag flags with system-scope atomics.

What is checked, per kernel:

* **Poll loops**: the innermost loop around each ``s_sleep`` whose exit branch depends
  (``flow.FlowGraph.exit_slice``) on a global load or atomic in the loop. Its scope is the
  widest scope of those loads; a poll whose loads are not coherent at agent scope at least, or
  whose exit does not depend on ``s_memrealtime`` (unbounded), is a finding.
* **Acquire after a poll loop**: on every path from a loop exit, a ``buffer_inv`` with the
  scope's bits comes before any plain load (a ``global_load`` without ``sc1``, or a scalar
  ``s_load``, which no ``buffer_inv`` covers). Loads with ``sc1`` are relaxed atomic loads at
  agent or system scope, how the kernels read their sync words (the next flag, the abort word);
  they read through the caches and need no acquire. Crossing an
  ``s_barrier`` starts the requirement again: the waves that did not poll read the guarded
  data after the barrier and need an acquire of their own. The load that observed the flag has
  completed by construction (the exit branch depends on its value), so the ``s_waitcnt`` of the
  sequence is not required separately (LLVM drops it when nothing is outstanding).
  This treats every non-coherent load as possibly reading guarded data: a conservative reading
  of "the next global load of the data it guards", since addresses are not analysed.
* **Peer flag stores** are the system-scope writes (atomics with ``sc1``, stores with
  ``sc0 sc1``): the kernels make no other system-scope write, the mailbox data goes out with
  plain stores and the flag publishes it. On every path to a flag store, every global write
  (store or atomic) is followed, before the flag, by ``buffer_wbl2 sc0 sc1`` then
  ``s_waitcnt vmcnt(0)``. Up to the first ``s_barrier`` behind
  the flag, the wave that stores the flag may use its own release; the writes before that
  barrier are the other waves' too, so a release must sit between them and the barrier (a
  release that only the flag's wave executes after the barrier does not publish them). The
  walk ends at the barrier before that one: a flag publishes the data of its own barrier
  interval (``push`` stores the mailbox blocks straight from the LDS tile, which the previous
  workgroup barrier completed, then fences, meets and stores the flags); earlier writes are
  not read through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mono_aot.emulator.decode import DecodedKernel, Instruction
from mono_aot.emulator.flow import FlowGraph, build

SCOPES = ("none", "workgroup", "agent", "system")
_RANK = {s: i for i, s in enumerate(SCOPES)}
ARCHS = ("gfx942", "gfx950")  # the targets whose memory model this module encodes


def _bit(inst: Instruction, name: str) -> bool:
    return bool(inst.fields.get(name, 0))


def is_vmem_load(inst: Instruction) -> bool:
    return inst.fmt == "FLAT" and inst.op.kind == "load"


def is_vmem_write(inst: Instruction) -> bool:
    return inst.fmt == "FLAT" and inst.op.kind in ("store", "atomic")


def is_returning_atomic(inst: Instruction) -> bool:
    return inst.fmt == "FLAT" and inst.op.kind == "atomic" and _bit(inst, "sc0")


def is_scalar_load(inst: Instruction) -> bool:
    return inst.fmt == "SMEM" and inst.op.kind == "load"


def load_scope(inst: Instruction) -> str:
    """The scope at which a FLAT load is coherent: ``sc0 sc1`` system, ``sc1`` agent, ``sc0``
    workgroup, neither: none (a plain load)."""
    sc0, sc1 = _bit(inst, "sc0"), _bit(inst, "sc1")
    return "system" if sc0 and sc1 else "agent" if sc1 else "workgroup" if sc0 else "none"


def write_scope(inst: Instruction) -> str:
    """The scope of a FLAT store (as ``load_scope``) or atomic (``sc1`` system, else agent:
    atomics bypass the L1; their ``sc0`` asks for the old value)."""
    if inst.op.kind == "atomic":
        return "system" if _bit(inst, "sc1") else "agent"
    return load_scope(inst)


def _cache_bits(scope: str) -> tuple[bool, bool]:
    return {"agent": (False, True), "system": (True, True)}[scope]


def is_acquire_inv(inst: Instruction, scope: str) -> bool:
    """``buffer_inv`` that invalidates at ``scope`` or wider."""
    if inst.name != "buffer_inv":
        return False
    sc0, sc1 = _cache_bits(scope)
    return (_bit(inst, "sc0") or not sc0) and (_bit(inst, "sc1") or not sc1)


def is_release_wbl2(inst: Instruction, scope: str) -> bool:
    """``buffer_wbl2`` that writes back at ``scope`` or wider."""
    if inst.name != "buffer_wbl2":
        return False
    sc0, sc1 = _cache_bits(scope)
    return (_bit(inst, "sc0") or not sc0) and (_bit(inst, "sc1") or not sc1)


def is_vmcnt0(inst: Instruction) -> bool:
    return inst.name == "s_waitcnt" and inst.fields.get("vmcnt") == 0


def acquire_text(scope: str) -> str:
    return "buffer_inv sc1" if scope == "agent" else "buffer_inv sc0 sc1"


def release_text(scope: str) -> str:
    return (
        "buffer_wbl2 sc1" if scope == "agent" else "buffer_wbl2 sc0 sc1"
    ) + " + s_waitcnt vmcnt(0)"


# ------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class PollLoop:
    """A sleeping loop that polls global memory: ``header`` and ``sleep`` are byte offsets,
    ``loads`` the polled loads (offsets) its exit depends on, ``scope`` their widest scope."""

    header: int
    sleep: int
    loads: tuple[int, ...]
    scope: str
    bounded: bool  # the exit depends on s_memrealtime
    exits: tuple[int, ...]  # offsets of the blocks the loop exits to


@dataclass(frozen=True)
class FlagStore:
    offset: int
    text: str


@dataclass(frozen=True)
class Finding:
    """One violation: ``rule`` (``poll``, ``acquire``, ``release``), the poll loop's header or
    the flag store (``subject``, an offset), the instruction that breaks it (``at``)."""

    kernel: str
    rule: str
    subject: int
    at: int
    message: str

    def __str__(self) -> str:
        return f"{self.kernel}: {self.message}"


@dataclass
class Report:
    kernel: str
    arch: str
    loops: list[PollLoop]
    flags: list[FlagStore]
    findings: list[Finding] = field(default_factory=list)
    # the acquires / releases that satisfied each subject: (phase, offset); phase 1 before the
    # workgroup barrier (the polling or flag-storing wave), phase 2 after / before it (all waves)
    acquires: dict[int, set[tuple[int, int]]] = field(default_factory=dict)
    releases: dict[int, set[tuple[int, int]]] = field(default_factory=dict)

    def findings_for(self, subject: int) -> list[Finding]:
        return [f for f in self.findings if f.subject == subject]


# ------------------------------------------------------------------------------ poll loops
def find_poll_loops(g: FlowGraph) -> tuple[list[PollLoop], list[Finding]]:
    """Every poll loop (see the module doc), and the findings about the polls themselves."""
    loops: dict[int, PollLoop] = {}
    findings: list[Finding] = []
    for i, inst in enumerate(g.instructions):
        if inst.name != "s_sleep":
            continue
        lp = g.innermost_loop(i)
        if lp is None:
            continue
        header = g.blocks[lp.header].start
        if header in loops:
            continue
        sl = g.exit_slice(lp)
        polled = [
            j
            for j in sorted(sl)
            if is_vmem_load(g.instructions[j]) or is_returning_atomic(g.instructions[j])
        ]
        if not polled:
            continue  # sleeps, but its exit does not depend on memory: not a poll
        scopes = [
            load_scope(g.instructions[j]) if is_vmem_load(g.instructions[j]) else "agent"
            for j in polled
        ]
        # a poll waits for another workgroup: agent scope at least (a weaker load is a finding)
        scope = max([*scopes, "agent"], key=_RANK.__getitem__)
        bounded = any(g.instructions[j].name == "s_memrealtime" for j in sl)
        pl = PollLoop(
            header,
            inst.offset,
            tuple(g.instructions[j].offset for j in polled),
            scope,
            bounded,
            tuple(sorted({g.blocks[t].start for _, t in lp.exits})),
        )
        loops[header] = pl
        where = f"poll loop at 0x{header:x} (s_sleep at 0x{inst.offset:x})"
        for j, s in zip(polled, scopes, strict=True):
            if _RANK[s] < _RANK["agent"]:
                findings.append(Finding(
                    g.kernel, "poll", header, g.instructions[j].offset,
                    f"{where}: the polled load at 0x{g.instructions[j].offset:x} "
                    f"`{g.instructions[j].text()}` is not coherent at agent scope (needs sc1)",
                ))  # fmt: skip
        if not bounded:
            findings.append(Finding(
                g.kernel, "poll", header, inst.offset,
                f"{where}: its exit does not depend on s_memrealtime (the wait is unbounded)",
            ))  # fmt: skip
    return sorted(loops.values(), key=lambda p: p.header), findings


def find_flag_stores(g: FlowGraph) -> list[FlagStore]:
    """Every system-scope store or atomic: the writes a peer GPU reads as a flag."""
    return [
        FlagStore(inst.offset, inst.text())
        for inst in g.instructions
        if is_vmem_write(inst) and write_scope(inst) == "system"
    ]


# ------------------------------------------------------------------------------ acquire
def _guarded(inst: Instruction) -> bool:
    """A load that may read data a flag guards: a plain vector load (not an atomic load at
    agent or system scope, which reads through the caches itself and is how the kernels read
    their sync words) or a scalar load."""
    if is_scalar_load(inst):
        return True
    return is_vmem_load(inst) and _RANK[load_scope(inst)] < _RANK["agent"]


def check_acquire(g: FlowGraph, pl: PollLoop) -> tuple[list[Finding], set[tuple[int, int]]]:
    """Forward from the loop's exits (see the module doc): findings and the acquires used."""
    scope = pl.scope
    findings: dict[int, Finding] = {}
    used: set[tuple[int, int]] = set()
    where = f"poll loop at 0x{pl.header:x} ({scope} scope, s_sleep at 0x{pl.sleep:x})"
    seen: set[tuple[int, int, bool]] = set()
    work: list[tuple[int, int, bool, int]] = []  # block, phase, done, barrier offset
    for t in pl.exits:
        work.append((g.block_of(g.index_of(t)).index, 1, False, -1))
    while work:
        b, phase, done, bar = work.pop()
        if (b, phase, done) in seen:
            continue
        seen.add((b, phase, done))
        blk = g.blocks[b]
        stop = False
        for inst in g.block_instructions(blk):
            if inst.name == "s_barrier":
                phase, done, bar = 2, False, inst.offset
            elif is_acquire_inv(inst, scope):
                used.add((phase, inst.offset))
                if phase == 2:
                    stop = True
                    break
                done = True
            elif _guarded(inst) and (not done or is_scalar_load(inst)):
                if inst.offset not in findings:
                    if phase == 1:
                        how = "on the polling wave's path, with no"
                    else:
                        how = f"after the workgroup barrier at 0x{bar:x}, with no"
                    findings[inst.offset] = Finding(
                        g.kernel, "acquire", pl.header, inst.offset,
                        f"{where}: the load at 0x{inst.offset:x} `{inst.text()}` is reached "
                        f"{how} {acquire_text(scope)} since the poll (LLVM's {scope}-scope "
                        "acquire)" + (" (a scalar load: no buffer_inv covers the scalar "
                                      "cache)" if is_scalar_load(inst) else ""),
                    )  # fmt: skip
                stop = True
                break
            elif inst.name == "s_endpgm":
                stop = True
                break
        if stop:
            continue
        for s in blk.succs:
            work.append((s, phase, done, bar))
    return sorted(findings.values(), key=lambda f: f.at), used


# ------------------------------------------------------------------------------ release
_NEED, _NEED_WBL2, _DONE = 0, 1, 2


def check_release(g: FlowGraph, fs: FlagStore) -> tuple[list[Finding], set[tuple[int, int]]]:
    """Backward from a flag store (see the module doc): findings and the releases used."""
    findings: dict[int, Finding] = {}
    used: set[tuple[int, int]] = set()
    f_idx = g.index_of(fs.offset)
    where = f"flag store at 0x{fs.offset:x} `{fs.text}`"
    seen: set[tuple[int, int, int]] = set()
    # block, phase, state, instruction index to go backwards from, barrier offset, the wait
    start = g.block_of(f_idx)
    work: list[tuple[int, int, int, int, int, int]] = [(start.index, 1, _NEED, f_idx - 1, -1, -1)]
    first = True
    while work:
        b, phase, st, i, bar, pending_wait = work.pop()
        if not first:
            if (b, phase, st) in seen:
                continue
            seen.add((b, phase, st))
        first = False
        blk = g.blocks[b]
        stop = False
        while i >= blk.first:
            inst = g.instructions[i]
            if inst.name == "s_barrier" and phase == 1:
                phase, st, bar = 2, _NEED, inst.offset
            elif inst.name == "s_barrier":
                stop = True  # the interval before it holds no data this flag publishes
                break
            elif is_vmcnt0(inst) and st == _NEED:
                st, pending_wait = _NEED_WBL2, inst.offset
            elif is_release_wbl2(inst, "system") and st == _NEED_WBL2:
                used.add((phase, inst.offset))
                if pending_wait >= 0:
                    used.add((phase, pending_wait))
                if phase == 2:
                    stop = True
                    break
                st = _DONE
            elif is_vmem_write(inst) and st != _DONE:
                if inst.offset not in findings:
                    if phase == 1:
                        how = "by the flag's own wave with no"
                    else:
                        how = (f"before the workgroup barrier at 0x{bar:x} (by every wave) "
                               "with no")  # fmt: skip
                    findings[inst.offset] = Finding(
                        g.kernel, "release", fs.offset, inst.offset,
                        f"{where}: the write at 0x{inst.offset:x} `{inst.text()}` is made "
                        f"{how} {release_text('system')} after it (LLVM's system-scope "
                        "release)",
                    )  # fmt: skip
                stop = True
                break
            i -= 1
        if stop:
            continue
        for p in blk.preds:
            pb = g.blocks[p]
            work.append((p, phase, st, pb.last, bar, pending_wait))
    return sorted(findings.values(), key=lambda f: f.at), used


# ------------------------------------------------------------------------------ entry
def scan(kernel: DecodedKernel | FlowGraph) -> Report:
    """Every check of this module on one decoded kernel (or its flow graph)."""
    g = kernel if isinstance(kernel, FlowGraph) else build(kernel)
    if g.arch not in ARCHS:
        raise ValueError(f"{g.kernel}: no memory model for {g.arch} (known: {', '.join(ARCHS)})")
    loops, findings = find_poll_loops(g)
    flags = find_flag_stores(g)
    rep = Report(g.kernel, g.arch, loops, flags, findings)
    for pl in loops:
        f, used = check_acquire(g, pl)
        rep.findings += f
        rep.acquires[pl.header] = used
    for fs in flags:
        f, used = check_release(g, fs)
        rep.findings += f
        rep.releases[fs.offset] = used
    return rep
