"""Where stores live, from the environment: the one place these variables are read."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

PACK_ENTRY_POINT_GROUP = "mono_aot.packs"


def extra_store_roots(env: dict[str, str] | None = None) -> list[Path]:
    """``MONO_AOT_PATH``: colon-separated store roots read before the user cache."""
    env = os.environ if env is None else env
    return [Path(p) for p in env.get("MONO_AOT_PATH", "").split(":") if p]


def user_cache_root(env: dict[str, str] | None = None) -> Path:
    """The writable store: ``MONO_AOT_CACHE_DIR``, else platformdirs' user cache for mono-aot."""
    env = os.environ if env is None else env
    if env.get("MONO_AOT_CACHE_DIR"):
        return Path(env["MONO_AOT_CACHE_DIR"])
    return Path(platformdirs.user_cache_dir("mono-aot", appauthor=False))


def is_writable_dir(path: Path) -> bool:
    """Whether a store could be created or written at ``path`` (its nearest existing parent)."""
    p = path
    while not p.exists():
        if p.parent == p:
            return False
        p = p.parent
    return p.is_dir() and os.access(p, os.W_OK | os.X_OK)
