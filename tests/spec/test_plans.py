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

SHIPPED = shipped_layout_dir() / "minimax-m3.1-dspark-tp4.toml"
INFERRED = shipped_layout_dir() / "test" / "inferred-qpr8-fp8row-tp4.toml"
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
    """From 32 CTAs to the arch's CUs both kernels build at every count: the narrow GEMV in
    row passes of at most 2 mxfp8 rows per wave, the wide GEMM in row passes of what one
    reduction round holds; below 32 the all-reduce tile outgrows the LDS (gfx942 from 24 down,
    the wide kernel's 56 tokens), and the refusal names the count and the bytes."""
    base = tomllib.loads(SHIPPED.read_text())
    for arch, top in TOP.items():
        for ctas in range(32, top + 1):
            lay = parse_layout({**base, "targets": {arch: {"ctas": ctas}}}, "c", name="c")
            assert list(plans.kernel_problems(lay)) == [], (arch, ctas)
    lay = parse_layout({**base, "targets": {"gfx942": {"ctas": 24}}}, "c", name="c")
    [(field, rule)] = plans.kernel_problems(lay)
    assert field == "targets.gfx942.ctas"
    assert rule.startswith(
        "24 workgroups, wide kernel: 75264 bytes of LDS exceed the CU's 65536: GEMV/attention "
        "17408 + rstd 256 + all-reduce tile 56 tokens x 256 rows x 4 = 57344"
    ), rule


def _live_together(a: plans.LdsArena, proj: dict, attn_bytes: int, tile_bytes: int) -> list[str]:
    """Every pair of LDS regions that one phase of the kernel uses at once and that overlap,
    as [start, end) byte ranges (kernels.drafter: qkv and gu emit through rstd, o and down
    into the all-reduce tile; attention uses its staging alone; sync words and table always)."""
    rstd = (a.off_rstd, a.off_rstd + 4 * 64)
    tile = (a.off_tile, a.off_tile + tile_bytes)
    phases = {
        "qkv": [(0, proj["qkv"].lds_bytes), rstd],
        "gu": [(0, proj["gu"].lds_bytes), rstd],
        "o": [(0, proj["o"].lds_bytes), tile],
        "down": [(0, proj["down"].lds_bytes), tile],
        "attention": [(0, attn_bytes)],
    }
    bad = []
    for name, regions in phases.items():
        regions = regions + [(a.words * 4, a.total)]  # sync words and table
        assert all(end <= a.total <= a.limit for _, end in regions), (name, regions, a)
        for i, (s0, e0) in enumerate(regions):
            for s1, e1 in regions[i + 1 :]:
                if s0 < e1 and s1 < e0:
                    bad.append(f"{name}: [{s0}, {e0}) and [{s1}, {e1})")
    return bad


@pytest.mark.parametrize(
    ("spec", "arch", "overlaid_at"),
    [(SHIPPED, "gfx942", []), (SHIPPED, "gfx950", []), (INFERRED, "gfx942", [32, 33]),
     (INFERRED, "gfx950", [])],
    ids=["real-gfx942", "real-gfx950", "inferred-gfx942", "inferred-gfx950"],
)  # fmt: skip
def test_the_arena_never_overlaps_what_a_phase_uses_at_once(spec, arch, overlaid_at):
    """At every count from 32 to the CUs: the regions one phase uses are disjoint and inside
    the CU's LDS. The real model's 56-token tile never needs the overlaid arena; the inferred
    layout's 64 tokens do on gfx942 at 32 and 33 (the separate arena is 67072 bytes), which
    moves rstd and the tile down over attention's staging, and o and down get the reduction
    budget the tile leaves (one row tile per pass: 12 passes, same weight bytes)."""
    base = tomllib.loads(spec.read_text())
    overlaid = []
    for ctas in range(32, TOP[arch] + 1):
        lay = parse_layout({**base, "targets": {arch: {"ctas": ctas}}}, "c", name="c")
        a = plans.lds_arena(lay, arch, "wide")
        proj = plans.projection_plans(lay, arch, "wide")
        attn = plans.AttnGeometry.build(lay, arch, "wide")
        tile_bytes = lay.variant_tokens("wide") * plans.abi.mbox_rows(lay) * 4
        assert a.off_tile + tile_bytes <= a.arena
        assert _live_together(a, proj, attn.lds_bytes, tile_bytes) == [], (ctas, a)
        if a.overlaid:
            overlaid.append(ctas)
            assert {k: p.lds_budget for k, p in proj.items()} == {
                "qkv": 16384, "o": 8192, "gu": 16384, "down": 8192}  # fmt: skip
            assert (proj["o"].passes, proj["down"].passes, a.total) == (12, 12, 57600)
        else:
            assert {p.lds_budget for p in proj.values()} == {plans.DEFAULT_LDS_BUDGET}
        # every weight row (pair) is loaded in exactly one pass of its workgroup
        for p in proj.values():
            assert p.passes * p.seg_tiles >= p.run_tiles > (p.passes - 1) * p.seg_tiles
    assert overlaid == overlaid_at


