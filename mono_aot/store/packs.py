"""Read-only pack stores installed as Python distributions.

Contract for a pack (``mono-aot pack`` builds them): a distribution declares an entry point in
the group ``mono_aot.packs`` (``mono_aot.store.paths.PACK_ENTRY_POINT_GROUP``)::

    [project.entry-points."mono_aot.packs"]
    gfx942 = "mono_aot_kernels_gfx942:STORE_ROOT"     # a pathlib.Path, str or os.PathLike
    # or   = "mono_aot_kernels_gfx942:store_root"     # a callable taking no arguments, returning one

The object the entry point loads to is the store root (the directory holding ``v1/``), or a
zero-argument callable returning it. Packs are always read-only layers, read after the user
cache, in the order of their entry point names. A pack that fails to load, or gives something
that is not a path, is skipped with a warning naming the entry point; it never stops a lookup.

A pack built by ``mono-aot pack`` also holds ``<root>/pack.json`` (``PACK_INDEX``): the
mono-aot version and kernel-source digest it was built for, its arch, layouts and entries.
``Store.default(kernel_sources=DIGEST)`` skips every pack whose digest differs from ``DIGEST``
(the caller's installed ``mono_aot.keys.sources.kernel_source_digest()``: the store does not
import the keys), with one warning per pack per process naming both versions and digests. A pack
without an index (made by hand) is served as before; one with a damaged index is skipped.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from mono_aot import __version__
from mono_aot.spec.util import HEX64
from mono_aot.store.paths import PACK_ENTRY_POINT_GROUP

log = logging.getLogger("mono_aot.store")

PACK_INDEX = "pack.json"  # in the pack's store root, beside v1/
PACK_FORMAT = "mono-aot.pack"
PACK_INDEX_VERSION = 1

SERVED, SKIPPED = "served", "skipped"


class PackIndexError(ValueError):
    """A pack's ``pack.json`` is unreadable or malformed."""


@dataclass(frozen=True)
class PackIndex:
    """What ``pack.json`` says about the pack's contents and what it was built for."""

    arch: str
    mono_aot_version: str
    kernel_sources: str
    layouts: tuple[dict[str, Any], ...]
    entries: tuple[dict[str, Any], ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "format": PACK_FORMAT,
            "version": PACK_INDEX_VERSION,
            "arch": self.arch,
            "mono_aot": self.mono_aot_version,
            "kernel_sources": self.kernel_sources,
            "layouts": list(self.layouts),
            "entries": list(self.entries),
        }


def read_index(root: Path) -> PackIndex | None:
    """``<root>/pack.json``, or None when there is none; PackIndexError when it is damaged."""
    path = Path(root) / PACK_INDEX
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise PackIndexError(f"{path}: cannot read: {e}") from None
    try:
        doc = json.loads(raw.decode("ascii"))
        if doc.get("format") != PACK_FORMAT or doc.get("version") != PACK_INDEX_VERSION:
            raise ValueError(f"format {doc.get('format')!r} version {doc.get('version')!r}")
        digest = doc["kernel_sources"]
        if not isinstance(digest, str) or not HEX64.fullmatch(digest):
            raise ValueError(f"kernel_sources {digest!r} is not a sha256")
        index = PackIndex(
            arch=str(doc["arch"]),
            mono_aot_version=str(doc["mono_aot"]),
            kernel_sources=digest,
            layouts=tuple(dict(x) for x in doc["layouts"]),
            entries=tuple(dict(x) for x in doc["entries"]),
        )
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise PackIndexError(f"{path}: not a mono-aot pack index: {e}") from None
    return index


