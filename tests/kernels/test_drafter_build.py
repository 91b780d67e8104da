"""The drafter megakernels compile for gfx942 and gfx950 from the shipped layout, and the code
objects have what the design needs (metadata note and ISA).

Each (variant, arch) is compiled once per test session, in a fresh ``mono_aot.compiler`` worker
subprocess, which returns the code object and FlyDSL's ISA dump of that same compile. The
compiles run two at a time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from mono_aot.compiler.checks import Expectation, check
from mono_aot.compiler.compile import CompileResult
from mono_aot.kernels import KERNEL_NAMES
from mono_aot.spec import abi
from mono_aot.spec.arch import arch_info
from mono_aot.spec.layouts import resolve_layout

LAYOUT = "minimax-m3.1-dspark-tp4"
ARCHS = ("gfx942", "gfx950")
VARIANTS = ("narrow", "wide")
CASES = [(v, a) for a in ARCHS for v in VARIANTS]

pytestmark = pytest.mark.slow


@dataclass
class Built:
    compiled: CompileResult
    isa: str


@pytest.fixture(scope="session")
def drafter_builds(shipped_compiles) -> dict[tuple[str, str], Built]:
    return {case: Built(shipped_compiles[case], shipped_compiles[case].isa) for case in CASES}


def _kernel(b: Built):
    [k] = b.compiled.metadata.kernels
    return k


def _instructions(isa: str) -> list[str]:
    """The instruction lines of the ISA text (labels kept, comments and directives dropped)."""
    out = []
    for line in isa.splitlines():
        s = line.split(";", 1)[0].strip()
        if not s or (s.startswith(".") and not s.startswith(".LBB")):
            continue
        out.append(s)
    return out


def _loops(lines: list[str]) -> list[list[str]]:
    """Bodies of the backward branches: from a label to a branch back to it."""
    where = {ln[:-1]: i for i, ln in enumerate(lines) if ln.endswith(":")}
    bodies = []
    for i, ln in enumerate(lines):
        m = re.match(r"s_(?:c?branch\w*)\s+(\.LBB\w+)", ln)
        if m and m.group(1) in where and where[m.group(1)] < i:
            bodies.append(lines[where[m.group(1)] : i + 1])
    return bodies


@pytest.mark.parametrize(("variant", "arch"), CASES)
def test_compiles_clean(drafter_builds, variant, arch):
    """The compiler wrote nothing containing "error:" (e.g. a lost libcall) in either compile."""
    b = drafter_builds[(variant, arch)]
    for what, text in (("compile", b.compiled.stderr), ("isa", b.isa)):
        bad = [ln for ln in text.splitlines() if "error:" in ln]
        assert not bad, f"{variant}/{arch} {what}: {bad[:3]}"
    assert b.compiled.worker["chip"] == arch


@pytest.mark.parametrize(("variant", "arch"), CASES)
def test_passes_the_build_rules(drafter_builds, variant, arch):
    """The build's own publish rules: kernel name, ELF flags, kernargs, launch, scratch, spills,
    co-residency."""
    lay = resolve_layout(LAYOUT)
    b = drafter_builds[(variant, arch)]
    exp = Expectation(
        kernel=KERNEL_NAMES[variant] + "_0",
        arch=arch,
        ctas=lay.ctas(arch),
        threads=lay.kernel.threads,
        kernargs=tuple(abi.kernarg_layout(lay.parallel.tp)),
    )
    bad = check(
        exp,
        b.compiled.code_object,
        b.compiled.metadata,
        b.compiled.stderr,
        b.compiled.worker["launches"],
    )
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.parametrize(("variant", "arch"), CASES)
def test_metadata(drafter_builds, variant, arch):
    """0 scratch, 0 spills, the contract's kernargs exactly, registers and LDS for one
    512-thread workgroup per CU, a plausible code size."""
    lay = resolve_layout(LAYOUT)
    info = arch_info(arch)
    b = drafter_builds[(variant, arch)]
    k = _kernel(b)
    assert k.scratch == 0
    assert (k.vgpr_spill, k.sgpr_spill) == (0, 0)
    contract = abi.kernarg_layout(lay.parallel.tp)
    assert [(a.offset, a.size, a.value_kind) for a in k.args] == [
        (o, s, "by_value") for _, o, s in contract
    ]
    assert k.kernarg_segment_size == contract[-1][1] + contract[-1][2] == 212
    # 8 waves on 4 SIMDs: 2 per SIMD, so at most 256 VGPRs + AGPRs per lane
    waves_per_simd = lay.kernel.threads // info.wavefront_size // info.simds_per_cu
    assert k.vgpr <= info.vgprs_per_simd // waves_per_simd == 256
    assert k.agpr <= k.vgpr
    limit = {"gfx942": 64 * 1024, "gfx950": 160 * 1024}[arch]
    assert 0 < k.lds <= limit
    assert k.max_flat_workgroup_size == lay.kernel.threads
    # a whole 5-layer step: tens of KiB of code; far more would mean a blown-up unroll
    text = b.compiled.metadata.text_bytes
    assert 32 * 1024 <= text <= 4 * 1024 * 1024, text
    launches = b.compiled.worker["launches"]
    assert [(la["grid"], la["block"], la["dynamic_lds"]) for la in launches] == [
        ([lay.ctas(arch), 1, 1], [lay.kernel.threads, 1, 1], 0)
    ]


@pytest.mark.parametrize(("variant", "arch"), CASES)
def test_isa_has_what_the_design_relies_on(drafter_builds, variant, arch):
    b = drafter_builds[(variant, arch)]
    lines = _instructions(b.isa)
    assert len(lines) > 1000
    # every sleeping wait loop reads the 100 MHz clock: all waits are bounded
    sleepy = [body for body in _loops(lines) if any(ln.startswith("s_sleep") for ln in body)]
    assert len(sleepy) >= 2, "expected the grid barrier's and the mailbox's wait loops"
    for body in sleepy:
        assert any(ln.startswith("s_memrealtime") for ln in body), "\n".join(body[:40])
    atomics = [ln for ln in lines if ln.startswith("global_atomic_")]
    # peer mailbox flags: system scope (sc1 on gfx94x/gfx950); grid barrier: agent scope (no sc1)
    assert any(
        ln.startswith("global_atomic_swap") and re.search(r"\bsc1\b", ln) for ln in atomics
    ), atomics
    assert any(
        ln.startswith("global_atomic_add ") and not re.search(r"\bsc1\b", ln) for ln in atomics
    ), atomics
    assert any(ln.startswith("buffer_wbl2 sc0 sc1") for ln in lines), "system-scope release"
    assert any(ln.startswith("buffer_inv sc0 sc1") for ln in lines), "system-scope acquire"
    assert any(ln.startswith("buffer_wbl2 sc1") for ln in lines), "agent-scope release"
    assert any(ln.startswith("v_cvt_pk_f32_fp8") for ln in lines)
    assert any(ln.startswith("v_cvt_pk_fp8_f32") for ln in lines), "fp8 K/V encode"
    # weight rows are streamed with 16-byte non-temporal loads
    assert any(ln.startswith("global_load_dwordx4") and re.search(r"\bnt\b", ln) for ln in lines)


def test_wide_uses_mfma_for_its_projections_and_narrow_the_valu(drafter_builds):
    """Both run MFMA attention; only the wide kernel's projections add many more MFMAs, while
    the narrow kernel's projections are packed fp32 FMAs."""
    for arch in ARCHS:
        narrow = _instructions(drafter_builds[("narrow", arch)].isa)
        wide = _instructions(drafter_builds[("wide", arch)].isa)
        mfma = [sum(ln.startswith("v_mfma") for ln in x) for x in (narrow, wide)]
        pk = [sum(ln.startswith("v_pk_fma_f32") for ln in x) for x in (narrow, wide)]
        assert mfma[1] >= mfma[0] + 256, mfma
        assert pk[0] >= 256, pk
