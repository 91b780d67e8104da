"""``mono-aot bench``: the quick run's JSON has every field with sane values; ratios are the
quotients of their figures. No test here asserts a speed (this machine is shared and noisy)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mono_aot.bench import report, run

ROOT = Path(__file__).resolve().parents[2]
ARCHS = ("gfx942", "gfx950")
PER_ARCH = (
    "jit_cold",
    "jit_cold_process",
    "flydsl_warm",
    "flydsl_warm_process",
    "mono_serve",
    "mono_imports",
    "mono_bind",
    "mono_bind_repeat",
    "mono_bind_process",
)
GLOBAL = (
    "interpreter_start",
    "build_cold_j1",
    "build_cold_jN",
    "build_noop",
    "build_noop_digest_cold",
    "torch_import",
    "import_mono_aot_runtime",
    "import_flydsl",
    "import_flydsl_compiler",
)
# per arch and kernel variant (the shipped layout has both): one call of a warm process
PER_CALL = ("flydsl_call_first", "flydsl_call_repeat", "mono_launch")
VARIANTS = ("narrow", "wide")
FIGURES = (
    {f"{k}/{a}" for k in PER_ARCH for a in ARCHS}
    | {f"{k}/{a}/{v}" for k in PER_CALL for a in ARCHS for v in VARIANTS}
    | set(GLOBAL)
)
# what --quick may skip, and nothing else
QUICK_SKIPS = (
    {f"{k}/gfx950" for k in PER_ARCH}
    | {f"{k}/gfx950/{v}" for k in PER_CALL for v in VARIANTS}
    | {"build_cold_j1", "build_cold_jN"}
)
# the figures measured again for each --flydsl-python
PER_FLYDSL = ("jit_cold", "jit_cold_process", "flydsl_warm", "flydsl_warm_process")


def other_flydsl(figures: set[str], version: str) -> set[str]:
    """The names of the figures of a --flydsl-python whose FlyDSL is ``version``."""
    out = set()
    for name in figures:
        base, _, rest = name.partition("/")
        if base in PER_FLYDSL or base in PER_CALL[:2]:
            out.add(f"{base}@{version}/{rest}")
    return out


def _sane_stats(s: dict) -> None:
    assert set(s) == {"median", "min", "max"}
    assert 0 < s["min"] <= s["median"] <= s["max"], s
    assert all(math.isfinite(v) for v in s.values())


def check_document(doc: dict, *, quick: bool, other_flydsl_versions: tuple[str, ...] = ()) -> None:
    """Every field of the schema is present; measured values are sane; skipped ones are an
    explicit null with a reason."""
    assert doc["schema"] == run.SCHEMA
    assert doc["mode"] == ("quick" if quick else "full")
    assert doc["machine"]["cores"] >= 1
    assert doc["hip"] in (run.STAND_IN, "none (up to the driver call)")
    figs = doc["figures"]
    want, skips = set(FIGURES), set(QUICK_SKIPS)
    for version in other_flydsl_versions:
        want |= other_flydsl(FIGURES, version)
        skips |= other_flydsl(QUICK_SKIPS, version)
    assert set(figs) == want
    assert set(doc["figure_order"]) == want
    for name, f in figs.items():
        assert f["label"] and f["unit"] == "s"
        if f["skipped"] is not None:
            assert quick and name in skips, f"{name} skipped: {f['skipped']}"
            assert "--quick" in f["skipped"]
            assert f["wall"] is None and f["cpu"] is None and f["runs"] == 0
            continue
        assert f["runs"] >= 1, name
        _sane_stats(f["wall"])
        if f["cpu"] is not None:
            _sane_stats(f["cpu"])
    if quick:
        assert {n for n, f in figs.items() if f["skipped"]} == skips
    for name, r in doc["ratios"].items():
        num, den = figs[r["numerator"]], figs[r["denominator"]]
        if num["skipped"] or den["skipped"]:
            assert r["value"] is None and r["skipped"], name
            continue
        want = num[r["basis"]]["median"] / den[r["basis"]]["median"]
        assert r["value"] > 0 and math.isclose(r["value"], want, rel_tol=1e-12), name
    assert len(doc["targets"]) == 2 * len(ARCHS) + 2
    for t in doc["targets"]:
        if t["value"] is None:
            assert t["met"] is None and t["skipped"]
        else:
            assert isinstance(t["met"], bool)
            le = "10x" not in t["target"]
            assert t["met"] == (t["value"] <= t["limit"] if le else t["value"] >= t["limit"])
    s = doc["sizes"]
    for k in ("mono_aot_wheel", "serving_install"):
        assert (s[k] or 0) > 0 or s["skipped"].get(k), k
    assert s["runtime_deps"]["total"] > 0
    assert set(s["pack_wheels"]) == set(ARCHS)
    for a, n in s["pack_wheels"].items():
        assert (n or 0) > 0 or s["skipped"].get(f"pack_wheel/{a}"), a
    assert doc["not_measured"] and all(nm["why"] for nm in doc["not_measured"])


@pytest.mark.slow
def test_quick_json_has_every_field_with_sane_values(tmp_path):
    """The quick run, as a user runs it (MONO_AOT_TEST_STORE: a store to bind from, built into
    first when anything is missing; otherwise the bench builds its own), with this interpreter
    given again as a --flydsl-python: its figures come a second time, named by its version."""
    from importlib.metadata import version

    env = dict(os.environ)
    cmd = [sys.executable, "-m", "mono_aot", "bench", "--quick", "--json"]
    cmd += ["--flydsl-python", sys.executable]
    if os.environ.get("MONO_AOT_TEST_STORE"):
        cmd += ["--store", os.environ["MONO_AOT_TEST_STORE"]]
    env["MONO_AOT_CACHE_DIR"] = str(tmp_path / "user-cache")
    p = subprocess.run(
        cmd, capture_output=True, text=True, timeout=1800, env=env, stdin=subprocess.DEVNULL
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    check_document(doc, quick=True, other_flydsl_versions=(version("flydsl"),))
    assert not (tmp_path / "user-cache").exists()  # the bench keeps to its own temp dir
    text = report.render(doc)
    assert "skipped in --quick" in text and "not measured" in text
    for nm in doc["not_measured"]:
        assert nm["what"] in text


def _fig(median: float, skipped: str | None = None) -> dict:
    if skipped:
        return {"skipped": skipped, "wall": None, "cpu": None}
    s = {"median": median, "min": median, "max": median}
    return {"skipped": None, "wall": s, "cpu": dict(s)}


def test_ratios_are_quotients_and_null_when_a_figure_is_skipped():
    figs = {name: _fig(0.5) for name in FIGURES}
    figs["jit_cold/gfx942"] = _fig(20.0)
    figs["mono_serve/gfx942"] = _fig(0.125)
    figs["build_cold_j1"] = _fig(0, skipped="skipped in --quick")
    r = run.ratios(figs)
    assert r["jit_cold_over_mono_serve/gfx942"]["value"] == 20.0 / 0.125
    assert r["build_j1_over_jN"]["value"] is None and r["build_j1_over_jN"]["skipped"]
    t = {x["name"]: x for x in run.targets(figs, r)}
    assert t["bind_cpu/gfx942"]["met"] is False  # 0.5 s > 2 ms
    assert math.isclose(t["noop_rebuild"]["value"], 0.0) and t["noop_rebuild"]["met"]


def test_the_command_is_registered_and_bad_input_exits_2():
    from mono_aot.cli import COMMANDS

    assert COMMANDS["bench"] == "mono_aot.cli.bench:bench"
    p = subprocess.run(
        [sys.executable, "-m", "mono_aot", "bench", "--layout", "no-such-layout"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("mono-aot: ") and "Traceback" not in p.stderr
    h = subprocess.run(
        [sys.executable, "-m", "mono_aot", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert h.returncode == 0 and "--quick" in h.stdout and "--json" in h.stdout
