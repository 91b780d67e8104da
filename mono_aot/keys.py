"""Lookup keys and build inputs (DESIGN.md, "Keys, entries and blobs").

The lookup key is what the runtime can compute with no compiler present: the key schema, the
kernel provider and a digest of its source files, the variant, the layout's canonical form,
the arch and its CTA count. The build inputs are the toolchain that turns those into bytes.
This module imports only the standard library and the project's plain-Python modules, never
FlyDSL and never the build code, because the runtime imports it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from mono_aot.layouts import Layout

KEY_SCHEMA_VERSION = 1
BUILD_SCHEMA_VERSION = 1

REAL_PROVIDER = "mono_aot.kernels"
# Project modules every kernel compiles against, besides its own package.
CONTRACT_MODULES: tuple[str, ...] = ("mono_aot/abi.py", "mono_aot/arch.py", "mono_aot/layouts.py")

_PACKAGE_DIR = Path(__file__).resolve().parent  # .../mono_aot
_PROJECT_ROOT = _PACKAGE_DIR.parent  # relative source paths are taken from here


def canonical_json(doc: Any) -> str:
    """The one JSON spelling that is hashed: sorted keys, no spaces, no NaN."""
    return json.dumps(
        doc, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=True
    )


def sha256_hex(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


@dataclass(frozen=True)
class Provider:
    """Where kernels come from: a module the build worker imports, and the files that define it.

    ``sources`` are (relative path, absolute path) pairs; the relative path enters the digest so
    the runtime (which sees the files installed elsewhere) computes the same value.
    ``search_path`` is put first on the worker's ``sys.path`` (fixture providers outside the
    package); it is never part of a key.
    """

    module: str
    sources: tuple[tuple[str, Path], ...]
    search_path: Path | None = None
    uses_abi_contract: bool = True  # kernargs must equal mono_aot.abi.kernarg_layout

    def source_digest(self) -> str:
        return source_digest(self.sources)


def source_digest(sources: tuple[tuple[str, Path], ...]) -> str:
    """sha256 over (relative path, length, bytes) of every file, in path order."""
    h = hashlib.sha256()
    for rel, path in sorted(sources):
        data = Path(path).read_bytes()
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0")
        h.update(data)
    return h.hexdigest()


def _contract_sources() -> list[tuple[str, Path]]:
    return [(rel, _PROJECT_ROOT / rel) for rel in CONTRACT_MODULES]


def real_provider() -> Provider:
    """``mono_aot.kernels``: every ``*.py`` under it plus the contract modules (from files, not
    imports, so this works with no FlyDSL)."""
    kdir = _PACKAGE_DIR / "kernels"
    files = sorted(p for p in kdir.rglob("*.py") if "__pycache__" not in p.parts)
    srcs = [(p.relative_to(_PROJECT_ROOT).as_posix(), p) for p in files]
    return Provider(REAL_PROVIDER, tuple(srcs + _contract_sources()))


def directory_provider(directory: Path, module: str) -> Provider:
    """A provider living in ``directory`` (tests' fixture kernels): module ``module`` importable
    with ``directory`` on ``sys.path``; its sources are the directory's ``*.py`` plus the
    contract modules."""
    d = Path(directory).resolve()
    files = sorted(p for p in d.rglob("*.py") if "__pycache__" not in p.parts)
    srcs = [(f"provider/{p.relative_to(d).as_posix()}", p) for p in files]
    return Provider(
        module, tuple(srcs + _contract_sources()), search_path=d, uses_abi_contract=False
    )


def lookup_inputs(
    provider: Provider | str, source_digest_hex: str, variant: str, layout: Layout, arch: str
) -> dict[str, Any]:
    """Everything the lookup key hashes, in a form a person can diff."""
    module = provider.module if isinstance(provider, Provider) else provider
    return {
        "key_schema": KEY_SCHEMA_VERSION,
        "provider": module,
        "kernel_sources": source_digest_hex,
        "variant": variant,
        "layout": layout.canonical(),
        "wait_ticks": layout.wait_ticks,
        "wide_base": layout.serving.wide_base,
        "arch": arch,
        "ctas": layout.ctas(arch),
    }


def key_of(inputs: dict[str, Any]) -> str:
    return sha256_hex(canonical_json(inputs))


def lookup_key(provider: Provider, variant: str, layout: Layout, arch: str) -> str:
    """The key the runtime computes for (variant, layout, arch) of ``provider``."""
    return key_of(lookup_inputs(provider, provider.source_digest(), variant, layout, arch))


# ---- build inputs: the toolchain ----


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
        fh = hashlib.sha256()
        with open(path, "rb") as fp:
            for chunk in iter(lambda: fp.read(1 << 20), b""):
                fh.update(chunk)
        h.update(f"{rel}\0{fh.hexdigest()}\n".encode())
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


__all__ = [
    "BUILD_SCHEMA_VERSION",
    "KEY_SCHEMA_VERSION",
    "REAL_PROVIDER",
    "Provider",
    "build_inputs",
    "canonical_json",
    "directory_provider",
    "installed_package_digest",
    "key_of",
    "lookup_inputs",
    "lookup_key",
    "real_provider",
    "source_digest",
]
