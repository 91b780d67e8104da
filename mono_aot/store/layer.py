"""One store root on disk: verified reads, atomic publishing, quarantine.

Disk layout under a root (every path derives from a validated 64-hex digest, never from text read
out of a file)::

    <root>/v1/blobs/<sha[:2]>/<sha>            code object bytes, named by their sha256
    <root>/v1/entries/<key[:2]>/<key>.json     entry document (mono_aot.store.entry)
    <root>/v1/locks/<key>.lock                 single-flight build lock (never unlinked)
    <root>/v1/locks/store.lock                 shared by publishers, exclusive for gc/clear
    <root>/v1/quarantine/<time>-<pid>-<name>   files that failed verification (+ .reason)

Temp files (``.tmp-<name>.<pid>.<random>``) live next to their final name until renamed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from mono_aot.spec.errors import BadInput, MonoError
from mono_aot.spec.util import HEX64
from mono_aot.store._fs import atomic_write, makedirs, read_file
from mono_aot.store.entry import Entry, EntryCorrupt, EntryUnknownSchema, decode_entry, encode_entry
from mono_aot.store.lock import store_lock

log = logging.getLogger("mono_aot.store")

STORE_DIR = "v1"  # the disk layout's version; a new layout gets a new directory
_SHARD = re.compile(r"[0-9a-f]{2}")

# Layer kinds: where a root came from.
PATH = "path"  # MONO_AOT_PATH (read-only to mono-aot)
CACHE = "cache"  # the user cache (writable when the filesystem allows)
PACK = "pack"  # an installed pack (always read-only)
DIR = "dir"  # an explicit root (Store.at, --store)

# Problem kinds. The first three are a damaged file and get quarantined in a writable layer.
ENTRY_CORRUPT = "entry-corrupt"
BLOB_CORRUPT = "blob-corrupt"
BLOB_MISSING = "blob-missing"  # the entry is intact but its blob is gone: the entry moves
ENTRY_SCHEMA = "entry-schema"  # another mono-aot's schema: ignored, left alone
UNREADABLE = "unreadable"  # permissions or I/O: ignored, left alone
MISSING = "missing"  # verify KEY found no entry anywhere
_DAMAGE = (ENTRY_CORRUPT, BLOB_CORRUPT, BLOB_MISSING)


class StoreReadOnly(MonoError):
    """A write (publish, build, gc, clear) was asked of a layer that is read-only."""


def check_key(key: object, what: str = "store key") -> str:
    """``key`` if it is a 64-digit lowercase hex sha256; BadInput naming it otherwise."""
    if not isinstance(key, str) or not HEX64.fullmatch(key):
        raise BadInput(f"{what} {key!r} is not a sha256 (64 lowercase hex digits)")
    return key


@dataclass(frozen=True)
class Layer:
    """A store root, where it came from, and whether mono-aot may write to it."""

    root: Path
    kind: str
    writable: bool
    label: str  # for people: "user cache", "MONO_AOT_PATH", "pack <name>", "store"

    @property
    def base(self) -> Path:
        return self.root / STORE_DIR

    @property
    def entries_dir(self) -> Path:
        return self.base / "entries"

    @property
    def blobs_dir(self) -> Path:
        return self.base / "blobs"

    @property
    def locks_dir(self) -> Path:
        return self.base / "locks"

    @property
    def quarantine_dir(self) -> Path:
        return self.base / "quarantine"

    def entry_path(self, key: str) -> Path:
        check_key(key)
        return self.entries_dir / key[:2] / f"{key}.json"

    def blob_path(self, sha256: str) -> Path:
        check_key(sha256, "blob digest")
        return self.blobs_dir / sha256[:2] / sha256

    def lock_path(self, key: str) -> Path:
        check_key(key)
        return self.locks_dir / f"{key}.lock"

    @property
    def store_lock_path(self) -> Path:
        return self.locks_dir / "store.lock"

    def describe(self) -> str:
        return f"{self.label} {self.root} ({'writable' if self.writable else 'read-only'})"

    def as_json(self) -> dict:
        return {
            "kind": self.kind,
            "label": self.label,
            "root": str(self.root),
            "writable": self.writable,
            "exists": self.base.is_dir(),
        }

    # --- listing ---------------------------------------------------------------------------

    def _names(self, top: Path, shard: str | None, suffix: str) -> Iterator[str]:
        try:
            shards = [shard] if shard else sorted(os.listdir(top))
        except (FileNotFoundError, NotADirectoryError):
            return
        for s in shards:
            if not _SHARD.fullmatch(s):
                continue
            try:
                names = sorted(os.listdir(top / s))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in names:
                stem = name[: len(name) - len(suffix)] if name.endswith(suffix) else None
                if stem and HEX64.fullmatch(stem) and stem.startswith(s):
                    yield stem

    def keys(self, prefix: str = "") -> Iterator[str]:
        """Keys with an entry file here (intact or not), sorted, optionally by hex prefix."""
        shard = prefix[:2] if len(prefix) >= 2 else None
        return (k for k in self._names(self.entries_dir, shard, ".json") if k.startswith(prefix))

    def blob_names(self) -> Iterator[str]:
        return self._names(self.blobs_dir, None, "")

    # --- reading ---------------------------------------------------------------------------

    def read_entry(
        self, key: str, *, as_use: bool = False
    ) -> tuple[Entry | None, os.stat_result | None, Problem | None]:
        """The entry filed under ``key`` (blob not checked): (entry, stat, problem)."""
        path = self.entry_path(key)
        try:
            raw, st = read_file(path, as_use=as_use)
        except FileNotFoundError:
            return None, None, None
        except OSError as e:
            return None, None, Problem(self, UNREADABLE, key, path, f"cannot read: {e}")
        try:
            return decode_entry(raw, key), st, None
        except EntryUnknownSchema as e:
            return None, st, Problem(self, ENTRY_SCHEMA, key, path, str(e))
        except EntryCorrupt as e:
            return None, st, Problem(self, ENTRY_CORRUPT, key, path, str(e))

    def read_blob(
        self, sha256: str, size: int, key: str | None = None, *, as_use: bool = False
    ) -> tuple[bytes | None, os.stat_result | None, Problem | None]:
        """The blob's bytes only if their size and sha256 are right. ``as_use``: a lookup,
        which the kernel may record as the blob's access time (gc's last use)."""
        path = self.blob_path(sha256)
        try:
            raw, st = read_file(path, as_use=as_use)
        except FileNotFoundError:
            return None, None, Problem(self, BLOB_MISSING, key, path, f"blob {sha256} is missing")
        except OSError as e:
            return None, None, Problem(self, UNREADABLE, key, path, f"cannot read: {e}")
        if len(raw) != size:
            why = f"blob is {len(raw)} bytes, its entry says {size} (truncated or damaged)"
            return None, st, Problem(self, BLOB_CORRUPT, key, path, why)
        got = hashlib.sha256(raw).hexdigest()
        if got != sha256:
            why = f"blob content hashes to {got[:16]}..., not its name (damaged)"
            return None, st, Problem(self, BLOB_CORRUPT, key, path, why)
        return raw, st, None

    def check(
        self, key: str, *, report: bool = True, as_use: bool = True
    ) -> tuple[Hit | None, list[Problem]]:
        """Look ``key`` up here with full verification; damaged files are quarantined when this
        layer is writable (left alone otherwise). A hit writes nothing."""
        for _ in range(3):  # retried only when the entry was replaced while being read
            entry, est, problem = self.read_entry(key, as_use=as_use)
            if problem:
                return None, self._handle([(problem, est)], report)
            if entry is None:
                return None, []
            data, bst, bp = self.read_blob(entry.blob.sha256, entry.blob.size, key, as_use=as_use)
            if bp is None:
                blob = self.blob_path(entry.blob.sha256)
                return Hit(data, entry, self, self.entry_path(key), blob), []
            if not _same_file(self.entry_path(key), est):
                continue  # replaced or removed meanwhile (publish, gc): look again
            if bp.kind == BLOB_MISSING:
                bad = [(replace(bp, path=self.entry_path(key), reason=f"its {bp.reason}"), est)]
            elif bp.kind == BLOB_CORRUPT:
                why = f"its blob {entry.blob.sha256[:16]}... failed verification"
                bad = [
                    (bp, bst),
                    (Problem(self, ENTRY_CORRUPT, key, self.entry_path(key), why), est),
                ]
            else:
                bad = [(bp, bst)]
            return None, self._handle(bad, report)
        return None, []

    def _handle(
        self, found: list[tuple[Problem, os.stat_result | None]], report: bool
    ) -> list[Problem]:
        out = []
        for problem, st in found:
            if problem.kind in _DAMAGE and self.writable:
                problem = replace(
                    problem, moved_to=self._quarantine(problem.path, st, problem.reason)
                )
            if report:
                log.warning("%s", problem.message())
            out.append(problem)
        return out

    def _quarantine(self, path: Path, st: os.stat_result | None, reason: str) -> Path | None:
        """Move a bad file aside, but only the very file that was judged (same inode)."""
        if not _same_file(path, st):
            return None
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        dest = self.quarantine_dir / f"{stamp}-{os.getpid()}-{path.name}"
        try:
            makedirs(dest.parent)
            os.rename(path, dest)
        except OSError as e:
            log.warning("could not quarantine %s: %s", path, e)
            return None
        try:
            atomic_write(dest.with_name(dest.name + ".reason"), f"{path}\n{reason}\n".encode())
        except OSError as e:  # the move is what matters; the note is a courtesy
            log.debug("no reason note for %s: %s", dest, e)
        return dest

    # --- writing ---------------------------------------------------------------------------

    def require_writable(self, action: str) -> None:
        if not self.writable:
            raise StoreReadOnly(f"cannot {action}: store layer {self.describe()} is read-only")

    def publish(self, entry: Entry, data: bytes) -> Hit:
        """Blob, then entry, each atomic and durable; identical re-publishing writes nothing."""
        key = check_key(entry.key)
        self.require_writable(f"publish {key}")
        got = hashlib.sha256(data).hexdigest()
        if len(data) != entry.blob.size or got != entry.blob.sha256:
            raise MonoError(
                f"refusing to publish {key}: the data is {len(data)} bytes with sha256 {got}, "
                f"but the entry's blob says {entry.blob.size} bytes with sha256 {entry.blob.sha256}"
            )
        blob = self.blob_path(got)
        epath = self.entry_path(key)
        encoded = encode_entry(entry)
        with store_lock(self.store_lock_path, exclusive=False):
            _, bst, bp = self.read_blob(got, len(data), key)
            if bp is not None:
                if bp.kind == BLOB_CORRUPT:
                    self._handle([(bp, bst)], report=True)
                atomic_write(blob, data, hook="blob")
            try:
                same = read_file(epath)[0] == encoded
            except FileNotFoundError:
                same = False
            if not same:
                atomic_write(epath, encoded, hook="entry")
        return Hit(data, entry, self, epath, blob)

    # --- whole-layer operations -------------------------------------------------------------

    def verify(self) -> tuple[int, list[Problem]]:
        """Check every entry, then every blob no entry uses: (intact entries, problems)."""
        ok, problems, used = 0, [], set()
        for key in list(self.keys()):
            hit, found = self.check(key, report=False, as_use=False)
            problems += found
            if hit:
                ok += 1
                used.add(hit.entry.blob.sha256)
        for sha in list(self.blob_names()):
            if sha in used:
                continue
            try:
                size = self.blob_path(sha).stat().st_size
            except FileNotFoundError:
                continue
            _, st, bp = self.read_blob(sha, size)
            if bp is not None and bp.kind != BLOB_MISSING:
                problems += self._handle([(bp, st)], report=False)
        return ok, problems


@dataclass(frozen=True, eq=False)
class Hit:
    """Verified bytes, their entry, and the layer that served them."""

    data: bytes = field(repr=False)
    entry: Entry
    layer: Layer
    entry_path: Path
    blob_path: Path


@dataclass(frozen=True)
class Problem:
    """A file that could not be served, why, and what was done about it."""

    layer: Layer
    kind: str
    key: str | None
    path: Path
    reason: str
    moved_to: Path | None = None

    def message(self) -> str:
        if self.kind == MISSING:
            return self.reason
        if self.moved_to is not None:
            action = f"moved to {self.moved_to}"
        elif self.kind in _DAMAGE and not self.layer.writable:
            action = "ignored (read-only layer, left in place)"
        else:
            action = "ignored"
        what = f"{self.path.name}" if self.key is None else f"{self.key[:16]}... ({self.path})"
        return f"{self.layer.label} {self.layer.root}: {what}: {self.reason}; {action}"

    def as_json(self) -> dict:
        return {
            "kind": self.kind,
            "key": self.key,
            "path": str(self.path),
            "reason": self.reason,
            "layer": self.layer.label,
            "root": str(self.layer.root),
            "moved_to": None if self.moved_to is None else str(self.moved_to),
        }


def _same_file(path: Path, st: os.stat_result | None) -> bool:
    try:
        cur = os.stat(path)
    except OSError:
        return False
    return st is None or (cur.st_ino, cur.st_dev) == (st.st_ino, st.st_dev)
