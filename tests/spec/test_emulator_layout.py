"""The emulator's small test layout (``layouts/test/emulator-tiny-tp4.toml``): it is buildable,
resolvable by name, invisible to every "all shipped layouts" default, and each claim its
comments make about which code paths it exercises and why it cannot be smaller holds in the
plans the kernels compile from (``mono_aot.spec.plans``)."""

from __future__ import annotations

import tomllib

import pytest

from mono_aot.selftest.cases import CONTEXTS
from mono_aot.spec.layouts import (
    layout_paths_for_tests,
    load_layout,
    parse_layout,
    resolve_layout,
    shipped_layout_paths,
    shipped_layouts,
)
from mono_aot.spec.plans import GemmPlan, GemvPlan, kernel_problems, projection_plans

NAME = "emulator-tiny-tp4"


def _doc() -> dict:
    (path,) = [p for p in layout_paths_for_tests() if p.stem == NAME]
    return tomllib.loads(path.read_text())


def _with(**changes) -> list[tuple[str, str]]:
    """kernel_problems of the test layout with ``section__field=value`` changes."""
    doc = _doc()
    for k, v in changes.items():
        section, _, field = k.partition("__")
        if section == "targets":
            doc["targets"][field]["ctas"] = v
        else:
            doc[section][field] = v
    return list(kernel_problems(parse_layout(doc, "probe", name="probe")))


def test_it_loads_by_name_and_no_default_selects_it():
    paths = {p.stem: p for p in layout_paths_for_tests()}
    assert sorted(paths) == [NAME, "inferred-qpr8-fp8row-tp4"]
    lay = resolve_layout(NAME)
    assert lay == load_layout(paths[NAME]) and lay.name == NAME
    assert NAME not in [p.stem for p in shipped_layout_paths()]
    assert NAME not in [x.name for x in shipped_layouts()]


def test_unknown_name_lists_shipped_and_test_layouts():
    with pytest.raises(Exception, match=f"shipped: minimax-m3.1-dspark-tp4; for tests: {NAME}"):
        resolve_layout("nope")


def test_it_runs_the_paths_the_shipped_layout_runs():
    lay = resolve_layout(NAME)
    assert lay.parallel.tp == 4 and lay.archs == ("gfx942", "gfx950")
    assert lay.variants() == ("narrow", "wide")
    assert lay.model.layers >= 2  # the layer loop and the all-reduce's layer parity
    assert lay.model.rotary_dim < lay.model.head_dim  # rotated and unrotated dims
    # a window that bites some of the selftest's contexts and not others
    assert min(c for c in CONTEXTS if c) < lay.model.window < max(CONTEXTS)
    assert lay.variant_reqs("narrow") == (1, 1) and lay.variant_reqs("wide") == (2, 5)
    for arch in lay.archs:
        gemv = projection_plans(lay, arch, "narrow")
        assert all(isinstance(p, GemvPlan) for p in gemv.values())
        # the GEMV's K loop runs more than once in qkv and gate/up; row passes loop too
        assert gemv["qkv"].tiles == gemv["gu"].tiles == 2
        assert min(p.passes for p in gemv.values()) > 1
        wide = projection_plans(lay, arch, "wide")
        assert all(isinstance(p, GemmPlan) for p in wide.values())
        # the wide GEMM picks among 3 token-tile versions at run time, the last one partial
        p = wide["qkv"]
        assert (p.min_token_tiles, p.token_tiles) == (1, 3)
        assert lay.variant_tokens("wide") % 16
    # gfx942 splits rows unevenly over its workgroups, gfx950 evenly
    assert lay.model.hidden % lay.ctas("gfx942") and not lay.model.hidden % lay.ctas("gfx950")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"kernel__threads": 128}, "serving.qpr"),  # 2 waves cannot hold 64 query rows
        ({"model__hidden": 1024 + 512}, "model.hidden"),  # not whole 1024-wide GEMV K tiles
        ({"model__mlp": 2048}, "model.mlp"),  # 512 per rank: under one K tile of down
        ({"model__rotary_dim": 4}, "model.rotary_dim"),  # half of it not a multiple of 4
    ],
)
def test_a_smaller_geometry_is_refused(change, field):
    """Why it is not smaller: each shrink is refused by the plans, naming the field."""
    assert not _with()
    problems = _with(**change)
    assert problems and problems[0][0] == field, problems
