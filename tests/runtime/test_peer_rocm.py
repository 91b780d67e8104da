"""PeerBuffer over real HIP IPC across 4 GPUs (marked ``rocm``: skipped without a ROCm device):
4 rank processes, one GPU each, exchange handles over gloo; every rank writes its own pattern
into a slot of every rank's buffer through the mapped pointers, then reads its own buffer and
finds every rank's pattern. The stand-in counterpart is ``test_peer.py``."""

from __future__ import annotations

import ctypes

import pytest
import torch

from tests.runtime.ranks import WORLD, run_ranks

pytestmark = pytest.mark.rocm

NBYTES = 10_000  # not a whole number of pages
SLOT = 256
HIP_MEMCPY_DEFAULT = 4  # hipMemcpyDefault: direction from the unified address space


def _ipc(rank, world, group, arg):
    import torch
    import torch.distributed as dist

    from mono_aot.runtime.device import TorchHipDevice
    from mono_aot.runtime.peer import PeerBuffer

    torch.cuda.set_device(rank)
    hip = TorchHipDevice().hip
    memcpy = hip.lib.hipMemcpy
    memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    memcpy.restype = ctypes.c_int

    def read(ptr, n):
        buf = ctypes.create_string_buffer(n)
        assert memcpy(buf, ptr, n, HIP_MEMCPY_DEFAULT) == 0
        return buf.raw

    peers = PeerBuffer(NBYTES, group, rank, world, hip)
    zeroed = read(peers.local, peers.nbytes) == bytes(peers.nbytes)
    dist.barrier(group=group)  # nobody writes before everyone checked its zeroes
    pattern = ctypes.create_string_buffer(bytes([rank + 1]) * SLOT, SLOT)
    for p in peers.pe:
        assert memcpy(p + rank * SLOT, pattern, SLOT, HIP_MEMCPY_DEFAULT) == 0
    torch.cuda.synchronize()
    dist.barrier(group=group)
    own = read(peers.local, world * SLOT)
    info = {
        "zeroed": zeroed,
        "own": own,
        "local_is_mine": peers.pe[rank] == peers.local,
        "distinct": len(set(peers.pe)) == world,
        "device": hip.pointer_device(peers.local),
        "nbytes": peers.nbytes,
    }
    dist.barrier(group=group)  # nobody unmaps while a peer may still write
    peers.close()
    info["closed"] = peers.closed
    return info


def test_every_rank_writes_into_every_peer_and_reads_its_own(tmp_path):
    if torch.cuda.device_count() < WORLD:
        pytest.skip(f"needs {WORLD} GPUs, found {torch.cuda.device_count()}")
    res = run_ranks(_ipc, tmp_path, [{} for _ in range(WORLD)])
    assert all(ok for ok, _ in res), res
    want = b"".join(bytes([r + 1]) * SLOT for r in range(WORLD))
    for rank, (_, info) in enumerate(res):
        assert info["zeroed"] and info["local_is_mine"] and info["distinct"] and info["closed"]
        assert info["own"] == want, f"rank {rank} did not see every rank's write"
        assert info["device"] == rank and info["nbytes"] == 12288
