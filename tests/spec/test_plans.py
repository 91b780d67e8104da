"""The kernel plans without FlyDSL (``mono_aot.spec.plans``): a spec file is accepted exactly
when every plan the kernels compile from accepts it, across CTA counts and both archs."""

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
    """Every count from 32 to the arch's CUs builds, except gfx942's wide kernel at 32 and 33
    CTAs: its all-reduce tile (64 tokens x 192 rows x 4 B) plus the GEMV/attention arena
    exceed the 64 KiB LDS. Below 32 CTAs the LDS refuses too (gfx942) or nothing does."""
    base = tomllib.loads(SHIPPED.read_text())
    refused = {}
    for arch, top in TOP.items():
        for ctas in range(8, top + 1):
            doc = {**base, "targets": {arch: {"ctas": ctas}}}
            lay = parse_layout(doc, "counts", name="counts")
            if list(plans.kernel_problems(lay)):
                refused.setdefault(arch, []).append(ctas)
    assert [c for c in refused["gfx942"] if c >= 32] == [32, 33]
    assert all(c < 32 for c in refused.get("gfx950", []))
    # the reason at 32 is the LDS, with its numbers
    lay = parse_layout({**base, "targets": {"gfx942": {"ctas": 32}}}, "counts", name="counts")
    [(field, rule)] = list(plans.kernel_problems(lay))
    assert field == "targets.gfx942.ctas"
    assert rule == (
        "32 workgroups, wide kernel: 67072 bytes of LDS exceed the CU's 65536: GEMV/attention "
        "17408 + rstd 256 + all-reduce tile 64 tokens x 192 rows x 4 = 49152 + sync and table 256"
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
    # 77 rows / 8 waves = 10 per wave: 3 passes of 4 (4 x 16 tokens = the 64 lanes)
    assert (narrow.per_wave, narrow.passes, narrow.pass_per_wave) == (10, 3, 4)
    assert narrow.values_per_lane <= 64
    wide = plans.projection_plans(lay, "gfx942", "wide")["o"]
    # 77 rows = 5 tiles of 16; 16 KiB holds 8 waves x 2 tiles: 3 passes
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
