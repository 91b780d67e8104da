"""The sample CI workflow parses as YAML and does what the README says it does."""

from __future__ import annotations

from pathlib import Path

import yaml

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "packs.yml"


def test_the_sample_workflow_builds_both_packs_checks_coverage_and_uploads_the_wheels():
    doc = yaml.safe_load(WORKFLOW.read_text())
    (job,) = doc["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    steps = job["steps"]
    uses = [s["uses"].split("@")[0] for s in steps if "uses" in s]
    assert uses == ["actions/checkout", "actions/setup-python", "actions/upload-artifact"]
    assert steps[1]["with"]["python-version"] == "3.11"
    runs = [s["run"] for s in steps if "run" in s]
    assert runs[0] == "make setup"
    packs = [r for r in runs if " pack " in f" {r} "]
    assert [r.split("--arch ")[1].split()[0] for r in packs] == ["gfx942", "gfx950"]
    assert all("--out artifacts/dist" in r for r in packs)
    cov = runs.index(next(r for r in runs if "mono-aot coverage" in r))
    assert cov > max(runs.index(r) for r in packs)
    assert "--arch gfx942" in runs[cov] and "--arch gfx950" in runs[cov]
    upload = steps[-1]
    assert upload["uses"].startswith("actions/upload-artifact@")
    assert upload["with"]["path"] == "artifacts/dist/*.whl"