@dataclass(frozen=True)
class Pack:
    """One installed pack entry point: where its store is, what it was built for, or why not."""

    name: str  # the entry point's name (the arch, for packs mono-aot builds)
    value: str  # module:attribute
    dist: str | None  # the distribution declaring it
    dist_version: str | None
    root: Path | None
    index: PackIndex | None
    error: str | None  # why the entry point or its index could not be used

    def skip_reason(self, kernel_sources: str | None) -> str | None:
        """Why this pack must not be served to a mono-aot with ``kernel_sources``, or None."""
        if self.error is not None:
            return self.error
        if kernel_sources is None or self.index is None:
            return None
        if self.index.kernel_sources != kernel_sources:
            return (
                f"built for mono-aot {self.index.mono_aot_version} with kernel sources "
                f"{self.index.kernel_sources[:16]}..., but the installed mono-aot {__version__} "
                f"has kernel sources {kernel_sources[:16]}...; none of its entries is served "
                f"(install the pack built for this mono-aot, or rebuild it: mono-aot pack "
                f"--arch {self.index.arch})"
            )
        return None

    def describe(self) -> str:
        dist = f"{self.dist} {self.dist_version}" if self.dist else self.value
        return f"pack {self.name} ({dist}{f', {self.root}' if self.root else ''})"

    def as_json(self, kernel_sources: str | None = None) -> dict[str, Any]:
        why = self.skip_reason(kernel_sources)
        return {
            "name": self.name,
            "value": self.value,
            "dist": self.dist,
            "dist_version": self.dist_version,
            "root": None if self.root is None else str(self.root),
            "arch": self.index.arch if self.index else None,
            "mono_aot": self.index.mono_aot_version if self.index else None,
            "kernel_sources": self.index.kernel_sources if self.index else None,
            "entries": len(self.index.entries) if self.index else None,
            "status": SKIPPED if why else SERVED,
            "reason": why,
        }


def installed_packs() -> list[Pack]:
    """Every installed pack entry point, sorted by name; nothing is logged."""
    seen, out = set(), []
    for ep in sorted(entry_points(group=PACK_ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value)):
        if (ep.name, ep.value) in seen:
            continue  # the same distribution found twice on sys.path
        seen.add((ep.name, ep.value))
        dist = ep.dist.name if ep.dist is not None else None
        dist_version = ep.dist.version if ep.dist is not None else None
        root = index = error = None
        try:
            obj = ep.load()
            root = Path(os.fspath(obj() if callable(obj) else obj))
        except Exception as e:  # a broken pack must not break lookups
            error = (
                f"{type(e).__name__}: {e} (it must give a store root path, or a callable with "
                "no arguments returning one)"
            )
        if root is not None:
            try:
                index = read_index(root)
            except PackIndexError as e:
                error = str(e)
        out.append(Pack(ep.name, ep.value, dist, dist_version, root, index, error))
    return out


_warned: set[tuple[str, str, str]] = set()


def warn_once(pack: Pack, reason: str) -> None:
    """Log why ``pack`` is skipped, once per pack and reason in this process."""
    token = (pack.name, pack.value, reason)
    if token in _warned:
        return
    _warned.add(token)
    if pack.error is not None and pack.root is None:
        log.warning(
            "pack entry point %r (%s) in group %s skipped: %s",
            pack.name,
            pack.value,
            PACK_ENTRY_POINT_GROUP,
            reason,
        )
    else:
        log.warning("%s skipped: %s", pack.describe(), reason)


def served_packs(kernel_sources: str | None = None) -> list[Pack]:
    """The installed packs a mono-aot with ``kernel_sources`` may serve from, warning (once)
    about each one it skips. ``kernel_sources=None`` checks loading only, not the digest."""
    out = []
    for pack in installed_packs():
        why = pack.skip_reason(kernel_sources)
        if why is not None:
            warn_once(pack, why)
            continue
        out.append(pack)
    return out


def pack_roots(kernel_sources: str | None = None) -> list[tuple[str, Path]]:
    """(entry point name, store root) of every pack ``served_packs`` keeps, sorted by name."""
    return [(p.name, p.root) for p in served_packs(kernel_sources) if p.root is not None]
