"""The FlyDSL versions the build extra accepts: its range in pyproject.toml is the one home.

``make test-flydsl-oldest`` (which CI runs) installs the range's lower bound in a venv of its
own and names its interpreter in ``MONO_AOT_TEST_FLYDSL_PYTHON``: that FlyDSL builds the tiny
layout (both variants, both archs, every publish check), its entries record its version, and
the newest FlyDSL of ``make setup`` sees them as stale. ``make test`` runs with the newest.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .conftest import build_tiny_as_a_user

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.slow
def test_the_oldest_flydsl_builds_the_tiny_layout(tmp_path):
    python = os.environ.get("MONO_AOT_TEST_FLYDSL_PYTHON")
    if not python:
        pytest.skip("MONO_AOT_TEST_FLYDSL_PYTHON is not set (make test-flydsl-oldest sets it)")
    oldest = bound(flydsl_range(), ">=")
    store = tmp_path / "store"
    doc = build_tiny_as_a_user([python, "-m", "mono_aot"], store, "-j", "2")
    assert doc["summary"]["failed"] == 0, doc
    built = {(r["arch"], r["variant"]) for r in doc["results"]}
    assert built == {(a, v) for a in ("gfx942", "gfx950") for v in ("narrow", "wide")}
    for entry in (store / "v1" / "entries").rglob("*.json"):
        inputs = json.loads(entry.read_text())["entry"]["build_inputs"]
        assert Version(inputs["flydsl"]["version"]) == oldest, entry
    if Version(version("flydsl")) != oldest:
        plan = build_tiny_as_a_user([sys.executable, "-m", "mono_aot"], store, "--dry-run")["plan"]
        assert plan and all(r["status"] == "stale" for r in plan), plan
        assert all("flydsl" in (r["reason"] or "").lower() for r in plan), plan
