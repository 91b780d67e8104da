"""A cluster of rank processes: one spawned process per rank, joined by a gloo group, each
running the functions the parent sends it, with timeouts, failure reports and clean shutdown.

The selftest runs its TP ranks here (one GPU each); the benchmark and the runtime's 4-rank
tests use the same harness. Standard library only at import time: a rank imports torch (for
its gloo group) inside its own process.

- ``Cluster(world, envs=...)`` starts ``world`` processes (``spawn``: no state inherited from
  the parent but what is sent), applies each rank's environment before anything is imported,
  and, with ``gloo=True``, has them join a ``torch.distributed`` gloo group over a
  ``FileStore`` in the cluster's work directory.
- ``run(fn, args, timeout)`` calls ``fn(ctx, arg)`` on every rank (``ctx``: ``RankContext``,
  which keeps a per-rank ``state`` dict between calls) and returns the values by rank. A rank
  that raises, dies or does not answer within ``timeout`` seconds makes ``run`` raise
  ``RankFailed`` (with that rank's traceback, exit status, or the ranks still silent) after
  every rank process has been killed: a rank that failed mid-collective can leave its peers
  waiting forever, so a cluster is not reused after a failure.
- ``run_outcomes`` returns every rank's ``Outcome`` instead of raising on a rank's error
  (ranks that died or hung are still fatal).
- ``close()`` asks every rank to leave and kills whoever has not within a grace period; the
  work directory it created is removed. No process outlives the ``with`` block.

Messages are pickled with the standard pickler (a tensor travels as a copy of its bytes, never
through shared memory or a passed file descriptor). Functions travel by reference, so ``fn``
must be importable (defined at a module's top level).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from mono_aot.spec.errors import MonoError

START_TIMEOUT_S = 120.0  # spawn, imports and the gloo rendezvous
COLLECTIVE_TIMEOUT_S = 600.0  # a gloo collective waiting for a rank
LEAVE_GRACE_S = 30.0  # close(): how long a rank may take to leave before it is killed


class ClusterError(MonoError):
    """The cluster could not run a call to completion."""


class RankFailed(ClusterError):
    """A rank raised, died or did not answer in time; ``rank`` is the first one (or None)."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        self.rank = rank
        super().__init__(message)


@dataclass
class RankContext:
    """What a function running on a rank gets: its rank, the world, the gloo group (None
    without ``gloo``), a per-rank dict kept between calls, and the cluster's work directory."""

    rank: int
    world: int
    group: Any
    workdir: Path
    state: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """One rank's answer to a call: its value, or the error text (type, message, traceback)."""

    rank: int
    ok: bool
    value: Any = None
    error: str = ""


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}\n{traceback.format_exc()}"


def _send(conn: Connection, obj: Any) -> None:
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - an unpicklable answer is the rank's failure
        data = pickle.dumps(("error", f"the answer cannot be pickled: {_describe(e)}"))
    conn.send_bytes(data)


def _rank_main(
    conn: Connection,
    rank: int,
    world: int,
    env: Mapping[str, str],
    workdir: str,
    gloo_store: str | None,
    collective_timeout_s: float,
) -> None:
    """A rank process: join the group, then answer calls until told to leave."""
    os.environ.update(env)
    group = None
    dist = None
    try:
        if gloo_store is not None:
            from datetime import timedelta

            import torch.distributed as dist

            dist.init_process_group(
                "gloo",
                store=dist.FileStore(gloo_store, world),
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=collective_timeout_s),
            )
            group = dist.group.WORLD
        ctx = RankContext(rank, world, group, Path(workdir))
        _send(conn, ("ready", None))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        _send(conn, ("error", _describe(e)))
        return
    try:
        while True:
            try:
                msg = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                return
            if msg[0] == "leave":
                return
            _, fn, arg = msg
            try:
                value = fn(ctx, arg)
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                _send(conn, ("error", _describe(e)))
            else:
                _send(conn, ("ok", value))
    finally:
        if dist is not None and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001, S110 - leaving anyway
                pass


