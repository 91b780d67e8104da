"""The sync layer of the drafter kernels: bounded waits, failure recording, the grid barrier.

Every wait polls with a bound of ``wait_ticks`` on the 100 MHz ``s_memrealtime`` clock and also
watches the launch's abort word, so once one workgroup gives up every other wait of the launch
ends at its next poll. A wait that gives up records what it waited for in ``health`` (the
first failure wins, by a compare-and-swap on ``health[0]``) and returns a non-zero status; the
kernel carries that status and skips all later work (FlyDSL drops an early ``return`` under a
runtime condition, so there is none).

Grid barrier: every wave fences (agent-scope release) before the workgroup barrier, thread 0
reads the generation, arrives on the counter (agent-scope acq_rel atomic add) and either is the
last (resets the counter, then bumps the generation with a release) or polls the generation
(agent-scope acquire); after the second workgroup barrier every wave fences (agent-scope
acquire). The words live in the half of the scratch ``sync`` region that belongs to this
launch's parity; the other half is zeroed at launch start, so an aborted launch leaves nothing
that could confuse the next one.

The launch's identity comes from tickets (``launch_start``): every workgroup takes one from the
scratch's counter and one from the peer header's counter before anything else, so a workgroup
dispatched late, even after the launch already failed, still works in its own launch's half
(see ``mono_aot.spec.abi``, sync region and peer header).
"""

from __future__ import annotations

from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx

from mono_aot.kernels.common import AGENT, KernelCtx, gptr, now
from mono_aot.spec import abi

ST_ABORTED = 0x100  # local status: another workgroup failed first (not recorded in health)
_ACQ = fx.AtomicOrdering.Acquire
_REL = fx.AtomicOrdering.Release
_MONO = fx.AtomicOrdering.Monotonic


def _pending(v: Any, want: Any, until_equal: bool) -> Any:
    return (v != want) if until_equal else (v == want)


@flyc.jit
def record_health(k: KernelCtx, code: int, what: Any, detail: Any) -> None:
    """One thread: store a failure in ``health`` unless one is already there."""
    hp = gptr(fx.Int32, k.health, 4)
    _, won = fx.atomic_cas(hp, fx.Int32(abi.STATUS_OK), fx.Int32(code), syncscope=AGENT)
    if won:
        gptr(fx.Int32, k.health + abi.H_WHAT * 4).store(fx.Int32(what))
        gptr(fx.Int32, k.health + abi.H_PEER * 4).store(fx.Int32(detail))
        gptr(fx.Int32, k.health + abi.H_STEP * 4).store(fx.Int32(k.step_value))


@flyc.jit
def record_failure(k: KernelCtx, code: int, what: Any, detail: Any) -> None:
    """One thread: store the failure in ``health`` unless one is already there, and raise the
    launch's abort word so every other wait ends."""
    record_health(k, code, what, detail)
    fx.atomic_xchg(gptr(fx.Int32, k.sync + abi.SYNC_ABORT), fx.Int32(1), syncscope=AGENT)


def n_valid(k: KernelCtx, n: Any) -> Any:
    """``0 < n <= the variant's tokens`` and ``n % qpr == 0`` (an Int32 kernel argument)."""
    qpr = k.lay.serving.qpr
    return (n > 0) & (n <= k.n_max) & (n % qpr == 0)


