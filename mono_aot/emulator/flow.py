"""The control flow of a decoded kernel: basic blocks, successors, dominators, natural loops,
and the registers each instruction reads and writes.

Built on ``decode.decode_kernel`` (branch targets are byte offsets in the kernel). Branches are
the SOPP ``s_branch`` (always taken) and ``s_cbranch_*`` (taken or fall through); ``s_endpgm``
ends a path. An indirect jump cannot be followed, so an instruction that sets the program
counter is a ``FlowError``; so is a cycle that is not a natural loop (irreducible control flow,
which LLVM's AMDGPU backend never emits: it structurises the CFG for the EXEC mask).

The register sets (``reads``/``writes``) serve data-dependence slices such as "does this loop's
exit depend on the value it loads": explicit operands by their role (``vdst``, ``sdst``,
``vcc_out`` are written, every other register operand is read) plus the implicit ones the
operand list does not print: SCC (written by scalar ALU and compare instructions, read by
``s_cselect``, ``s_addc``/``s_subb``, ``s_cmov`` and ``s_cbranch_scc*``), VCC (read by
``s_cbranch_vcc*``), EXEC (read by ``s_cbranch_exec*``, written and read by the ``*_saveexec``
family). Sets may over-approximate (an ALU op marked as writing SCC that leaves it alone),
never miss a register an instruction names.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from mono_aot.emulator.decode import LONG_JUMP, DecodedKernel, Instruction, Operand

END = "s_endpgm"
UNCONDITIONAL = "s_branch"
_INDIRECT = ("s_setpc_b64", "s_swappc_b64", "s_rfe_b64", "s_cbranch_join", "s_cbranch_g_fork")


class FlowError(ValueError):
    """The kernel's control flow cannot be modelled: names the kernel, offset and reason."""


def is_long_jump(inst: Instruction) -> bool:
    """LLVM's long branch, whose target the decoder resolved (``decode._resolve_long_jumps``)."""
    return inst.base == LONG_JUMP and "target" in inst.fields


def is_branch(inst: Instruction) -> bool:
    return (inst.fmt == "SOPP" and inst.op.kind == "branch") or is_long_jump(inst)


def is_unconditional(inst: Instruction) -> bool:
    return inst.name == UNCONDITIONAL or is_long_jump(inst)


def branch_target(inst: Instruction) -> int:
    """The byte offset a branch jumps to."""
    if is_long_jump(inst):
        return inst.fields["target"]
    return int(inst.operand("target").value)


# ------------------------------------------------------------------------------ registers
_SPECIAL_NAMES = {106: "vcc_lo", 107: "vcc_hi", 126: "exec_lo", 127: "exec_hi", 124: "m0",
                  102: "flat_scratch_lo", 103: "flat_scratch_hi", 104: "xnack_mask_lo",
                  105: "xnack_mask_hi"}  # fmt: skip
_SRC_IMPLICIT = {251: ("vcc_lo", "vcc_hi"), 252: ("exec_lo", "exec_hi"), 253: ("scc",)}
VCC = frozenset({"vcc_lo", "vcc_hi"})
EXEC = frozenset({"exec_lo", "exec_hi"})
SCC = "scc"
_DESTINATION_ROLES = ("vdst", "sdst", "vcc_out")
_READS_SCC = ("s_cselect_", "s_addc_", "s_subb_", "s_cmov", "s_cbranch_scc")
_SCC_FREE_SOP1 = ("s_mov", "s_cmov", "s_getpc", "s_brev", "s_sext", "s_bitset", "s_movk")
_SCC_FREE_SOP2 = ("s_cselect_", "s_bfm_", "s_mul_i32", "s_mul_hi_", "s_pack_")


