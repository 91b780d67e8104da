"""The import rules of ``mono_aot``: which package may import which (README, "How it works").

A static pass over every module's imports (module-level and inside functions; imports under
``if TYPE_CHECKING:`` run nothing and are left out), so a violation fails in well under a second,
and a dynamic check that importing a serving-side package in a fresh interpreter leaves the
compiler's world out of ``sys.modules``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

# package -> the packages it may import (itself included). The flow, bottom up:
# spec -> keys -> store -> runtime -> vllm; reference beside the store; kernels and compiler
# on the build side; the emulator beside them (device-independent); selftest, bench and cli on
# top (the selftest runs its checks on GPUs or on the emulator).
ALLOWED: dict[str, set[str]] = {
    "spec": {"spec"},
    "keys": {"spec", "keys"},
    "store": {"spec", "store"},
    "reference": {"spec", "reference"},
    "kernels": {"spec", "kernels"},
    "compiler": {"spec", "keys", "store", "compiler"},
    "runtime": {"spec", "keys", "store", "runtime"},
    "vllm": {"spec", "runtime", "vllm"},
    "selftest": {"spec", "keys", "store", "runtime", "reference", "emulator", "selftest"},
    "bench": {"spec", "keys", "store", "runtime", "compiler", "bench"},
    "emulator": {"spec", "emulator"},
    "cli": {"spec", "keys", "store", "compiler", "selftest", "bench", "cli"},
}  # fmt: skip
ROOT_MODULES = {"mono_aot", "mono_aot.__main__"}  # the version string and ``python -m mono_aot``
# What a serving-side package must never pull in, directly or through anything it imports.
SERVING_PACKAGES = ("spec", "keys", "store", "runtime", "vllm")
FORBIDDEN_AT_SERVING = ("flydsl", "mono_aot.compiler", "mono_aot.kernels", "click")


def module_files(package_dir: Path) -> dict[str, Path]:
    """``mono_aot.x.y`` -> file, for every module under ``package_dir`` (the ``mono_aot`` dir)."""
    out = {}
    for p in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        parts = p.relative_to(package_dir.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ``mono_aot`` modules ``name`` imports anywhere (parent packages not counted)."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    skip = _type_checking_nodes(tree)
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("mono_aot"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("mono_aot"):
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                found.add(sub if sub in modules else mod)
    return {m for m in found if m != name}


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and module not in ROOT_MODULES else None


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """``mono_aot.x.y`` -> the ``mono_aot`` modules it imports, for every module."""
    modules = module_files(package_dir)
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def violations(package_dir: Path) -> list[str]:
    """Every import that breaks ``ALLOWED``, and every import cycle, one line each."""
    graph = import_graph(package_dir)
    problems = []
    for m, deps in sorted(graph.items()):
        src = package_of(m)
        if src is None:
            continue
        if src not in ALLOWED:
            problems.append(
                f"{m}: package {src!r} has no place in the layering (tests/layering.py)"
            )
            continue
        for d in sorted(deps):
            dst = package_of(d)
            if dst is not None and dst not in ALLOWED[src]:
                problems.append(f"{m} imports {d}: {src} may import only {sorted(ALLOWED[src])}")
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return problems


def unused_allowances(package_dir: Path) -> list[str]:
    """Every edge ``ALLOWED`` permits that no module takes: a rule that allows what nobody
    does is a door left open, so the table says exactly what the code imports."""
    used: dict[str, set[str]] = {src: {src} for src in ALLOWED}
    for m, deps in import_graph(package_dir).items():
        src = package_of(m)
        if src in used:
            used[src].update(filter(None, map(package_of, deps)))
    return [f"{src} may import {dst}, which none of its modules does"
            for src in sorted(ALLOWED) for dst in sorted(ALLOWED[src] - used[src])]  # fmt: skip


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One representative cycle per strongly connected component with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def leaked_modules(package: str, pythonpath: Path | None = None) -> list[str]:
    """What of ``FORBIDDEN_AT_SERVING`` a fresh ``import mono_aot.<package>`` loads."""
    code = (
        f"import sys, mono_aot.{package}\n"
        f"bad = {FORBIDDEN_AT_SERVING!r}\n"
        "print('\\n'.join(sorted(m for m in sys.modules if any(m == b or m.startswith(b + '.') "
        "for b in bad))))\n"
    )
    env = None
    if pythonpath is not None:
        import os

        env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    p = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    if p.returncode != 0:
        raise AssertionError(f"import mono_aot.{package} failed:\n{p.stderr}")
    return p.stdout.split()
