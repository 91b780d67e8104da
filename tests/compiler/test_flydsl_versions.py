"""The FlyDSL versions the build extra accepts: its range in pyproject.toml is the one home.

``make test-flydsl-oldest`` (which CI runs) installs the range's lower bound in a venv of its
own and names its interpreter in ``MONO_AOT_TEST_FLYDSL_PYTHON``: that FlyDSL builds the tiny
layout (both variants, both archs, every publish check), its entries record its version, and
the newest FlyDSL of ``make setup`` sees them as stale. ``make test`` runs with the newest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = ROOT / "layouts" / "test" / "emulator-tiny-tp4.toml"


def flydsl_range() -> SpecifierSet:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = [Requirement(r) for r in doc["project"]["optional-dependencies"]["build"]]
    (flydsl,) = [r for r in reqs if r.name == "flydsl"]
    return flydsl.specifier


def bound(spec: SpecifierSet, operator: str) -> Version:
    (s,) = [s for s in spec if s.operator == operator]
    return Version(s.version)


def test_the_range_is_closed_and_holds_the_installed_flydsl():
    spec = flydsl_range()
    oldest, newest = bound(spec, ">="), bound(spec, "<=")
    assert oldest < newest
    assert Version(version("flydsl")) in spec  # pip enforces it; a stray install does not


def _build(python: str, store: Path, *extra: str) -> dict:
    env = dict(os.environ, MONO_AOT_CACHE_DIR=str(store.parent / "user-cache"))
    env.pop("PYTHONPATH", None)
    args = ["-m", "mono_aot", "build", "--layout", str(LAYOUT), "--store", str(store), "--json"]
    p = subprocess.run(
        [python, *args, *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, f"{python}: exit {p.returncode}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout)


@pytest.mark.slow
def test_the_oldest_flydsl_builds_the_tiny_layout(tmp_path):
    python = os.environ.get("MONO_AOT_TEST_FLYDSL_PYTHON")
    if not python:
        pytest.skip("MONO_AOT_TEST_FLYDSL_PYTHON is not set (make test-flydsl-oldest sets it)")
    oldest = bound(flydsl_range(), ">=")
    store = tmp_path / "store"
    doc = _build(python, store, "-j", "2")
    assert doc["summary"]["failed"] == 0, doc
    built = {(r["arch"], r["variant"]) for r in doc["results"]}
    assert built == {(a, v) for a in ("gfx942", "gfx950") for v in ("narrow", "wide")}
    for entry in (store / "v1" / "entries").rglob("*.json"):
        inputs = json.loads(entry.read_text())["entry"]["build_inputs"]
        assert Version(inputs["flydsl"]["version"]) == oldest, entry
    if Version(version("flydsl")) != oldest:
        plan = _build(sys.executable, store, "--dry-run")["plan"]
        assert plan and all(r["status"] == "stale" for r in plan), plan
        assert all("flydsl" in (r["reason"] or "").lower() for r in plan), plan
