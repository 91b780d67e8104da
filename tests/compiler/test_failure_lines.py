"""A compile that the kernels refuse is reported as one line naming layout, arch, variant and
the rule with its numbers; the worker's whole stderr stays in the job's JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mono_aot.spec.layouts import shipped_layout_dir

from .conftest import run_cli

pytestmark = pytest.mark.slow  # real process clusters or compiles


def _layout(tmp_path: Path, ctas: int) -> Path:
    text = (shipped_layout_dir() / "minimax-m3-dspark-tp4.toml").read_text()
    text = text.replace("ctas = 304", f"ctas = {ctas}")
    path = tmp_path / f"mi-{ctas}.toml"
    path.write_text(text)
    return path


def test_a_refused_plan_is_one_line_with_its_numbers(tmp_path):
    lay = _layout(tmp_path, 80)
    store = tmp_path / "store"
    args = ("build", "--store", str(store), "--layout", str(lay), "--arch", "gfx942")
    env = {"MONO_AOT_CACHE_DIR": str(tmp_path / "cache")}
    p = run_cli(*args, env_extra=env)
    assert p.returncode == 1, p.stderr
    failed = [ln for ln in p.stdout.splitlines() if ln.startswith("failed")]
    assert len(failed) == 2, p.stdout
    narrow = next(ln for ln in failed if "mi-80/gfx942/narrow" in ln)
    wide = next(ln for ln in failed if "mi-80/gfx942/wide" in ln)
    assert "GemvPlan(6144x2048): 10 rows per wave x 16 tokens exceed the 64 lanes" in narrow
    assert "lds_budget=16384 is below one reduction round (40960 bytes)" in wide
    for ln in failed:
        assert "File " not in ln and "line " not in ln and "raise " not in ln, ln
    assert "Traceback" not in p.stdout + p.stderr
    p = run_cli(*args, "--json", env_extra=env)
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    for r in doc["results"]:
        assert r["status"] == "failed" and "\n" not in r["reason"]
        assert r["stderr"] and "Plan(" in r["stderr"]  # the worker's own stderr, whole
