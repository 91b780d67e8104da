"""Per-key build locks and the store-wide publish/gc lock, both ``flock(2)`` on files.

A lock file is created once and never unlinked: unlinking would let a second process lock a new
inode under the same name while the first still holds the old one. The kernel drops an
``flock`` when its holder dies (SIGKILL included), so a crashed builder never blocks others for
good. The holder writes ``pid=... host=... since=...`` into the file so a waiter can say who it
waits for.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from mono_aot.spec.errors import MonoError
from mono_aot.store._fs import makedirs

log = logging.getLogger("mono_aot.store")

NOTICE_AFTER = 3.0  # seconds of waiting before saying who holds the lock
NOTICE_EVERY = 60.0  # and again this often while still waiting


class LockTimeout(MonoError):
    """A lock was not obtained within the caller's timeout."""


def _open_lock_file(path: Path) -> tuple[int, bool]:
    makedirs(path.parent)
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666), True
    except PermissionError:
        # Another user's lock file in a shared store: flock works on a read-only descriptor.
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC), False


def holder_of(path: Path) -> str:
    """Who the lock file says holds it (as written by the last holder)."""
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        text = ""
    return text or "an unknown process (it did not record itself)"


@contextmanager
def _lock_file(path: Path) -> Iterator[tuple[int, bool]]:
    """The open lock file; on exit any flock on it is released (a no-op if none) and it closes."""
    fd, can_write = _open_lock_file(path)
    try:
        yield fd, can_write
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextmanager
def key_lock(
    path: Path, what: str, *, timeout: float | None = None, poll: float = 0.05
) -> Iterator[None]:
    """Hold the exclusive lock in ``path``; waits (polling) and reports the holder while waiting."""
    with _lock_file(path) as (fd, can_write):
        start = time.monotonic()
        next_notice = start + NOTICE_AFTER
        delay = poll
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            now = time.monotonic()
            if now >= next_notice:
                log.warning(
                    "waiting %.0fs for %s: lock %s is held by %s",
                    now - start,
                    what,
                    path,
                    holder_of(path),
                )
                next_notice = now + NOTICE_EVERY
            if timeout is not None and now - start >= timeout:
                raise LockTimeout(
                    f"gave up after {timeout:g}s waiting for {what}: lock {path} is held by "
                    f"{holder_of(path)}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        if can_write:
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            note = f"pid={os.getpid()} host={socket.gethostname()} since={stamp}\n".encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, note, 0)
        yield


@contextmanager
def store_lock(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Publishers share this lock, gc and clear take it alone: gc never sees a blob whose entry
    is still being written, so it cannot delete a blob that an entry is about to need."""
    with _lock_file(path) as (fd, _):
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
