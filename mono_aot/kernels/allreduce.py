"""The epoch-tagged all-reduce of the row-parallel partials (after o and after down).

Workgroup c of every rank owns the same hidden rows (the balanced split). After its GEMV it
holds its rows of this rank's partial for every token in an LDS tile; ``push`` writes that tile
as bf16 into every rank's mailbox (block ``[this rank][c]`` of the region for this all-reduce
kind and layer parity, 16-byte stores), fences at system scope, and then stores the epoch tag
into the destination's flag word ``[c][this rank]`` with a system-scope atomic exchange.
``receive`` (the same workgroup, no grid barrier in between) polls its own buffer's four flags
with system-scope acquire loads, bounded by the wait ticks, then sums the four blocks in rank
order (the same bits on every rank) into the residual and prepares the next norm.

The tag is ``epoch * 2L + 2 * layer + kind + 1`` with ``epoch = step * EPOCH_SEQS + seq``:
``step`` is the device step counter and ``seq`` the launch's number within the step (kept in
the peer buffer's header), so tags never repeat across launches or graph replays and no host
reset is needed; a rank that missed a step falls back in line at the next one. Layer parity
double-buffers the regions: a rank writes a region again only after every peer has pushed the
following all-reduce, which each peer does only after it finished reading this region.
"""

from __future__ import annotations

from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import range_constexpr

from mono_aot.kernels.common import KernelCtx, bf16_hi, bf16_lo, bf16_pack, gptr
from mono_aot.kernels.pointwise import absorb, hidden_split
from mono_aot.kernels.sync import wait_word
from mono_aot.spec import abi

KINDS = {"attn": 0, "mlp": 1}


def tag(k: KernelCtx, layer: Any, kind: int) -> Any:
    """Int32 epoch tag of one all-reduce (wraps modulo 2^32; never 0 in practice)."""
    return k.epoch * (2 * k.lay.model.layers) + fx.Int32(layer) * 2 + (kind + 1)


def _region(k: KernelCtx, base: Any, prefix: str, kind: int, parity: Any) -> Any:
    name = abi.AR_KINDS[kind]
    o0 = k.peer.offset(f"{prefix}_{name}0")
    o1 = k.peer.offset(f"{prefix}_{name}1")
    return base + fx.Int64(o0) + fx.Int64(parity) * (o1 - o0)


def _block_bytes(k: KernelCtx) -> int:
    return abi.mbox_tokens(k.lay) * abi.mbox_rows(k.lay) * 2


def _ctas_cap(k: KernelCtx) -> int:
    return max(t.ctas for t in k.lay.targets.values())


def _pick(values: list[Any], idx: Any) -> Any:
    out = values[0]
    for j in range(1, len(values)):
        out = (idx == j).select(values[j], out)
    return out


@flyc.jit
def push(k: KernelCtx, n: Any, tile: Any, layer: Any, kind: int) -> None:
    """Send the workgroup's LDS tile (f32 ``[n_max][stride]``) to every rank's mailbox."""
    tp = k.lay.parallel.tp
    RS = hidden_split(k).stride
    VPT = RS // 8  # 16-byte vectors per token
    parity = fx.Int32(layer) % 2
    tg = tag(k, layer, kind)
    blk = (fx.Int64(k.rank) * _ctas_cap(k) + fx.Int64(k.bid)) * _block_bytes(k)
    per_dest = n * VPT
    tile4 = fx.recast_iter(fx.Pointer[fx.Float32, fx.AddressSpace.Shared, 16].ir_type, tile)
    idx = k.tid
    while idx < per_dest * tp:
        d = idx // per_dest
        v = idx % per_dest
        e0 = (v // VPT) * RS + (v % VPT) * 8
        a = fx.generic_load(tile4 + e0, count=4)
        b = fx.generic_load(tile4 + (e0 + 4), count=4)
        words = [
            bf16_pack(a[0], a[1]),
            bf16_pack(a[2], a[3]),
            bf16_pack(b[0], b[1]),
            bf16_pack(b[2], b[3]),
        ]
        dst = _region(k, _pick(k.pe, d), "mbox", kind, parity) + blk + fx.Int64(v) * 16
        fx.generic_store(gptr(fx.Int32, dst, 16), fx.Vector.from_elements(words, fx.Int32))
        idx = idx + k.threads
    fx.memory_fence(syncscope=None, ordering=fx.AtomicOrdering.Release)  # every wave, system scope
    fx.gpu.barrier()
    if k.tid < tp:
        flag = (
            _region(k, _pick(k.pe, k.tid), "flags", kind, parity)
            + (fx.Int64(k.bid) * tp + fx.Int64(k.rank)) * 4
        )
        fx.atomic_xchg(gptr(fx.Int32, flag), tg, syncscope=None, ordering=fx.AtomicOrdering.Release)


@flyc.jit
def receive(
    k: KernelCtx,
    n: Any,
    layer: Any,
    kind: int,
    phase: int,
    w_norm: Any,
    slot: Any,
    sq: Any,
    st: Any,
) -> Any:
    """Wait for every rank's block of this workgroup's rows, then ``x += sum`` (rank order),
    ``h = bf16(x * (1 + w_norm))`` and the norm sum ``slot``. Returns the status."""
    tp = k.lay.parallel.tp
    parity = fx.Int32(layer) % 2
    tg = tag(k, layer, kind)
    flags = _region(k, k.peer_local, "flags", kind, parity) + fx.Int64(k.bid) * (tp * 4)
    what = fx.Int32(layer) * 16 + phase
    if k.tid == 0:
        s2 = fx.Int32(st)
        for src in range_constexpr(tp):
            if s2 == 0:
                s2 = wait_word(
                    k, flags + src * 4, tg, True, True, abi.STATUS_PEER_TIMEOUT, what, fx.Int32(src)
                )
        fx.memory_fence(syncscope=None, ordering=fx.AtomicOrdering.Acquire)
        k.sync_lds[0] = s2
    fx.gpu.barrier()
    out = k.sync_lds[0]
    fx.gpu.barrier()
    fx.memory_fence(syncscope=None, ordering=fx.AtomicOrdering.Acquire)  # every wave, system scope
    if out == 0:
        RS = hidden_split(k).stride
        base = _region(k, k.peer_local, "mbox", kind, parity) + fx.Int64(k.bid) * _block_bytes(k)
        src_step = _ctas_cap(k) * _block_bytes(k)

        def add_fn(t: Any, i0: Any) -> list[Any]:
            # one 16-byte load per source rank: 8 bf16 of token t, rows i0..i0+7
            e = fx.Int64(t * RS + i0) * 2
            vecs = [
                fx.generic_load(gptr(fx.Int32, base + src * src_step + e, 16), count=4)
                for src in range(tp)
            ]
            out = []
            for w in range_constexpr(4):
                lo = bf16_lo(vecs[0][w])
                hi = bf16_hi(vecs[0][w])
                for src in range_constexpr(1, tp):  # rank order: the same sum on every rank
                    lo = lo + bf16_lo(vecs[src][w])
                    hi = hi + bf16_hi(vecs[src][w])
                out += [lo, hi]
            return out

        absorb(k, n, add_fn, False, w_norm, slot, sq)
    return out