def operand_registers(o: Operand) -> tuple[str, ...]:
    """The registers one operand names (``s4``, ``v[2:3]`` -> ``v2``, ``v3``; ``vcc`` ->
    ``vcc_lo``, ``vcc_hi``; ``src_scc`` -> ``scc``); constants and literals name none."""
    if o.kind in ("s", "v", "a"):
        return tuple(f"{o.kind}{o.index + i}" for i in range(o.width))
    if o.kind == "special":
        if o.index in _SRC_IMPLICIT:
            return _SRC_IMPLICIT[o.index]
        if 108 <= o.index <= 123:
            return tuple(f"ttmp{o.index - 108 + i}" for i in range(o.width))
        return tuple(_SPECIAL_NAMES.get(o.index + i, f"hw{o.index + i}") for i in range(o.width))
    return ()


def writes(inst: Instruction) -> frozenset[str]:
    """Registers ``inst`` may write (explicit destinations and implicit SCC/EXEC)."""
    out: set[str] = set()
    for o, role in zip(inst.operands, inst.roles, strict=True):
        if role in _DESTINATION_ROLES:
            out.update(operand_registers(o))
    n = inst.name
    if inst.fmt in ("SOPC",) or (
        inst.fmt == "SOPK" and (inst.op.kind == "cmp" or n == "s_addk_i32")
    ):
        out.add(SCC)
    elif inst.fmt == "SOP2" and not n.startswith(_SCC_FREE_SOP2):
        out.add(SCC)
    elif inst.fmt == "SOP1" and not n.startswith(_SCC_FREE_SOP1):
        out.add(SCC)
    if "saveexec" in n or "wrexec" in n:
        out.update(EXEC)
    return frozenset(out)


def reads(inst: Instruction) -> frozenset[str]:
    """Registers ``inst`` may read (explicit sources and implicit SCC/VCC/EXEC)."""
    out: set[str] = set()
    for o, role in zip(inst.operands, inst.roles, strict=True):
        if role not in _DESTINATION_ROLES:
            out.update(operand_registers(o))
    n = inst.name
    if n.startswith(_READS_SCC):
        out.add(SCC)
    if n.startswith("s_cbranch_vcc"):
        out.update(VCC)
    if n.startswith("s_cbranch_exec") or "saveexec" in n or "wrexec" in n:
        out.update(EXEC)
    return frozenset(out)


# ------------------------------------------------------------------------------ blocks
@dataclass(frozen=True)
class Block:
    """Instructions ``first`` .. ``last`` (indices, inclusive) at byte offsets ``start`` up to
    ``end`` (exclusive); ``succs``/``preds`` are block indices."""

    index: int
    first: int
    last: int
    start: int
    end: int
    succs: tuple[int, ...]
    preds: tuple[int, ...] = ()


@dataclass(frozen=True)
class Loop:
    """A natural loop: ``header`` dominates every block of ``blocks``; ``latches`` jump back to
    it; ``exits`` are the edges (from a loop block, to a block outside)."""

    header: int
    blocks: frozenset[int]
    latches: tuple[int, ...]
    exits: tuple[tuple[int, int], ...]


