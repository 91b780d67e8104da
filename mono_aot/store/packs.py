"""Read-only pack stores installed as Python distributions.

Contract for a pack (the pack issue builds them): a distribution declares an entry point in the
group ``mono_aot.packs`` (``mono_aot.store.paths.PACK_ENTRY_POINT_GROUP``)::

    [project.entry-points."mono_aot.packs"]
    gfx942 = "mono_aot_pack_gfx942:STORE_ROOT"     # a pathlib.Path, str or os.PathLike
    # or   = "mono_aot_pack_gfx942:store_root"     # a callable taking no arguments, returning one

The object the entry point loads to is the store root (the directory holding ``v1/``), or a
zero-argument callable returning it. Packs are always read-only layers, read after the user
cache, in the order of their entry point names. A pack that fails to load, or gives something
that is not a path, is skipped with a warning naming the entry point; it never stops a lookup.
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points
from pathlib import Path

from mono_aot.store.paths import PACK_ENTRY_POINT_GROUP

log = logging.getLogger("mono_aot.store")


def pack_roots() -> list[tuple[str, Path]]:
    """(entry point name, store root) of every installed pack, sorted by name."""
    seen, out = set(), []
    for ep in sorted(entry_points(group=PACK_ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value)):
        if (ep.name, ep.value) in seen:
            continue  # the same distribution found twice on sys.path
        seen.add((ep.name, ep.value))
        try:
            obj = ep.load()
            root = obj() if callable(obj) else obj
            out.append((ep.name, Path(os.fspath(root))))
        except Exception as e:  # a broken pack must not break lookups
            log.warning(
                "pack entry point %r (%s) in group %s skipped: %s: %s (it must give a "
                "store root path, or a callable with no arguments returning one)",
                ep.name,
                ep.value,
                PACK_ENTRY_POINT_GROUP,
                type(e).__name__,
                e,
            )
    return out
