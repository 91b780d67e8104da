"""PeerBuffer: 4 real rank processes exchanging IPC handles over gloo, with the stand-in HIP."""

from __future__ import annotations

import ctypes

import pytest

from tests.runtime.conftest import Calls, stand_in_env
from tests.runtime.ranks import WORLD, run_ranks

NBYTES = 10_000  # not a whole number of pages

pytestmark = pytest.mark.slow  # real process clusters or compiles


def _exchange(rank, world, group, arg):
    import torch.distributed as dist

    from mono_aot.runtime.hip import hip_library
    from mono_aot.runtime.peer import PeerBuffer

    peers = PeerBuffer(NBYTES, group, rank, world, hip_library())
    zeroed = ctypes.string_at(peers.local, peers.nbytes) == bytes(peers.nbytes)
    ctypes.memset(peers.local, rank + 1, 64)  # write this rank's own buffer
    dist.barrier(group=group)
    seen = [ctypes.string_at(p, 1)[0] for p in peers.pe]  # read every rank's, as mapped here
    dist.barrier(group=group)
    own = peers.pe[rank] == peers.local
    peers.close()
    peers.close()
    return {
        "zeroed": zeroed,
        "seen": seen,
        "own": own,
        "nbytes": peers.nbytes,
        "closed": peers.closed,
    }


def test_handshake_maps_every_rank_uncached_page_rounded_zeroed(stand_in_lib, tmp_path):
    logs = [tmp_path / f"calls-{r}.jsonl" for r in range(WORLD)]
    envs = [stand_in_env(stand_in_lib, logs[r]) for r in range(WORLD)]
    res = run_ranks(_exchange, tmp_path, envs)
    assert all(ok for ok, _ in res), res
    for r, (_, out) in enumerate(res):
        assert out == {
            "zeroed": True,
            "seen": [1, 2, 3, 4],
            "own": True,
            "nbytes": 12288,
            "closed": True,
        }
        calls = Calls(logs[r])
        (alloc,) = calls.of("hipExtMallocWithFlags")
        assert alloc["flags"] == 0x3 and alloc["size"] == 12288  # hipDeviceMallocUncached, 3 pages
        (zero,) = calls.of("hipMemset")
        assert (zero["ptr"], zero["value"], zero["size"]) == (alloc["ptr"], 0, 12288)
        opens = calls.of("hipIpcOpenMemHandle")
        assert len(opens) == WORLD - 1 and all(o["flags"] == 1 for o in opens)  # lazy peer access
        assert len(calls.of("hipIpcCloseMemHandle")) == WORLD - 1
        assert [f["ptr"] for f in calls.of("hipFree")] == [alloc["ptr"]]  # exactly once


def _build(rank, world, group, arg):
    from mono_aot.runtime.hip import hip_library
    from mono_aot.runtime.peer import PeerBuffer

    PeerBuffer(NBYTES, group, rank, world, hip_library())
    return "built"


@pytest.mark.parametrize(
    ("fail", "failing_rank", "what", "error"),
    [
        ("hipExtMallocWithFlags", 2, "allocation", "hipErrorOutOfMemory"),
        ("hipIpcOpenMemHandle", 1, "IPC mapping", "hipErrorInvalidHandle"),
    ],
)
def test_one_failing_rank_makes_every_rank_raise(
    stand_in_lib, tmp_path, fail, failing_rank, what, error
):
    logs = [tmp_path / f"calls-{r}.jsonl" for r in range(WORLD)]
    envs = [stand_in_env(stand_in_lib, logs[r]) for r in range(WORLD)]
    envs[failing_rank]["MONO_AOT_STANDIN_FAIL"] = fail
    res = run_ranks(_build, tmp_path, envs)
    for ok, msg in res:
        assert not ok
        assert msg.startswith("MonoUnsupported: peer buffers: ")
        assert f"{what} failed on 1 rank(s): rank {failing_rank}: {fail}" in msg and error in msg
    for r in range(WORLD):
        calls = Calls(logs[r])
        allocs = calls.of("hipExtMallocWithFlags")
        freed = calls.of("hipFree")
        if allocs and "ptr" in allocs[0]:
            assert [f["ptr"] for f in freed] == [allocs[0]["ptr"]], f"rank {r} leaked its buffer"
        opened = [o["ptr"] for o in calls.of("hipIpcOpenMemHandle") if "ptr" in o]
        assert sorted(c["ptr"] for c in calls.of("hipIpcCloseMemHandle")) == sorted(opened)
