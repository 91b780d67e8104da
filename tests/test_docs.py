"""The Markdown files name only what exists: every ``mono_aot/...`` path, ``mono_aot.x.y``
module (or a name defined in one), ``make`` target and ``MONO_AOT_*`` variable. A reader who
follows the README to a module that moved finds nothing; this fails first."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SKIP = {".venv", "artifacts", "node_modules", "build", "dist"}

_PATH = re.compile(r"\bmono_aot/[A-Za-z0-9_/.]*[A-Za-z0-9_]")
_DOTTED = re.compile(r"(torch\.ops\.)?\bmono_aot(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_MAKE = re.compile(r"\bmake ([a-z][a-z0-9-]*)")
_VAR = re.compile(r"\bMONO_AOT_[A-Z0-9_]+")


def markdown_files(root: Path) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*.md")
        if not any(part in _SKIP or part.startswith(".") for part in p.relative_to(root).parts)
    )


def _code_text(root: Path) -> str:
    files = [*(root / "mono_aot").rglob("*.py"), *(root / "tests").rglob("*.py")]
    files += [root / "Makefile", *(root / ".ci").glob("*"), root / "pyproject.toml"]
    return "\n".join(p.read_text(errors="replace") for p in files if p.is_file())


def _dotted_exists(root: Path, name: str, code: str) -> bool:
    """A module, a name a module defines (``mono_aot.spec.abi.kernarg_layout``), or a name
    the code spells as a string: an entry-point group (``mono_aot.packs``)."""
    if f'"{name}"' in code:
        return True
    parts = name.split(".")
    for n in range(len(parts), 1, -1):
        base = root.joinpath(*parts[:n])
        module = (
            base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        )
        if not module.is_file():
            continue
        rest = parts[n:]
        if not rest:
            return True
        text = module.read_text()
        return re.search(rf"^(?:def|class) {rest[0]}\b|^{rest[0]}\b.*=", text, re.M) is not None
    return False


def stale_references(root: Path) -> list[str]:
    """Each name a Markdown file gives that does not exist, as ``file: kind name``."""
    code = _code_text(root)
    makefile = (root / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:", makefile, re.M))
    bad = []
    for md in markdown_files(root):
        text = md.read_text()
        where = md.relative_to(root)
        for m in sorted(set(_PATH.findall(text))):
            if not (root / m).exists():
                bad.append(f"{where}: path {m}")
        for m in sorted({x.group(0) for x in _DOTTED.finditer(text)}):
            if m.startswith("torch.ops."):  # a custom op: registered as "mono_aot::name"
                lib, _, op = m[len("torch.ops.") :].partition(".")
                if f'"{lib}::{op}"' not in code:
                    bad.append(f"{where}: torch op {m}")
            elif not _dotted_exists(root, m, code):
                bad.append(f"{where}: module {m}")
        for m in sorted(set(_MAKE.findall(text))):
            if m not in targets:
                bad.append(f"{where}: make target {m}")
        for m in sorted(set(_VAR.findall(text))):
            if m not in code:
                bad.append(f"{where}: variable {m}")
    return bad


def test_markdown_names_only_paths_modules_targets_and_variables_that_exist():
    assert markdown_files(ROOT), "no Markdown found"
    assert stale_references(ROOT) == []


def test_a_stale_name_in_markdown_is_reported(tmp_path: Path):
    """The check on a copy of the tree's skeleton with one document naming what is gone."""
    (tmp_path / "mono_aot" / "spec").mkdir(parents=True)
    (tmp_path / "mono_aot" / "__init__.py").write_text("")
    (tmp_path / "mono_aot" / "spec" / "__init__.py").write_text("")
    (tmp_path / "mono_aot" / "spec" / "abi.py").write_text(
        'def kernarg_layout(tp): ...\nGROUP = "mono_aot.packs"\nX = "MONO_AOT_PATH"\n'
    )
    (tmp_path / "Makefile").write_text("test:\n\ttrue\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text(
        "Run `make test`, read `mono_aot/spec/abi.py`, `mono_aot.spec.abi.kernarg_layout`, "
        "the group `mono_aot.packs`, `MONO_AOT_PATH`.\n"
        "Gone: `mono_aot/abi.py`, `mono_aot.fp8`, `mono_aot.spec.abi.nothing`, `make lint`, "
        "`MONO_AOT_NOPE`, `torch.ops.mono_aot.step`.\n"
    )
    assert stale_references(tmp_path) == [
        "docs/guide.md: path mono_aot/abi.py",
        "docs/guide.md: module mono_aot.fp8",
        "docs/guide.md: module mono_aot.spec.abi.nothing",
        "docs/guide.md: torch op torch.ops.mono_aot.step",
        "docs/guide.md: make target lint",
        "docs/guide.md: variable MONO_AOT_NOPE",
    ]