@dataclass
class FlowGraph:
    """Basic blocks of one decoded kernel (block 0 is the entry)."""

    kernel: str
    arch: str
    instructions: tuple[Instruction, ...]
    blocks: tuple[Block, ...]
    _by_offset: dict[int, int] = field(default_factory=dict, repr=False)
    _block_of: list[int] = field(default_factory=list, repr=False)
    _idom: list[int] | None = field(default=None, repr=False)
    _loops: tuple[Loop, ...] | None = field(default=None, repr=False)

    # -------------------------------------------------------------------- lookup
    def index_of(self, offset: int) -> int:
        """The index of the instruction at byte ``offset``."""
        try:
            return self._by_offset[offset]
        except KeyError:
            raise KeyError(f"{self.kernel}: no instruction starts at offset 0x{offset:x}") from None

    def block_of(self, index: int) -> Block:
        """The block holding instruction ``index``."""
        return self.blocks[self._block_of[index]]

    def block_instructions(self, b: Block) -> tuple[Instruction, ...]:
        return self.instructions[b.first : b.last + 1]

    # -------------------------------------------------------------------- dominators
    def _rpo(self) -> list[int]:
        seen = [False] * len(self.blocks)
        order: list[int] = []
        stack: list[tuple[int, Iterator[int]]] = [(0, iter(self.blocks[0].succs))]
        seen[0] = True
        while stack:
            b, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                order.append(b)
            elif not seen[nxt]:
                seen[nxt] = True
                stack.append((nxt, iter(self.blocks[nxt].succs)))
        order.reverse()
        return order

    def idom(self) -> list[int]:
        """Immediate dominator of every block (the entry's is itself; -1: unreachable), by the
        iterative algorithm of Cooper, Harvey and Kennedy ("A Simple, Fast Dominance
        Algorithm", 2001)."""
        if self._idom is not None:
            return self._idom
        rpo = self._rpo()
        pos = {b: i for i, b in enumerate(rpo)}
        idom = [-1] * len(self.blocks)
        idom[0] = 0

        def meet(a: int, b: int) -> int:
            while a != b:
                while pos[a] > pos[b]:
                    a = idom[a]
                while pos[b] > pos[a]:
                    b = idom[b]
            return a

        changed = True
        while changed:
            changed = False
            for b in rpo[1:]:
                preds = [p for p in self.blocks[b].preds if idom[p] != -1]
                new = preds[0]
                for p in preds[1:]:
                    new = meet(p, new)
                if idom[b] != new:
                    idom[b] = new
                    changed = True
        self._idom = idom
        return idom

    def dominates(self, a: int, b: int) -> bool:
        """Whether block ``a`` dominates block ``b`` (every path from the entry to ``b``
        passes ``a``)."""
        idom = self.idom()
        if idom[b] == -1:
            return False
        while True:
            if a == b:
                return True
            if b == 0:
                return False
            b = idom[b]

    # -------------------------------------------------------------------- loops
    def loops(self) -> tuple[Loop, ...]:
        """Every natural loop (back edges to one header merged), innermost first. Raises
        ``FlowError`` on a cycle without a dominating header."""
        if self._loops is not None:
            return self._loops
        idom = self.idom()
        back: dict[int, list[int]] = {}
        # a retreating edge in a depth-first order that is not a back edge makes the graph
        # irreducible
        state = [0] * len(self.blocks)  # 0 new, 1 on stack, 2 done
        stack: list[tuple[int, Iterator[int]]] = [(0, iter(self.blocks[0].succs))]
        state[0] = 1
        while stack:
            b, it = stack[-1]
            s = next(it, None)
            if s is None:
                stack.pop()
                state[b] = 2
                continue
            if state[s] == 1:
                if not self.dominates(s, b):
                    raise FlowError(
                        f"{self.kernel}: irreducible control flow: the edge 0x{self.blocks[b].start:x}"
                        f" -> 0x{self.blocks[s].start:x} enters a cycle that 0x"
                        f"{self.blocks[s].start:x} does not dominate"
                    )
                back.setdefault(s, []).append(b)
            elif state[s] == 0:
                state[s] = 1
                stack.append((s, iter(self.blocks[s].succs)))
        loops = []
        for h, latches in back.items():
            body = {h}
            work = [lt for lt in latches if lt != h]
            body.update(work)
            while work:
                x = work.pop()
                for p in self.blocks[x].preds:
                    if p not in body and idom[p] != -1:
                        body.add(p)
                        work.append(p)
            exits = tuple(
                sorted((b, s) for b in body for s in self.blocks[b].succs if s not in body)
            )
            loops.append(Loop(h, frozenset(body), tuple(sorted(latches)), exits))
        loops.sort(key=lambda lp: (len(lp.blocks), lp.header))
        self._loops = tuple(loops)
        return self._loops

    def innermost_loop(self, index: int) -> Loop | None:
        """The smallest loop holding instruction ``index`` (None outside every loop)."""
        b = self._block_of[index]
        for lp in self.loops():  # innermost first
            if b in lp.blocks:
                return lp
        return None

    def loop_instructions(self, lp: Loop) -> Iterator[tuple[int, Instruction]]:
        for b in sorted(lp.blocks):
            blk = self.blocks[b]
            for i in range(blk.first, blk.last + 1):
                yield i, self.instructions[i]

    def exit_slice(self, lp: Loop) -> frozenset[int]:
        """Indices of the loop's instructions the exit decisions depend on: the conditional
        branches that leave the loop, and, transitively, every loop instruction that writes a
        register they read (flow-insensitive within the loop, so an over-approximation)."""
        insts = list(self.loop_instructions(lp))
        wanted: set[str] = set()
        out: set[int] = set()
        for b, _ in lp.exits:
            last = self.blocks[b].last
            term = self.instructions[last]
            if is_branch(term) and not is_unconditional(term):
                out.add(last)
                wanted |= reads(term)
        changed = True
        while changed:
            changed = False
            for i, inst in insts:
                if i in out:
                    continue
                if writes(inst) & wanted:
                    out.add(i)
                    wanted |= reads(inst)
                    changed = True
        return frozenset(out)


