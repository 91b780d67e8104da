"""The layering holds, and the checks that say so can fail (tests/layering.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import mono_aot
from tests.layering import SERVING_PACKAGES, leaked_modules, unused_allowances, violations

PACKAGE = Path(mono_aot.__file__).resolve().parent


def test_no_package_imports_above_itself_and_there_is_no_cycle():
    assert violations(PACKAGE) == []


def test_the_rules_allow_only_the_imports_the_code_makes():
    assert unused_allowances(PACKAGE) == []


@pytest.mark.parametrize("package", [p for p in SERVING_PACKAGES if (PACKAGE / p).is_dir()])
def test_serving_packages_leave_the_compiler_out_of_a_fresh_interpreter(package):
    assert leaked_modules(package) == []


@pytest.fixture
def tree_copy(tmp_path):
    dst = tmp_path / "src" / "mono_aot"
    shutil.copytree(PACKAGE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_a_deliberate_violation_is_caught_statically_and_dynamically(tree_copy):
    util = tree_copy / "spec" / "util.py"
    util.write_text(util.read_text() + "\nimport click  # noqa\n\n\ndef _f():\n"
                    "    from mono_aot.compiler import toolchain  # noqa\n")  # fmt: skip
    found = violations(tree_copy)
    assert any(
        "mono_aot.spec.util imports mono_aot.compiler.toolchain" in v
        and "spec may import only" in v
        for v in found
    ), found
    assert "click" in leaked_modules("store", pythonpath=tree_copy.parent)


def test_a_function_level_cycle_is_caught(tree_copy):
    store = tree_copy / "store" / "paths.py"
    store.write_text(
        store.read_text() + "\n\ndef _f():\n    from mono_aot.store import lock  # noqa\n"
    )
    lock = tree_copy / "store" / "lock.py"
    lock.write_text(
        lock.read_text() + "\n\ndef _g():\n    from mono_aot.store import paths  # noqa\n"
    )
    found = violations(tree_copy)
    assert any(v.startswith("import cycle:") and "mono_aot.store.lock" in v for v in found), found


def test_an_import_nobody_makes_any_more_is_named(tree_copy):
    """vllm's only runtime import removed: the table then allows an edge nobody takes."""
    for f in (tree_copy / "vllm").rglob("*.py"):
        text = f.read_text()
        if "mono_aot.runtime" in text or "from ..runtime" in text:
            f.write_text(
                text.replace("mono_aot.runtime", "mono_aot.spec").replace(
                    "from ..runtime", "from ..spec"
                )
            )
    assert "vllm may import runtime, which none of its modules does" in unused_allowances(tree_copy)
