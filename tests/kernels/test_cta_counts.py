"""Row passes: the drafter kernels build at CTA counts other than the shipped ones and pass the
publish rules (no scratch, no spills, one workgroup per CU co-resident, the contract's
kernargs, the grid = the count). A sample of counts, both variants, both archs; each compile
in a fresh worker subprocess (slow: about 30 s a kernel)."""

from __future__ import annotations

import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mono_aot.compiler.checks import Expectation, check
from mono_aot.compiler.compile import compile_kernel
from mono_aot.kernels import KERNEL_NAMES
from mono_aot.keys import real_provider
from mono_aot.spec import abi, plans
from mono_aot.spec.layouts import parse_layout, shipped_layout_dir

pytestmark = pytest.mark.slow

# (arch, ctas, variant): MI300A's 228; narrow row passes at 80 and 38 (gfx942) and 32 (gfx950).
# The wide kernel is refused below 192 CTAs (mono_aot.spec.plans.GEMM_MAX_PASSES).
CASES = [
    ("gfx942", 228, "narrow"), ("gfx942", 228, "wide"), ("gfx942", 80, "narrow"),
    ("gfx942", 38, "narrow"), ("gfx950", 32, "narrow"),
]  # fmt: skip


def _layout(arch: str, ctas: int, variant: str):
    """The shipped geometry at ``ctas``; the plans accept its ``variant`` kernel (a spec file
    at a count below 192 is refused as a whole, for its wide kernel)."""
    doc = tomllib.loads((shipped_layout_dir() / "minimax-m3-dspark-tp4.toml").read_text())
    doc["targets"] = {arch: {"ctas": ctas}}
    lay = parse_layout(doc, "sample", name=f"sample-{arch}-{ctas}")
    assert plans.kernel_problems_for(lay, arch, variant) == []
    return lay


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("cta-counts")
    prov = real_provider()

    def one(case):
        arch, ctas, variant = case
        out = Path(root / f"{arch}-{ctas}-{variant}")
        return case, compile_kernel(prov, variant, _layout(arch, ctas, variant), arch, out)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, CASES))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_builds_and_passes_the_publish_rules(builds, case):
    arch, ctas, variant = case
    lay = _layout(arch, ctas, variant)
    r = builds[case]
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