def build(decoded: DecodedKernel) -> FlowGraph:
    """The flow graph of a decoded kernel."""
    insts = decoded.instructions
    name = decoded.kernel.name
    if not insts:
        raise FlowError(f"{name}: the kernel has no instructions")
    by_offset = {inst.offset: i for i, inst in enumerate(insts)}
    leaders = {0}
    for i, inst in enumerate(insts):
        if inst.name in _INDIRECT and not is_long_jump(inst):
            raise FlowError(f"{name}: offset 0x{inst.offset:x}: {inst.name} is an indirect jump")
        if is_branch(inst) or inst.name == END:
            if i + 1 < len(insts):
                leaders.add(i + 1)
            if is_branch(inst):
                t = branch_target(inst)
                if t not in by_offset:
                    raise FlowError(
                        f"{name}: offset 0x{inst.offset:x}: {inst.name} targets 0x{t:x}, which "
                        "is not the start of an instruction"
                    )
                leaders.add(by_offset[t])
    starts = sorted(leaders)
    block_of = [0] * len(insts)
    spans = []
    for bi, first in enumerate(starts):
        last = (starts[bi + 1] if bi + 1 < len(starts) else len(insts)) - 1
        for i in range(first, last + 1):
            block_of[i] = bi
        spans.append((first, last))
    succs: list[list[int]] = []
    for _, last in spans:
        term = insts[last]
        out: list[int] = []
        if term.name == END:
            pass
        elif is_branch(term):
            t = block_of[by_offset[branch_target(term)]]
            if not is_unconditional(term) and last + 1 < len(insts):
                out.append(block_of[last + 1])
            if t not in out:
                out.append(t)
        elif last + 1 < len(insts):
            out.append(block_of[last + 1])
        else:
            raise FlowError(
                f"{name}: offset 0x{term.offset:x}: {term.name} runs off the end of the kernel"
            )
        succs.append(out)
    preds: list[list[int]] = [[] for _ in spans]
    for b, ss in enumerate(succs):
        for s in ss:
            preds[s].append(b)
    blocks = tuple(
        Block(
            b,
            first,
            last,
            insts[first].offset,
            insts[last].offset + insts[last].size,
            tuple(succs[b]),
            tuple(preds[b]),
        )
        for b, (first, last) in enumerate(spans)
    )
    return FlowGraph(name, decoded.kernel.arch, insts, blocks, by_offset, block_of)


def reachable(graph: FlowGraph, starts: Iterable[int]) -> set[int]:
    """Blocks reachable from the blocks ``starts`` (included)."""
    seen = set(starts)
    work = list(seen)
    while work:
        for s in graph.blocks[work.pop()].succs:
            if s not in seen:
                seen.add(s)
                work.append(s)
    return seen