def test_the_shipped_counts_read_each_weight_row_once_and_keep_their_split():
    """304/256 CTAs: the wide GEMM in one row pass everywhere; the narrow GEMV's qkv too and
    its o, gu and down rows (3 a wave) in two passes of their own rows (mxfp8 holds 2 a pass:
    GEMV_MAX_PASS_ROWS_MX), so no weight row is loaded twice. The row split: 7-8 qkv rows,
    20-21 o/down rows, 10-11 gate/up pairs on gfx942; the LDS of the code objects."""
    lay = load_layout(SHIPPED)
    for arch in TOP:
        for variant in lay.variants():
            for name, p in plans.projection_plans(lay, arch, variant).items():
                one = variant == "wide" or name == "qkv"
                assert p.passes == (1 if one else 2), (arch, variant, p)
                if variant == "narrow":  # every row in one pass of its own
                    assert p.per_wave <= p.passes * p.pass_per_wave
        assert not plans.lds_arena(lay, arch, "wide").overlaid
        assert plans.lds_arena(lay, arch, "wide").total == 23296
    assert plans.lds_arena(lay, "gfx942", "narrow").total == 31808
    assert plans.lds_arena(lay, "gfx950", "narrow").total == 32064
    p = plans.projection_plans(lay, "gfx942", "wide")
    assert [p[k].cta_rows(0)[1] for k in ("qkv", "o", "gu", "down")] == [7, 20, 10, 20]
    assert [p[k].rows_per_cta for k in ("qkv", "o", "gu", "down")] == [8, 21, 11, 21]


def test_row_passes_at_80_ctas():
    base = tomllib.loads(SHIPPED.read_text())
    lay = parse_layout({**base, "targets": {"gfx942": {"ctas": 80}}}, "x", name="x")
    narrow = plans.projection_plans(lay, "gfx942", "narrow")["o"]
    # 77 rows / 8 waves = 10 per wave: 5 passes of at most 2 mxfp8 rows
    assert (narrow.per_wave, narrow.passes, narrow.pass_per_wave) == (10, 5, 2)
    assert narrow.values_per_lane == 28  # 2 rows x 14 tokens
    # 77 rows = 5 tiles of 16; 16 KiB holds 8 waves x 2 tiles: 3 passes
    wide = plans.projection_plans(lay, "gfx942", "wide")["o"]
    assert (wide.run_tiles, wide.seg_tiles, wide.passes, wide.lds_bytes) == (5, 2, 3, 16384)
    inferred = parse_layout(
        {**tomllib.loads(INFERRED.read_text()), "targets": {"gfx942": {"ctas": 80}}}, "y", name="y"
    )
    row = plans.projection_plans(inferred, "gfx942", "narrow")["o"]
    # fp8-row: 4 passes of at most 3 (3 x 16 tokens <= the 64 lanes)
    assert (row.per_wave, row.passes, row.pass_per_wave, row.values_per_lane) == (10, 4, 3, 48)


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
