"""Garbage collection and clearing of a writable layer.

Last use: a hit must write nothing, so the store never records uses itself. An entry's last use
is the newest of its entry file's modification time (its publish) and its blob's modification
and access times; the kernel moves the blob's access time when a lookup reads it (with the usual
``relatime`` mount option at most about once a day after the first read; on ``noatime`` mounts
never, and gc degrades to oldest-published-first). Maintenance reads (ls, show, verify, gc)
open files with ``O_NOATIME`` where the kernel allows it, so they do not count as uses.

A gc run, under the layer's exclusive store lock (so no publish is half-way):
1. removes what can never be served: temp files (a publisher holding the lock would have
   finished, so any left are from a killed process), quarantined files, entries that fail
   their own check or whose blob is missing, and blobs no entry refers to;
2. then removes entries least recently used first, each with its blob once no remaining entry
   needs it, until the layer's size is at most ``max_size``.
Entries of another schema version are kept and every digest in their text is kept as a blob.
The dry run computes the same plan under the same lock and removes nothing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mono_aot.store._fs import TEMP_PREFIX
from mono_aot.store.layer import ENTRY_CORRUPT, ENTRY_SCHEMA, Layer
from mono_aot.store.lock import store_lock

_ANY_HEX64 = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")


@dataclass(frozen=True)
class Removal:
    kind: str  # temp, quarantine, corrupt-entry, broken-entry, orphan-blob, lru-entry, lru-blob
    path: Path
    size: int
    key: str | None = None
    last_use: float | None = None

    def as_json(self) -> dict:
        return {
            "kind": self.kind,
            "path": str(self.path),
            "size": self.size,
            "key": self.key,
            "last_use": self.last_use,
        }


@dataclass
class GcPlan:
    layer: Layer
    max_size: int
    size_before: int = 0
    removals: list[Removal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def freed(self) -> int:
        return sum(r.size for r in self.removals)

    @property
    def size_after(self) -> int:
        return self.size_before - self.freed

    def as_json(self) -> dict:
        return {
            "layer": self.layer.as_json(),
            "max_size": self.max_size,
            "size_before": self.size_before,
            "size_after": self.size_after,
            "freed": self.freed,
            "removed": [r.as_json() for r in self.removals],
            "notes": self.notes,
        }


def _files(top: Path) -> list[tuple[Path, os.stat_result]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            try:
                out.append((p, os.lstat(p)))
            except FileNotFoundError:
                pass
    return out


def _last_use(entry: os.stat_result, blob: os.stat_result) -> float:
    return max(entry.st_mtime, blob.st_mtime, blob.st_atime)


def plan_gc(layer: Layer, max_size: int) -> GcPlan:
    """What a gc of ``layer`` down to ``max_size`` bytes removes; call under the store lock."""
    plan = GcPlan(layer, max_size)
    entry_files = {p: st for p, st in _files(layer.entries_dir)}
    blob_files = {p: st for p, st in _files(layer.blobs_dir)}
    quarantined = _files(layer.quarantine_dir)
    plan.size_before = sum(
        st.st_size for st in [*entry_files.values(), *blob_files.values()]
    ) + sum(st.st_size for _, st in quarantined)
    garbage = [
        Removal("temp", p, st.st_size)
        for p, st in [*entry_files.items(), *blob_files.items()]
        if p.name.startswith(TEMP_PREFIX)
    ]
    garbage += [Removal("quarantine", p, st.st_size) for p, st in quarantined]

    # Files gc does not recognise (not a digest name, not a temp) are counted, never removed.
    blobs = {sha: p for sha in layer.blob_names() if (p := layer.blob_path(sha)) in blob_files}
    protected: set[str] = set()
    keep_all_blobs = False
    live: list[tuple[float, str, Path, int, str]] = []  # (last use, key, path, size, blob)
    for key in layer.keys():
        path = layer.entry_path(key)
        st = entry_files.get(path)
        if st is None:
            continue
        entry, _, problem = layer.read_entry(key)
        if problem is not None and problem.kind == ENTRY_CORRUPT:
            garbage.append(Removal("corrupt-entry", path, st.st_size, key))
        elif problem is not None and problem.kind == ENTRY_SCHEMA:
            try:
                protected.update(_ANY_HEX64.findall(path.read_text(errors="replace")))
            except OSError:
                keep_all_blobs = True
        elif problem is not None:  # unreadable: its blob cannot be known, so keep every blob
            keep_all_blobs = True
            plan.notes.append(f"{path}: {problem.reason}; no unreferenced blob is removed")
        elif entry is not None:
            sha = entry.blob.sha256
            bst = blob_files.get(layer.blob_path(sha))
            if bst is None:
                garbage.append(Removal("broken-entry", path, st.st_size, key))
            else:
                live.append((_last_use(st, bst), key, path, st.st_size, sha))
    needed = {sha for *_, sha in live} | protected
    if not keep_all_blobs:
        garbage += [
            Removal("orphan-blob", p, blob_files[p].st_size)
            for sha, p in blobs.items()
            if sha not in needed
        ]

    plan.removals = garbage
    size = plan.size_after
    refs: dict[str, int] = {}
    for *_, sha in live:
        refs[sha] = refs.get(sha, 0) + 1
    for last_use, key, path, esize, sha in sorted(live):
        if size <= max_size:
            break
        plan.removals.append(Removal("lru-entry", path, esize, key, last_use))
        size -= esize
        refs[sha] -= 1
        if refs[sha] == 0 and sha not in protected and not keep_all_blobs:
            bpath = blobs[sha]
            bsize = blob_files[bpath].st_size
            plan.removals.append(Removal("lru-blob", bpath, bsize, key, last_use))
            size -= bsize
    if plan.size_after > max_size:
        plan.notes.append(
            f"still {plan.size_after} bytes, over the {max_size} asked: what is left is "
            "needed or not mono-aot's"
        )
    return plan


_ORDER = {"lru-entry": 0, "corrupt-entry": 0, "broken-entry": 0, "lru-blob": 1, "orphan-blob": 1}


def gc_layer(layer: Layer, max_size: int, *, dry_run: bool) -> GcPlan:
    """Plan and (unless ``dry_run``) carry out a gc of a writable layer."""
    layer.require_writable("gc")
    if not layer.base.is_dir():
        return GcPlan(layer, max_size)
    with store_lock(layer.store_lock_path, exclusive=True):
        plan = plan_gc(layer, max_size)
        if not dry_run:
            # Entries go before blobs, so no entry is ever visible without its blob.
            for r in sorted(plan.removals, key=lambda r: _ORDER.get(r.kind, 2)):
                try:
                    os.unlink(r.path)
                except FileNotFoundError:
                    pass
    return plan


@dataclass
class Cleared:
    layer: Layer
    files: int = 0
    bytes: int = 0


def clear_layer(layer: Layer) -> Cleared:
    """Remove every entry, blob, temp and quarantined file; lock files stay (never unlinked)."""
    layer.require_writable("clear")
    done = Cleared(layer)
    if not layer.base.is_dir():
        return done
    with store_lock(layer.store_lock_path, exclusive=True):
        for top in (layer.entries_dir, layer.blobs_dir, layer.quarantine_dir):
            for p, st in _files(top):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    continue
                done.files += 1
                done.bytes += st.st_size
            for dirpath, _, _ in os.walk(top, topdown=False):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass
    return done
