"""Durable, atomic file writes for the store, and the publish test hook.

Every file the store writes goes to a temp file in its final directory, is fsynced, renamed over
its final name and then the directory is fsynced: a reader sees the old file or the whole new
one, never a part, even after a crash or SIGKILL. Files are created with mode 0666 and
directories 0777, both minus the umask (never 0600), so a store filled by CI serves other users.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import time
from pathlib import Path

TEMP_PREFIX = ".tmp-"
# Test hook, for tests only: "POINT=SECONDS[,POINT=SECONDS...]" (POINT may be "*") makes
# publishing announce "mono-aot test hook: paused at POINT" on stderr and sleep there, so a
# test can SIGKILL a publisher exactly between two steps. Points, in order:
# blob-partial, blob-written, blob-visible, entry-partial, entry-written, entry-visible.
TEST_PAUSE_ENV = "MONO_AOT_TEST_PUBLISH_PAUSE"


def test_pause(point: str) -> None:
    """The test hook above; does nothing unless the variable is set."""
    spec = os.environ.get(TEST_PAUSE_ENV)
    if not spec:
        return
    for item in spec.split(","):
        name, _, seconds = item.partition("=")
        if name.strip() in (point, "*"):
            sys.stderr.write(f"mono-aot test hook: paused at {point}\n")
            sys.stderr.flush()
            time.sleep(float(seconds or 0))
            return


def makedirs(path: Path) -> None:
    os.makedirs(path, mode=0o777, exist_ok=True)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]


def temp_name(final: Path) -> Path:
    """A unique temp path next to ``final``; the pid in it tells a reader who left it."""
    return final.with_name(f"{TEMP_PREFIX}{final.name}.{os.getpid()}.{secrets.token_hex(4)}")


def atomic_write(final: Path, data: bytes, *, hook: str | None = None) -> None:
    """Write ``data`` to ``final`` atomically and durably (see the module docstring).

    ``hook`` names the test-hook points ``<hook>-partial``, ``-written`` and ``-visible``.
    """
    makedirs(final.parent)
    tmp = temp_name(final)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        try:
            view = memoryview(data)
            half = len(view) // 2
            _write_all(fd, view[:half])
            if hook:
                test_pause(f"{hook}-partial")
            _write_all(fd, view[half:])
            os.fsync(fd)
        finally:
            os.close(fd)
        if hook:
            test_pause(f"{hook}-written")
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(final.parent)
    if hook:
        test_pause(f"{hook}-visible")


_O_NOATIME = getattr(os, "O_NOATIME", 0)


def read_file(path: Path, *, as_use: bool = True) -> tuple[bytes, os.stat_result]:
    """The bytes of a regular file and its stat, from one open (no race between the two).

    ``as_use=False`` (maintenance: ls, verify, gc) asks the kernel not to update the access
    time, which gc reads as the last use; that needs owning the file, else it is a plain read.
    """
    flags = os.O_RDONLY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | (0 if as_use else _O_NOATIME))
    except PermissionError:
        if as_use or not _O_NOATIME:
            raise
        fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IsADirectoryError(f"{path} is not a regular file")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)
