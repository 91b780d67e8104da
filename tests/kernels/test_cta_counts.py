"""Row passes: the drafter kernels build at CTA counts other than the shipped ones and pass the
publish rules (no scratch, no spills, one workgroup per CU co-resident, the contract's
kernargs, the grid = the count). A sample of counts, both variants, both archs; each compile
in a fresh worker subprocess (slow: about a minute a kernel).

The sample: gfx942 at 304 (MI300X), 228 (MI300A), 80 (MI308X), 38 (CPX partition) and 32
(the overlaid LDS arena), gfx950 at 256 (MI355X), 128 and 32. Narrow is compiled only where
no wide compile of the same count covers the plans' narrow side (228 both; 80, 38 on gfx942
and 32 on gfx950 narrow too, from when wide was refused there); 304/256 come from the
session's shipped compiles (tests/conftest.py), whose resources are pinned to the README's
table, so the row passes cannot cost the shipped kernels anything."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mono_aot.compiler.checks import Expectation, check
from mono_aot.compiler.compile import compile_kernel
from mono_aot.kernels import KERNEL_NAMES
from mono_aot.keys import real_provider
from mono_aot.spec import abi, plans
from mono_aot.spec.layouts import load_layout, parse_layout, shipped_layout_dir

pytestmark = pytest.mark.slow

SHIPPED = {("gfx942", 304), ("gfx950", 256)}
# (arch, ctas, variant) compiled here; the shipped counts' wide kernels come from conftest
CASES = [
    ("gfx942", 228, "narrow"), ("gfx942", 228, "wide"), ("gfx942", 80, "narrow"),
    ("gfx942", 80, "wide"), ("gfx942", 38, "narrow"), ("gfx942", 38, "wide"),
    ("gfx942", 32, "wide"), ("gfx950", 128, "wide"), ("gfx950", 32, "narrow"),
    ("gfx950", 32, "wide"),
]  # fmt: skip
WIDE_SAMPLE = [("gfx942", 304), ("gfx950", 256)] + [(a, c) for a, c, v in CASES if v == "wide"]
# The shipped wide kernels' resources (README, "The real model"): VGPR, AGPR, SGPR, LDS. The
# shipped code objects must stay at or below every one.
SHIPPED_WIDE = {"gfx942": (250, 0, 104, 23296), "gfx950": (253, 0, 101, 23296)}


def _doc(arch: str, ctas: int) -> dict:
    doc = tomllib.loads((shipped_layout_dir() / "minimax-m3.1-dspark-tp4.toml").read_text())
    doc["targets"] = {arch: {"ctas": ctas}}
    return doc


def _layout(arch: str, ctas: int, variant: str):
    """The shipped geometry at ``ctas``; the plans accept its ``variant`` kernel."""
    lay = parse_layout(_doc(arch, ctas), "sample", name=f"sample-{arch}-{ctas}")
    assert plans.kernel_problems_for(lay, arch, variant) == []
    return lay


@pytest.fixture(scope="module")
def builds(tmp_path_factory, shipped_compiles):
    root = tmp_path_factory.mktemp("cta-counts")
    prov = real_provider()

    def one(case):
        arch, ctas, variant = case
        out = Path(root / f"{arch}-{ctas}-{variant}")
        return case, compile_kernel(prov, variant, _layout(arch, ctas, variant), arch, out)

    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(pool.map(one, CASES))
    for arch, ctas in SHIPPED:
        done[(arch, ctas, "wide")] = shipped_compiles[("wide", arch)]
    return done


def _check(r, lay, arch: str, ctas: int, variant: str):
    exp = Expectation(
        kernel=KERNEL_NAMES[variant] + "_0",
        arch=arch,
        ctas=ctas,
        threads=lay.kernel.threads,
        kernargs=tuple(abi.kernarg_layout(lay.parallel.tp)),
    )
    bad = check(exp, r.code_object, r.metadata, r.stderr, r.worker["launches"])
    assert not bad, "\n".join(map(str, bad))
    [k] = r.metadata.kernels
    assert (k.scratch, k.vgpr_spill, k.sgpr_spill) == (0, 0, 0)
    # the code object's LDS is the plan's arena (mono_aot.spec.plans.lds_arena)
    assert k.lds == plans.lds_arena(lay, arch, variant).total
    print(f"{arch} {ctas} {variant}: vgpr {k.vgpr} agpr {k.agpr} sgpr {k.sgpr} lds {k.lds} "
          f"text {r.metadata.text_bytes}")  # fmt: skip
    return k


@pytest.mark.parametrize(
    "case",
    CASES + [(a, c, "wide") for a, c in sorted(SHIPPED)],
    ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}",
)
def test_builds_and_passes_the_publish_rules(builds, case):
    arch, ctas, variant = case
    lay = _layout(arch, ctas, variant)
    k = _check(builds[case], lay, arch, ctas, variant)
    proj = plans.projection_plans(lay, arch, variant)
    if (arch, ctas) in SHIPPED:
        # one row pass, the same split and LDS: the weight traffic and the resources of the
        # shipped kernel are what they were, or better
        assert {p.passes for p in proj.values()} == {1}
        got = (k.vgpr, k.agpr, k.sgpr, k.lds)
        assert all(g <= w for g, w in zip(got, SHIPPED_WIDE[arch], strict=True)), got
    elif variant == "wide" and ctas < 192:
        assert max(p.passes for p in proj.values()) > 1  # the multi-pass GEMM is what built


def _spec_file(tmp_path: Path, arch: str, ctas: int) -> Path:
    doc = _doc(arch, ctas)
    lines = [f"description = {doc['description']!r}".replace("'", '"')]
    for section in ("model", "weights", "parallel", "serving", "kernel"):
        lines.append(f"[{section}]")
        lines += [f"{key} = {json.dumps(val)}" for key, val in doc[section].items()]
    lines += [f"[targets.{arch}]", f"ctas = {ctas}"]
    path = tmp_path / f"{arch}-{ctas}.toml"
    path.write_text("\n".join(lines) + "\n")
    assert tomllib.loads(path.read_text()) == doc
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mono_aot", *args],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_validate_and_build_agree_across_the_sample(builds, tmp_path):
    """On spec files generated for every sampled count, and for two gfx942 counts below the
    floor (24 and 20: the all-reduce tile outgrows 64 KiB of LDS): ``layouts validate``
    accepts a file exactly when ``build`` accepts it, refusals are the same
    ``file: targets.ARCH.ctas: rule`` lines from both, and every accepted count's wide
    kernel compiled clean above with the LDS its plan says."""
    refused = [("gfx942", 24), ("gfx942", 20)]
    files = {case: _spec_file(tmp_path, *case) for case in WIDE_SAMPLE + refused}
    v = _cli("layouts", "validate", "--json", *map(str, files.values()))
    assert v.returncode == 2, v.stderr  # the two refused files
    verdicts = {Path(d["path"]): d for d in json.loads(v.stdout)}
    for (arch, ctas), path in files.items():
        b = _cli("build", "--dry-run", "--variant", "wide", "--store", str(tmp_path / "st"),
                 "--layout", str(path))  # fmt: skip
        ok = verdicts[path]["ok"]
        assert ok == (b.returncode == 0) == ((arch, ctas) not in refused), (path, b.stderr)
        if not ok:
            lines = verdicts[path]["problems"]
            assert [f"mono-aot: {ln}" for ln in lines] == b.stderr.splitlines(), b.stderr
            assert any(
                ln.startswith(f"{path}: targets.{arch}.ctas: {ctas} workgroups, wide kernel: ")
                and "bytes of LDS exceed the CU's 65536" in ln
                for ln in lines
            ), lines
            continue
        lay = load_layout(path)
        r = builds[(arch, ctas, "wide")]
        _check(r, lay, arch, ctas, "wide")
