"""Straight-line runs of plain VALU instructions executed as one step, with the packed-f32
elementwise instructions among them batched into one numpy pass.

Why: in the kernels' GEMV loops ``v_pk_fma_f32`` is most of the wave-instructions, in groups
of independent accumulators (``v_pk_fma_f32 v[32:33], v[90:91], v[118:119], v[32:33]`` for
three or more destinations in a row, interleaved with the ``v_lshlrev``/``v_and`` that unpack
the next operands). One instruction costs a dozen numpy calls on 128 floats; a batch of K costs
the same dozen on K * 128.

What makes it the same computation: a block holds only "plain" VALU instructions
(``Compiled.plain``: each writes one vector destination under EXEC and nothing else, reads
VGPRs, SGPRs and EXEC, never yields, never touches memory), so within a block EXEC and the
SGPRs are constant and instructions interact only through VGPRs. Packed instructions are
deferred into a pending batch and the batch is executed (all its reads, then all its writes)
before any instruction that reads a row the batch writes, writes a row it reads or writes, or
is a packed instruction of another operation or one that reads/writes a row the batch writes;
that is exactly the in-order result, since the reordered instructions touch disjoint rows.
The per-lane arithmetic is the operation's own elementwise function (``valu._pk`` exports it
as ``elementwise_f32``) on the same bits. The scheduler (``machine.Machine._step``) runs a
block only when the whole block fits in the wave's quantum and no load in flight writes a
register the block touches; otherwise it steps instruction by instruction as before. So the
order in which waves interleave, their clocks and every value are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

MAX_BLOCK = 16  # instructions: short enough to fit in what is left of a quantum (machine.QUANTUM)


class Block:
    """The plan of one block: ``run(wave)`` executes ``size`` instructions from ``start``."""

    __slots__ = ("start", "size", "touch_v", "touch_s", "run", "gang")

    def __init__(self, start: int, size: int, touch_v: frozenset[int], touch_s: frozenset[int],
                 run: Callable, gang: tuple[int, ...] | None = None) -> None:  # fmt: skip
        self.start, self.size, self.touch_v, self.touch_s, self.run = (
            start, size, touch_v, touch_s, run
        )  # fmt: skip
        # as ``Compiled.gang`` for the whole block: the scalar registers a gang must agree on
        self.gang = gang


def _batch(fn: Callable, items: list[tuple[int, tuple]]) -> Callable:
    """One pass of ``fn`` over the batched instructions ``items`` [(pc, packed)]."""
    nsrc = len(items[0][1][1])
    src_rows = [np.array([p[1][k] for _, p in items], dtype=np.intp) for k in range(nsrc)]
    dst_rows = np.array([p[2] for _, p in items], dtype=np.intp)  # (K, 2)

    def run(w) -> None:
        v = w.v
        # (K, 2, 64): [instruction, column, lane]; fn is elementwise, so the layout is free
        srcs = [v[r].view(np.float32) for r in src_rows]
        with np.errstate(all="ignore"):
            res = np.asarray(fn(*srcs), dtype=np.float32).view(np.uint32)
        if w.exec_all:
            v[dst_rows] = res
        else:
            v[dst_rows] = np.where(w.exec_mask, res, v[dst_rows])

    return run


def _plan(prog, start: int, end: int) -> Block | None:
    """The block of instructions ``start..end-1`` (all plain), or None when no two packed
    instructions would batch (nothing to gain)."""
    steps = prog.steps
    ops: list[tuple[int, Callable]] = []  # (first pc, a step or a batch's run), in order
    pend: list[tuple[int, tuple]] = []
    pend_fn = None
    pend_w: set[int] = set()
    pend_r: set[int] = set()
    batched = 0

    def flush() -> None:
        nonlocal pend, pend_fn, batched
        if len(pend) == 1:
            ops.append((pend[0][0], steps[pend[0][0]]))
        elif pend:
            ops.append((pend[0][0], _batch(pend_fn, pend)))
            batched += len(pend)
        pend = []
        pend_fn = None
        pend_w.clear()
        pend_r.clear()

    for pc in range(start, end):
        packed = prog.plain[pc][0]
        rv, wv = set(prog.reads_v[pc]), set(prog.writes_v[pc])
        if packed is not None:
            if pend and (packed[0] is not pend_fn or rv & pend_w or wv & pend_w):
                flush()
            pend.append((pc, packed))
            pend_fn = packed[0]
            pend_w |= wv
            pend_r |= rv
            continue
        if pend and (rv & pend_w or wv & (pend_w | pend_r)):
            flush()
        ops.append((pc, steps[pc]))
    flush()
    if batched < 2:
        return None
    touch_v = frozenset().union(*(prog.touch_v[pc] for pc in range(start, end)))
    touch_s = frozenset().union(*(prog.touch_s[pc] for pc in range(start, end)))
    calls = tuple(f for _, f in ops)
    pcs = tuple(pc for pc, _ in ops)
    nxt = end

    def run(w) -> int:
        k = 0
        try:
            for f in calls:
                f(w)
                k += 1
        except Exception as e:  # the machine names this instruction, not the block's first
            e.fused_pc = pcs[k]  # type: ignore[attr-defined]
            raise
        return nxt

    gangs = [prog.gang[pc] for pc in range(start, end)]
    gang = None if None in gangs else tuple(sorted(set().union(*gangs)))
    return Block(start, end - start, touch_v, touch_s, run, gang)


def fuse_blocks(prog) -> list[Block | None]:
    """Per instruction index, the block starting there (or None): from each plain instruction
    to the end of its run of plain instructions, at most ``MAX_BLOCK`` long."""
    n = len(prog.steps)
    out: list[Block | None] = [None] * n
    end = n
    run_end = [0] * n
    for pc in range(n - 1, -1, -1):
        if prog.plain[pc] is None:
            end = pc
        run_end[pc] = end
    for pc in range(n):
        if prog.plain[pc] is None or prog.plain[pc][0] is None:
            continue  # blocks start at a packed instruction
        out[pc] = _plan(prog, pc, min(run_end[pc], pc + MAX_BLOCK))
    return out
