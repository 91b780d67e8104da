"""Peer (all-reduce mailbox) buffers: one per TP rank, mapped into every rank through HIP IPC.

Uncached device memory: the kernels read their own mailbox with plain loads after an
invalidate, and ordinary coarse-grained memory would silently return stale data. The size is
rounded to whole 4 KiB pages, the buffer is zeroed before first use (the kernels derive the
launch number from its header) and the IPC handles travel over the TP group's CPU (gloo) group.
Construction is collective and all-or-nothing.
"""

from __future__ import annotations

import weakref
from typing import Any

from mono_aot.runtime.hip import Hip
from mono_aot.spec.errors import MonoUnsupported
from mono_aot.spec.util import align_up

PAGE_BYTES = 4096


def _release(hip: Hip, local: int, opened: list[int]) -> list[str]:
    """Close the mapped peers and free the local buffer; the failures, as text."""
    problems = []
    for p in opened:
        try:
            hip.ipc_close(p)
        except Exception as e:  # noqa: BLE001 - keep releasing the rest
            problems.append(str(e))
    if local:
        try:
            hip.free(local)
        except Exception as e:  # noqa: BLE001
            problems.append(str(e))
    opened.clear()
    return problems


def _gather(obj: Any, group: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def agree(ok: bool, reason: str, what: str, group: Any) -> None:
    """Every rank learns every rank's outcome; all raise the same error if any failed, naming
    each failing rank and its reason (a collective: every rank of ``group`` must call it)."""
    outcomes = _gather((ok, reason), group)
    failed = [(r, why) for r, (good, why) in enumerate(outcomes) if not good]
    if failed:
        detail = "; ".join(f"rank {r}: {why}" for r, why in failed)
        raise MonoUnsupported(f"{what} failed on {len(failed)} rank(s): {detail}")


class PeerBuffer:
    """``pe[r]`` is rank r's mailbox buffer as mapped here; ``pe[rank]`` is this rank's own."""

    def __init__(self, nbytes: int, group: Any, rank: int, world: int, hip: Hip) -> None:
        import torch

        if nbytes <= 0:
            raise ValueError(f"peer buffer size must be positive, got {nbytes}")
        self.hip = hip
        self.rank, self.world = rank, world
        self.nbytes = align_up(nbytes, PAGE_BYTES)
        self.local = 0
        self._opened: list[int] = []
        handle = b""
        reason = ""
        try:
            self.local = hip.malloc_uncached(self.nbytes)
            hip.memset(self.local, 0, self.nbytes)
            handle = hip.ipc_get_handle(self.local)
        except Exception as e:  # noqa: BLE001 - reported to every rank below
            reason = str(e) or type(e).__name__
        try:
            agree(not reason, reason, "peer buffers: allocation", group)
            handles = _gather(handle, group)
            pe, reason = [], ""
            try:
                for r, h in enumerate(handles):
                    if r == rank:
                        pe.append(self.local)
                    else:
                        p = hip.ipc_open(h, f"rank {r}'s peer buffer")
                        self._opened.append(p)
                        pe.append(p)
            except Exception as e:  # noqa: BLE001
                reason = str(e) or type(e).__name__
            agree(not reason, reason, "peer buffers: IPC mapping", group)
        except BaseException:
            _release(hip, self.local, self._opened)
            self.local = 0
            raise
        self.pe = pe
        self.addresses = torch.tensor(pe, dtype=torch.int64)
        # Released by close() or when garbage-collected, never at interpreter exit: HIP may
        # already be torn down then, and the process's exit frees device memory anyway.
        self._finalizer = weakref.finalize(self, _release, hip, self.local, self._opened)
        self._finalizer.atexit = False

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Unmap the peers and free this rank's buffer (exactly once; later calls do nothing)."""
        if self._finalizer.alive:
            problems = self._finalizer()
            if problems:
                raise MonoUnsupported("releasing the peer buffers: " + "; ".join(problems))
