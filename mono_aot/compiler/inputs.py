"""Build inputs: the toolchain half of an entry, and kernel providers outside the package.

Equal build inputs for one lookup key mean equal bytes; an entry whose recorded inputs differ
from the current toolchain's is stale (``mono_aot.compiler.plan``).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

from mono_aot.keys import Provider
from mono_aot.keys.sources import closure, py_files, relative
from mono_aot.spec.util import file_sha256

BUILD_SCHEMA_VERSION = 1


def directory_provider(directory: Path, module: str) -> Provider:
    """A provider living in ``directory`` (tests' fixture kernels): module ``module`` importable
    with ``directory`` on ``sys.path``; its sources are the directory's ``*.py`` plus the project
    modules they (and the contract) import."""
    d = Path(directory).resolve()
    files = closure(py_files(d))
    return Provider(
        module, tuple((relative(p, d), p) for p in files), search_path=d, uses_abi_contract=False
    )


@lru_cache(maxsize=4)
def installed_package_digest(dist_name: str) -> tuple[str, str, int]:
    """(version, sha256, file count) of an installed distribution's files, from its RECORD.

    Compiled ``.pyc`` files and install bookkeeping (RECORD, INSTALLER, direct_url.json) vary by
    install, not by content, and are left out. Cached per process: hashing takes a while.
    """
    from importlib import metadata

    dist = metadata.distribution(dist_name)
    skip_names = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
    rows = []
    for f in dist.files or []:
        rel = f.as_posix()
        if rel.endswith(".pyc") or "__pycache__" in rel or f.name in skip_names:
            continue
        if rel.startswith("..") or rel.startswith("/"):
            continue  # scripts installed outside site-packages: not FlyDSL's code
        path = Path(f.locate())
        if path.is_file():
            rows.append((rel, path))
    h = hashlib.sha256()
    for rel, path in sorted(rows):
        h.update(f"{rel}\0{file_sha256(path)}\n".encode())
    return dist.version, h.hexdigest(), len(rows)


def build_inputs(
    *, flydsl: dict[str, Any], linker: dict[str, str], options: dict[str, Any]
) -> dict[str, Any]:
    """The toolchain half of an entry: equal build inputs mean equal bytes for one key."""
    return {
        "build_schema": BUILD_SCHEMA_VERSION,
        "flydsl": dict(flydsl),
        "linker": dict(linker),
        "options": dict(options),
    }
