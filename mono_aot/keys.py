"""Lookup keys and build inputs (DESIGN.md, "Keys, entries and blobs").

The lookup key is what the runtime can compute with no compiler present: the key schema, the
kernel provider and a digest of its source files, the variant, the layout's canonical form,
the arch and its CTA count. The build inputs are the toolchain that turns those into bytes.
This module imports only the standard library and the project's plain-Python modules, never
FlyDSL and never the build code, because the runtime imports it.
"""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from mono_aot.spec.layouts import Layout

KEY_SCHEMA_VERSION = 1
BUILD_SCHEMA_VERSION = 1

REAL_PROVIDER = "mono_aot.kernels"
# Project modules every kernel compiles against, besides its own package.
CONTRACT_MODULES: tuple[str, ...] = ("mono_aot/spec/abi.py", "mono_aot/spec/arch.py", "mono_aot/spec/layouts.py")

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
    uses_abi_contract: bool = True  # kernargs must equal mono_aot.spec.abi.kernarg_layout

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


def _module_file(dotted: str) -> Path | None:
    """The project file of ``mono_aot.x.y``, if it is one."""
    parts = dotted.split(".")
    if parts[0] != "mono_aot":
        return None
    base = _PROJECT_ROOT.joinpath(*parts)
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _imported_project_files(path: Path) -> set[Path]:
    """Project modules ``path`` imports anywhere in its body (function-level imports too)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return set()  # the worker reports the syntax error; the digest still covers the file
    pkg = (
        path.relative_to(_PROJECT_ROOT).with_suffix("").parts[:-1]
        if _PACKAGE_DIR in path.parents
        else ()
    )
    found: set[Path] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                mod = alias.name.split(".")
                for i in range(1, len(mod) + 1):  # import a.b.c runs a, a.b and a.b.c
                    f = _module_file(".".join(mod[:i]))
                    if f is not None and i > 1:
                        found.add(f)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(pkg[: len(pkg) - node.level + 1])
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("mono_aot"):
                continue
            for alias in node.names:
                sub = _module_file(f"{mod}.{alias.name}")
                if sub is not None:
                    found.add(sub)  # from mono_aot.spec import abi: the submodule
                    continue
                f = _module_file(mod)
                if f is not None and (mod != "mono_aot" or alias.name != "*"):
                    found.add(f)
    return found


def _closure(files: list[Path]) -> list[Path]:
    """``files`` plus every project module they import, transitively."""
    seen: set[Path] = set()
    todo = [p.resolve() for p in files] + [
        (_PROJECT_ROOT / rel).resolve() for rel in CONTRACT_MODULES
    ]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo.extend(_imported_project_files(p) - seen)
    return sorted(seen)


def _rel(p: Path, provider_dir: Path | None) -> str:
    """The path that enters the digest: ``mono_aot/...`` for the package's files (as installed
    anywhere), ``provider/...`` for a directory provider's own files (wherever it was copied)."""
    if provider_dir is not None and provider_dir in p.parents:
        return f"provider/{p.relative_to(provider_dir).as_posix()}"
    return p.relative_to(_PROJECT_ROOT).as_posix()


def _py_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.py") if "__pycache__" not in p.parts)


def real_provider() -> Provider:
    """``mono_aot.kernels``: every ``*.py`` under it, the contract modules and every project
    module those import (found by reading the files, not importing them, so it works with no
    FlyDSL)."""
    files = _closure(_py_files(_PACKAGE_DIR / "kernels"))
    return Provider(REAL_PROVIDER, tuple((_rel(p, None), p) for p in files))


def directory_provider(directory: Path, module: str) -> Provider:
    """A provider living in ``directory`` (tests' fixture kernels): module ``module`` importable
    with ``directory`` on ``sys.path``; its sources are the directory's ``*.py`` plus the project
    modules they (and the contract) import."""
    d = Path(directory).resolve()
    files = _closure(_py_files(d))
    return Provider(
        module, tuple((_rel(p, d), p) for p in files), search_path=d, uses_abi_contract=False
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