def _parity(ticket: Any, ctas: int) -> Any:
    """Parity of the launch a 64-bit ticket belongs to (``abi.launch_id(ticket, ctas) & 1``)."""
    return fx.Int32((ticket // ctas) & 1)


@flyc.jit
def launch_start(k: KernelCtx, n_ok: Any) -> Any:
    """The launch's identity, before the workgroup writes anything: thread 0 takes a ticket
    from the scratch's counter (-> ``par``, the sync half and norm sums) and one from the peer
    header's counter (-> the header slot holding the previous launch's step and number in
    it: ``seq``); workgroup 0 writes the next launch's slot. With a bad ``n`` nothing is taken
    or written: workgroup 0 records ``STATUS_BAD_N`` in ``health`` (no abort word: every
    workgroup sees the same n). Returns ``(par, seq)`` in every thread."""
    if k.tid == 0:
        par = fx.Int32(0)
        seq = fx.Int32(0)
        if n_ok:
            one = fx.Int64(1)
            t = fx.atomic_add(gptr(fx.Int64, k.scr("sync", abi.SYNC_TICKET)), one, syncscope=AGENT)
            hdr = k.peer_addr(k.peer_local, "hdr")
            tp = fx.atomic_add(gptr(fx.Int64, hdr + abi.HDR_TICKET), one, syncscope=AGENT)
            par = _parity(t, k.nwg)
            hp = _parity(tp, k.nwg)
            mine = hdr + abi.HDR_SLOTS + fx.Int64(hp) * 8
            h_step = gptr(fx.Int32, mine).load()
            h_seq = gptr(fx.Int32, mine + 4).load()
            seq = (h_step == k.step_value).select(h_seq + 1, fx.Int32(0))
            if k.bid == 0:
                nxt = hdr + abi.HDR_SLOTS + fx.Int64(1 - hp) * 8
                gptr(fx.Int32, nxt).store(k.step_value)
                gptr(fx.Int32, nxt + 4).store(seq)
        else:
            if k.bid == 0:
                record_health(k, abi.STATUS_BAD_N, abi.PH_LAUNCH, k.n)
        k.sync_lds[0] = par
        k.sync_lds[1] = seq
    fx.gpu.barrier()
    out_par = k.sync_lds[0]
    out_seq = k.sync_lds[1]
    fx.gpu.barrier()
    return out_par, out_seq


@flyc.jit
def wait_word(
    k: KernelCtx,
    addr: Any,
    want: Any,
    until_equal: bool,
    system: bool,
    code: int,
    what: Any,
    detail: Any,
) -> Any:
    """One thread: poll the int32 at ``addr`` until it equals ``want`` (``until_equal``) or
    differs from it, with relaxed atomic loads of system (a peer's memory: they bypass the
    caches) or agent scope; the caller fences (acquire) once the wait is over. Bounded by
    ``k.wait_ticks``; returns 0, ``code`` (recorded) or ``ST_ABORTED``."""
    scope = None if system else AGENT
    p = gptr(fx.Int32, addr)
    ab = gptr(fx.Int32, k.sync + abi.SYNC_ABORT)
    t0 = now()
    v = fx.generic_load(p, memory_order=_MONO, syncscope=scope)
    a = fx.generic_load(ab, memory_order=_MONO, syncscope=AGENT)
    el = fx.Int64(0)
    pending = _pending(v, want, until_equal)
    while pending & (a == 0) & (el < k.wait_ticks):
        fx.rocdl.s_sleep(1)
        v = fx.generic_load(p, memory_order=_MONO, syncscope=scope)
        a = fx.generic_load(ab, memory_order=_MONO, syncscope=AGENT)
        el = now() - t0
        pending = _pending(v, want, until_equal)
    st = fx.Int32(0)
    if pending:
        st = fx.Int32(ST_ABORTED)
        if a == 0:
            record_failure(k, code, what, detail)
            st = fx.Int32(code)
    return st


@flyc.jit
def broadcast(k: KernelCtx, value: Any) -> Any:
    """Thread 0's Int32 ``value`` to every thread of the workgroup (two workgroup barriers)."""
    slot = k.sync_lds
    fx.gpu.barrier()
    if k.tid == 0:
        slot[0] = fx.Int32(value)
    fx.gpu.barrier()
    out = slot[0]
    fx.gpu.barrier()
    return out


@flyc.jit
def grid_barrier(k: KernelCtx, st: Any, what: Any) -> Any:
    """All workgroups meet; returns the (possibly new) status. Skipped (no wait) once ``st`` is
    non-zero: a failed launch only finishes."""
    fx.memory_fence(syncscope=AGENT, ordering=_REL)  # every wave: its writes before the arrival
    fx.gpu.barrier()
    if k.tid == 0:
        s2 = fx.Int32(st)
        if st == 0:
            cnt = gptr(fx.Int32, k.sync + abi.SYNC_COUNT)
            gen = gptr(fx.Int32, k.sync + abi.SYNC_GEN)
            g = fx.generic_load(gen, memory_order=_MONO, syncscope=AGENT)
            old = fx.atomic_add(
                cnt, fx.Int32(1), syncscope=AGENT, ordering=fx.AtomicOrdering.AcqRel
            )
            if old == k.nwg - 1:
                fx.generic_store(cnt, fx.Int32(0), memory_order=_MONO, syncscope=AGENT)
                fx.atomic_add(gen, fx.Int32(1), syncscope=AGENT, ordering=_REL)
            else:
                s2 = wait_word(
                    k, k.sync + abi.SYNC_GEN, g, False, False, abi.STATUS_BARRIER_TIMEOUT, what, g
                )
            fx.memory_fence(syncscope=AGENT, ordering=_ACQ)
        k.sync_lds[0] = s2
    fx.gpu.barrier()
    out = k.sync_lds[0]
    fx.gpu.barrier()
    fx.memory_fence(syncscope=AGENT, ordering=_ACQ)  # every wave: see the others' writes
    return out
