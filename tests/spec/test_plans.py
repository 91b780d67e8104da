"""The kernel plans without FlyDSL (``mono_aot.spec.plans``): a spec file is accepted exactly
when every plan the kernels compile from accepts it, across CTA counts and both archs (the
slow builds of a sample: ``tests/kernels/test_cta_counts.py``)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from mono_aot.spec import plans
from mono_aot.spec.errors import LayoutError
from mono_aot.spec.layouts import load_layout, parse_layout, shipped_layout_dir

SHIPPED = shipped_layout_dir() / "minimax-m3-dspark-tp4.toml"
TOP = {"gfx942": 304, "gfx950": 256}
# the named products and a spread between 32 and the arch's CUs, plus below 32
COUNTS = {
    "gfx942": (304, 228, 200, 160, 120, 80, 64, 38, 34, 33, 32, 24, 8),
    "gfx950": (256, 200, 128, 100, 64, 33, 32, 16),
}


def _spec(tmp_path: Path, arch: str, ctas: int) -> Path:
    text = SHIPPED.read_text()
    other = "gfx950" if arch == "gfx942" else "gfx942"
    doc = tomllib.loads(text)
    del doc["targets"][other]
    doc["targets"][arch]["ctas"] = ctas
    lines = [ln for ln in text.split("# One persistent")[0].splitlines()]
    p = tmp_path / f"{arch}-{ctas}.toml"
    p.write_text("\n".join(lines) + f"\n[targets.{arch}]\nctas = {ctas}\n")
    assert tomllib.loads(p.read_text()) == doc
    return p


def _plans_accept(lay, arch: str) -> list[str]:
    """What the kernels' own plan objects refuse (the calls ``make_launcher`` makes)."""
    refused = []
    for variant in lay.variants():
        try:
            plans.projection_plans(lay, arch, variant)
            plans.AttnGeometry.build(lay, arch, variant)
            plans.lds_arena(lay, arch, variant)
        except plans.PlanError as e:
            refused.append(f"{variant}: {e}")
    return refused


@pytest.mark.parametrize("arch", sorted(COUNTS))
def test_validate_agrees_with_the_plans_at_every_count(tmp_path, arch):
    for ctas in COUNTS[arch]:
        path = _spec(tmp_path, arch, ctas)
        lay = parse_layout(tomllib.loads(path.read_text()), str(path), name=path.stem)
        refused = _plans_accept(lay, arch)
        try:
            load_layout(path)
            problems = []
        except LayoutError as e:
            problems = e.problems
        assert bool(problems) == bool(refused), (ctas, problems, refused)
        for line in problems:  # file: field: rule, with the numbers
            assert line.startswith(f"{path}: targets.{arch}.ctas: {ctas} workgroups, "), line
        # each refusing plan's own message is what validate prints
        for r in refused:
            variant, msg = r.split(": ", 1)
            assert any(f"{variant} kernel" in ln and msg in ln for ln in problems), (r, problems)


def test_supported_counts():
    """From 32 CTAs to the arch's CUs the narrow kernel builds at every count (row passes of
    at most 3 rows per wave); the wide kernel from 192 up, where one row pass holds a
    workgroup's rows: below that its multi-pass GEMM spills, and the plan refuses it."""
    base = tomllib.loads(SHIPPED.read_text())
    refused: dict[tuple[str, str], list[int]] = {}
    for arch, top in TOP.items():
        for ctas in range(32, top + 1):
            lay = parse_layout({**base, "targets": {arch: {"ctas": ctas}}}, "c", name="c")
            for field, rule in plans.kernel_problems(lay):
                assert field == f"targets.{arch}.ctas", (field, rule)
                variant = "wide" if ", wide kernel" in rule else "narrow"
                if ctas not in refused.get((arch, variant), []):
                    refused.setdefault((arch, variant), []).append(ctas)
    assert sorted(refused) == [("gfx942", "wide"), ("gfx950", "wide")]
    for arch in TOP:
        assert refused[(arch, "wide")] == list(range(32, 192))
    lay = parse_layout({**base, "targets": {"gfx942": {"ctas": 80}}}, "c", name="c")
    rules = dict((r.split(": ")[0], r) for _, r in plans.kernel_problems(lay))
    assert rules["80 workgroups, wide kernel, o"].endswith(
        "GemmPlan(6144x2048): 77 rows per workgroup = 5 tiles of 16 need 3 row passes (a "
        "16384-byte reduction round holds 2); the kernel builds at most 1 without spilling"
    )


def test_the_shipped_counts_keep_one_pass_and_their_split():
    """304/256 CTAs: one row pass everywhere (no weight row is loaded twice), the row split
    and LDS unchanged (7-8 qkv rows, 20-21 o/down rows, 10-11 gate/up pairs on gfx942)."""
    lay = load_layout(SHIPPED)
    for arch in TOP:
        for variant in lay.variants():
            for p in plans.projection_plans(lay, arch, variant).values():
                assert p.passes == 1, (arch, variant, p)
        a = plans.lds_arena(lay, arch, "narrow")
        assert a.total == 36352  # the code objects' LDS (README, "What the code objects say")
        assert plans.lds_arena(lay, arch, "wide").total == 24064
    p = plans.projection_plans(lay, "gfx942", "wide")
    assert [p[k].cta_rows(0)[1] for k in ("qkv", "o", "gu", "down")] == [7, 20, 10, 20]
    assert [p[k].rows_per_cta for k in ("qkv", "o", "gu", "down")] == [8, 21, 11, 21]


def test_row_passes_at_80_ctas():
    base = tomllib.loads(SHIPPED.read_text())
    lay = parse_layout({**base, "targets": {"gfx942": {"ctas": 80}}}, "x", name="x")
    narrow = plans.projection_plans(lay, "gfx942", "narrow")["o"]
    # 77 rows / 8 waves = 10 per wave: 4 passes of at most 3 (3 x 16 tokens <= the 64 lanes)
    assert (narrow.per_wave, narrow.passes, narrow.pass_per_wave) == (10, 4, 3)
    assert narrow.values_per_lane == 48
    # 77 rows = 5 tiles of 16; 16 KiB holds 8 waves x 2 tiles: 3 passes (allowed in emulation)
    wide = plans.GemmPlan(6144, 2048, 80, 64, max_passes=3)
    assert (wide.run_tiles, wide.seg_tiles, wide.passes, wide.lds_bytes) == (5, 2, 3, 16384)


def test_other_rules_name_their_spec_field(tmp_path):
    doc = tomllib.loads(SHIPPED.read_text())
    doc["model"]["head_dim"] = 64
    doc["model"]["rotary_dim"] = 32
    lay = parse_layout(doc, "x", name="x")
    got = dict(plans.kernel_problems(lay))
    assert "model.head_dim" in got and "serving.qpr" not in got
    doc = tomllib.loads(SHIPPED.read_text())
    doc["model"]["hidden"] = 6144 - 512  # 5632: not a multiple of the 1024-wide GEMV K tile
    got = dict(plans.kernel_problems(parse_layout(doc, "x", name="x")))
    assert "cols=5632 must be a multiple of the 1024-wide K tile" in got["model.hidden"]


def test_plans_import_without_flydsl():
    code = (
        "import sys; import mono_aot.spec.layouts as L, mono_aot.spec.plans;"
        "L.load_layout(L.shipped_layout_paths()[0]);"
        "assert not [m for m in sys.modules if m.startswith(('flydsl', 'torch'))], 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