def _exit_status(p: mp.process.BaseProcess) -> str:
    code = p.exitcode
    if code is None:
        return "still running"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Cluster:
    """``world`` rank processes; see the module doc."""

    def __init__(
        self,
        world: int,
        *,
        envs: Sequence[Mapping[str, str]] | None = None,
        gloo: bool = True,
        workdir: Path | None = None,
        start_timeout: float = START_TIMEOUT_S,
        collective_timeout: float = COLLECTIVE_TIMEOUT_S,
    ) -> None:
        if world < 1:
            raise ValueError(f"a cluster needs at least one rank, got {world}")
        if envs is not None and len(envs) != world:
            raise ValueError(f"{len(envs)} environments for {world} ranks")
        self.world = world
        self._own_dir = workdir is None
        self.workdir = (
            Path(tempfile.mkdtemp(prefix="mono-aot-ranks-")) if workdir is None else workdir
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        store = None
        if gloo:
            fd, store = tempfile.mkstemp(prefix="gloo-", dir=self.workdir)
            os.close(fd)
            os.unlink(store)  # the FileStore creates it
        ctx = mp.get_context("spawn")
        self.procs: list[mp.process.BaseProcess] = []
        self.conns: list[Connection] = []
        self.closed = False
        try:
            for r in range(world):
                parent, child = ctx.Pipe()
                env = dict(envs[r]) if envs is not None else {}
                p = ctx.Process(
                    target=_rank_main,
                    args=(child, r, world, env, str(self.workdir), store, collective_timeout),
                    daemon=True,
                    name=f"mono-aot-rank-{r}",
                )
                p.start()
                child.close()
                self.procs.append(p)
                self.conns.append(parent)
            self._collect(list(range(world)), start_timeout, "start", fatal_errors=True)
        except BaseException:
            self.close(kill=True)
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(kill=exc[0] is not None)

    def _fail(self, message: str, rank: int | None) -> RankFailed:
        self.close(kill=True)
        return RankFailed(message, rank)

    def _collect(
        self, ranks: list[int], timeout: float, what: str, fatal_errors: bool
    ) -> dict[int, Outcome]:
        """Every rank's next message; a rank that dies or stays silent is fatal."""
        out: dict[int, Outcome] = {}
        deadline = time.monotonic() + timeout
        pending = set(ranks)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                silent = sorted(pending)
                raise self._fail(
                    f"rank(s) {', '.join(map(str, silent))} did not answer {what} within "
                    f"{timeout:g} s (hung?); every rank process was killed",
                    silent[0],
                )
            by_conn = {self.conns[r]: r for r in pending}
            by_sentinel = {self.procs[r].sentinel: r for r in pending}
            for obj in wait([*by_conn, *by_sentinel], timeout=left):
                r = by_conn.get(obj)  # type: ignore[call-overload]
                if r is None:
                    r = by_sentinel[obj]  # type: ignore[index]
                    if r not in pending or self.conns[r].poll():
                        continue  # it answered before exiting: read below
                    self.procs[r].join(timeout=5)
                    raise self._fail(
                        f"rank {r} died during {what} ({_exit_status(self.procs[r])})", r
                    )
                if r not in pending:
                    continue
                try:
                    kind, value = pickle.loads(self.conns[r].recv_bytes())
                except (EOFError, OSError):
                    self.procs[r].join(timeout=5)
                    raise self._fail(
                        f"rank {r} died during {what} ({_exit_status(self.procs[r])})", r
                    ) from None
                pending.discard(r)
                if kind == "error":
                    if fatal_errors:
                        raise self._fail(f"rank {r} failed during {what}:\n{value}", r)
                    out[r] = Outcome(r, False, error=value)
                else:
                    out[r] = Outcome(r, True, value=value)
        return out

    def _dispatch(
        self,
        fn: Callable[[RankContext, Any], Any],
        args: Sequence[Any] | None,
        ranks: Sequence[int] | None,
    ) -> list[int]:
        if self.closed:
            raise ClusterError("the cluster is closed")
        chosen = list(range(self.world)) if ranks is None else list(ranks)
        if args is not None and len(args) != len(chosen):
            raise ValueError(f"{len(args)} arguments for {len(chosen)} ranks")
        for i, r in enumerate(chosen):
            arg = None if args is None else args[i]
            try:
                self.conns[r].send_bytes(pickle.dumps(("call", fn, arg), pickle.HIGHEST_PROTOCOL))
            except (OSError, BrokenPipeError):
                raise self._fail(
                    f"rank {r} is gone ({_exit_status(self.procs[r])}); cannot send a call", r
                ) from None
        return chosen

    def run_outcomes(
        self,
        fn: Callable[[RankContext, Any], Any],
        args: Sequence[Any] | None = None,
        *,
        timeout: float,
        ranks: Sequence[int] | None = None,
    ) -> list[Outcome]:
        """``fn(ctx, args[i])`` on each chosen rank (all by default); every rank's outcome."""
        chosen = self._dispatch(fn, args, ranks)
        got = self._collect(chosen, timeout, f"{getattr(fn, '__name__', fn)}", fatal_errors=False)
        return [got[r] for r in chosen]

    def run(
        self,
        fn: Callable[[RankContext, Any], Any],
        args: Sequence[Any] | None = None,
        *,
        timeout: float,
        ranks: Sequence[int] | None = None,
    ) -> list[Any]:
        """Like ``run_outcomes``, but any rank's error is fatal: ``RankFailed`` with its text."""
        chosen = self._dispatch(fn, args, ranks)
        got = self._collect(chosen, timeout, f"{getattr(fn, '__name__', fn)}", fatal_errors=True)
        return [got[r].value for r in chosen]

    def close(self, kill: bool = False) -> None:
        """Ask each rank to leave (or kill it at once with ``kill``); nothing is left running."""
        if self.closed:
            return
        self.closed = True
        if not kill:
            for c, p in zip(self.conns, self.procs, strict=True):
                if p.is_alive():
                    try:
                        c.send_bytes(pickle.dumps(("leave",)))
                    except OSError:
                        pass
            deadline = time.monotonic() + LEAVE_GRACE_S
            for p in self.procs:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=30)
        for c in self.conns:
            c.close()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
