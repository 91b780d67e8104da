"""Run a function in spawned rank processes (4 unless told) joined by a gloo group over a
FileStore."""

from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

WORLD = 4


def _main(
    fn: Callable[..., Any], rank: int, world: int, store: str, env: dict[str, str], q: Any, arg: Any
) -> None:
    os.environ.update(env)
    try:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            store=dist.FileStore(store, world),
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=60),
        )
        try:
            q.put((rank, True, fn(rank, world, dist.group.WORLD, arg)))
        finally:
            dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        q.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"))


def run_ranks(
    fn: Callable[..., Any],
    tmp: Path,
    envs: list[dict[str, str]],
    arg: Any = None,
    timeout: float = 240.0,
) -> list[tuple[bool, Any]]:
    """``fn(rank, world, group, arg)`` on each rank (one per ``envs`` entry); ``[(ok, result
    or error text)]`` by rank."""
    world = len(envs)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    store = str(tmp / "gloo-filestore")
    procs = [
        ctx.Process(target=_main, args=(fn, r, world, store, envs[r], q, arg), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    out: dict[int, tuple[bool, Any]] = {}
    try:
        for _ in range(world):
            rank, ok, res = q.get(timeout=timeout)
            out[rank] = (ok, res)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    return [out[r] for r in range(world)]
