"""The rank-cluster harness: calls, state, environments, the gloo group, and every way a rank
can fail (raise, die, hang), each reported and leaving no process behind."""

from __future__ import annotations

import os
import time

import pytest

from mono_aot.selftest.cluster import Cluster, ClusterError, RankFailed

pytestmark = pytest.mark.slow  # real process clusters or compiles


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def whoami(ctx, arg):
    ctx.state["calls"] = ctx.state.get("calls", 0) + 1
    return {
        "rank": ctx.rank,
        "world": ctx.world,
        "arg": arg,
        "calls": ctx.state["calls"],
        "env": os.environ.get("MONO_AOT_TEST_RANK_ENV"),
        "pid": os.getpid(),
    }


def gloo_sum(ctx, arg):
    import torch
    import torch.distributed as dist

    t = torch.tensor([ctx.rank + 1])
    dist.all_reduce(t, group=ctx.group)
    return int(t)


def crash_on_one(ctx, arg):
    if ctx.rank == arg:
        raise ValueError(f"rank {ctx.rank} trips on purpose")
    return ctx.rank


def hang_on_one(ctx, arg):
    if ctx.rank == arg:
        time.sleep(3600)
    return ctx.rank


def die_on_one(ctx, arg):
    if ctx.rank == arg:
        os._exit(7)
    return ctx.rank


def unpicklable(ctx, arg):
    return lambda: None


def test_calls_state_and_environments():
    envs = [{"MONO_AOT_TEST_RANK_ENV": f"e{r}"} for r in range(2)]
    with Cluster(2, envs=envs, gloo=False) as c:
        first = c.run(whoami, ["a", "b"], timeout=60)
        again = c.run(whoami, timeout=60)
        only = c.run(whoami, ["x"], ranks=[1], timeout=60)
        pids = c.pids
    assert [(x["rank"], x["world"], x["arg"], x["env"]) for x in first] == [
        (0, 2, "a", "e0"),
        (1, 2, "b", "e1"),
    ]
    assert [x["calls"] for x in again] == [2, 2] and [x["arg"] for x in again] == [None, None]
    assert only[0]["rank"] == 1 and only[0]["calls"] == 3
    assert len({x["pid"] for x in first} | {os.getpid()}) == 3  # separate processes
    assert _gone(pids)


def test_gloo_group_joins_every_rank(tmp_path):
    with Cluster(4, workdir=tmp_path / "w") as c:
        assert c.run(gloo_sum, timeout=120) == [10, 10, 10, 10]
        pids = c.pids
    assert _gone(pids)


def test_a_crashing_rank_is_reported_with_its_traceback_and_the_cluster_killed():
    c = Cluster(3, gloo=False)
    pids = c.pids
    with pytest.raises(RankFailed) as e:
        c.run(crash_on_one, [1, 1, 1], timeout=60)
    msg = str(e.value)
    assert e.value.rank == 1
    assert "rank 1 failed during crash_on_one" in msg
    assert "ValueError: rank 1 trips on purpose" in msg
    assert "Traceback" in msg and "in crash_on_one" in msg
    assert c.closed and _gone(pids)
    with pytest.raises(ClusterError, match="closed"):
        c.run(whoami, timeout=10)


def test_outcomes_keep_each_ranks_error_and_the_others_values():
    with Cluster(3, gloo=False) as c:
        out = c.run_outcomes(crash_on_one, [2, 2, 2], timeout=60)
        assert [o.ok for o in out] == [True, True, False]
        assert [o.value for o in out[:2]] == [0, 1]
        assert out[2].error.startswith("ValueError: rank 2 trips on purpose")
        assert c.run(whoami, timeout=60)[2]["rank"] == 2  # still usable: nobody hung or died


def test_a_hung_rank_is_killed_after_the_timeout():
    c = Cluster(2, gloo=False)
    pids = c.pids
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match=r"rank\(s\) 0 did not answer hang_on_one within 2 s") as e:
        c.run(hang_on_one, [0, 0], timeout=2)
    assert e.value.rank == 0
    assert time.monotonic() - t0 < 30
    assert _gone(pids)


def test_a_dying_rank_is_reported_with_its_exit_status():
    c = Cluster(2, gloo=False)
    pids = c.pids
    with pytest.raises(RankFailed, match="rank 1 died during die_on_one .exit code 7."):
        c.run(die_on_one, [1, 1], timeout=60)
    assert _gone(pids)


def test_an_unpicklable_answer_is_the_ranks_error():
    with Cluster(1, gloo=False) as c:
        (o,) = c.run_outcomes(unpicklable, timeout=60)
    assert not o.ok and "the answer cannot be pickled" in o.error


def test_close_leaves_no_process_and_removes_its_directory():
    c = Cluster(2, gloo=False)
    pids, workdir = c.pids, c.workdir
    assert workdir.is_dir() and all(_alive(p) for p in pids)
    c.close()
    c.close()  # idempotent
    assert _gone(pids) and not workdir.exists()


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one rank"):
        Cluster(0, gloo=False)
    with pytest.raises(ValueError, match="1 environments for 2 ranks"):
        Cluster(2, envs=[{}], gloo=False)
