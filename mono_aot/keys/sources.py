"""Which files make the kernels, and their digest: the one input of a key that is code.

Standard library only, so that the wheel's build hook (``hatch_build.py``) can load this file
by path in an environment with nothing but hatchling, and the runtime can use it with no
compiler present.

The file list of ``mono_aot.kernels`` is its ``*.py`` files, the contract modules and every
project module those import, transitively (found by parsing, never importing). Parsing costs
100-200 ms, so an installed wheel carries the list in ``mono_aot/_kernel_sources.json``
(written at wheel build time); the runtime re-hashes the listed files (about a millisecond),
so an edited install is never served bytes built from other sources. A checkout without the
manifest parses once per process.
"""

from __future__ import annotations

import ast
import hashlib
import json
from functools import lru_cache
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # .../mono_aot
PROJECT_ROOT = PACKAGE_DIR.parent  # relative source paths are taken from here
# Project modules every kernel compiles against, besides its own package.
CONTRACT_MODULES: tuple[str, ...] = (
    "mono_aot/spec/abi.py",
    "mono_aot/spec/arch.py",
    "mono_aot/spec/layouts.py",
)
MANIFEST_NAME = "_kernel_sources.json"
MANIFEST_FORMAT = "mono-aot.kernel-sources"

Sources = tuple[tuple[str, Path], ...]  # (path relative to the project root, file)


def source_digest(sources: Sources) -> str:
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
    base = PROJECT_ROOT.joinpath(*parts)
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
        path.relative_to(PROJECT_ROOT).with_suffix("").parts[:-1]
        if PACKAGE_DIR in path.parents
        else ()
    )
    found: set[Path] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                mod = alias.name.split(".")
                for i in range(2, len(mod) + 1):  # import a.b.c runs a, a.b and a.b.c
                    f = _module_file(".".join(mod[:i]))
                    if f is not None:
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
                    found.add(sub)  # from mono_aot import abi: the submodule
                    continue
                f = _module_file(mod)
                if f is not None and (mod != "mono_aot" or alias.name != "*"):
                    found.add(f)
    return found


def closure(files: list[Path]) -> list[Path]:
    """``files`` plus the contract modules and every project module they import, transitively."""
    seen: set[Path] = set()
    todo = [p.resolve() for p in files] + [
        (PROJECT_ROOT / rel).resolve() for rel in CONTRACT_MODULES
    ]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo.extend(_imported_project_files(p) - seen)
    return sorted(seen)


def py_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.py") if "__pycache__" not in p.parts)


def relative(p: Path, provider_dir: Path | None = None) -> str:
    """The path that enters the digest: ``mono_aot/...`` for the package's files (as installed
    anywhere), ``provider/...`` for a directory provider's own files (wherever it was copied)."""
    if provider_dir is not None and provider_dir in p.parents:
        return f"provider/{p.relative_to(provider_dir).as_posix()}"
    return p.relative_to(PROJECT_ROOT).as_posix()


def parse_kernel_sources() -> Sources:
    """The real kernels' files, found by parsing (what the manifest records)."""
    return tuple((relative(p), p) for p in closure(py_files(PACKAGE_DIR / "kernels")))


def manifest_doc(sources: Sources) -> dict:
    return {
        "format": MANIFEST_FORMAT,
        "version": 1,
        "files": sorted(rel for rel, _ in sources),
        "sha256": source_digest(sources),
    }


def write_manifest(package_dir: Path = PACKAGE_DIR) -> Path:
    """Write the manifest next to the package's files (the wheel build hook calls this)."""
    path = Path(package_dir) / MANIFEST_NAME
    text = json.dumps(manifest_doc(parse_kernel_sources()), indent=2, sort_keys=True) + "\n"
    path.write_text(text, encoding="ascii")
    return path


class ManifestError(ValueError):
    """The installed manifest is unreadable or names a file that is not installed."""


def _manifest_sources(path: Path) -> Sources:
    try:
        doc = json.loads(path.read_text(encoding="ascii"))
        if doc.get("format") != MANIFEST_FORMAT or doc.get("version") != 1:
            raise ValueError(f"format {doc.get('format')!r} version {doc.get('version')!r}")
        rels = [str(r) for r in doc["files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ManifestError(f"{path}: unreadable kernel source manifest: {e}") from None
    out = []
    for rel in rels:
        p = PROJECT_ROOT / rel
        if not rel.startswith("mono_aot/") or ".." in Path(rel).parts or not p.is_file():
            raise ManifestError(f"{path}: lists {rel}, which is not an installed file")
        out.append((rel, p))
    return tuple(out)


@lru_cache(maxsize=1)
def kernel_sources() -> Sources:
    """The files the served keys hash: the installed manifest's list, else parsed once."""
    manifest = PACKAGE_DIR / MANIFEST_NAME
    if manifest.is_file():
        return _manifest_sources(manifest)
    return parse_kernel_sources()


@lru_cache(maxsize=1)
def kernel_source_digest() -> str:
    """The digest of the real kernels' sources as installed now (re-hashed once per process)."""
    return source_digest(kernel_sources())
