"""Run a function in rank processes (one per ``envs`` entry) joined by a gloo group: the
selftest's rank harness (``mono_aot.selftest.cluster``) with the ``fn(rank, world, group, arg)``
calling convention of the runtime and vLLM tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mono_aot.selftest.cluster import Cluster, RankContext

WORLD = 4


def _call(ctx: RankContext, payload: tuple[Callable[..., Any], Any]) -> Any:
    fn, arg = payload
    return fn(ctx.rank, ctx.world, ctx.group, arg)


def run_ranks(
    fn: Callable[..., Any],
    tmp: Path,
    envs: list[dict[str, str]],
    arg: Any = None,
    timeout: float = 240.0,
) -> list[tuple[bool, Any]]:
    """``fn(rank, world, group, arg)`` on each rank; ``[(ok, result or error text)]`` by rank
    (the error text: ``Type: message`` and the rank's traceback)."""
    world = len(envs)
    with Cluster(world, envs=envs, workdir=tmp / "ranks") as cluster:
        outcomes = cluster.run_outcomes(_call, [(fn, arg)] * world, timeout=timeout)
    return [(o.ok, o.value if o.ok else o.error) for o in outcomes]
