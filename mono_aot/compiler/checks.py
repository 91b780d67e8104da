"""The rules a compiled kernel must pass before it is published (README, "Builds", step 6).

Each failed rule is a ``Violation`` naming the kernel, the arch, the rule and the numbers that
broke it. The rules are pure functions of the compile result and the job, so they are tested
on real code objects and on hand-made metadata alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mono_aot.compiler.codeobject import CodeObjectInfo, KernelMeta
from mono_aot.spec.arch import ELFOSABI_AMDGPU_HSA, EM_AMDGPU, ArchInfo, arch_info
from mono_aot.spec.util import align_up, ceil_div

CODE_OBJECT_V6_ABI_VERSION = 4
# A kernel whose .text is only s_endpgm (4 bytes) was emptied by a failed lowering.
MIN_TEXT_BYTES = 8
_ERROR_RE = re.compile(r"(?<![A-Za-z_])error:", re.MULTILINE)

RULES = ("compile", "kernel", "elf", "kernargs", "launch", "scratch", "spills", "co-residency")


@dataclass(frozen=True)
class Violation:
    kernel: str
    arch: str
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kernel} on {self.arch}: rule {self.rule}: {self.detail}"

    def as_json(self) -> dict[str, str]:
        return {"kernel": self.kernel, "arch": self.arch, "rule": self.rule, "detail": self.detail}


@dataclass(frozen=True)
class Expectation:
    """What the job demands of the code object."""

    kernel: str  # the code object kernel name: KERNEL_NAMES[variant] + "_0"
    arch: str
    ctas: int
    threads: int
    kernargs: tuple[tuple[str, int, int], ...]  # (name, offset, size) of the contract


def coresidency(meta: KernelMeta, threads: int, info: ArchInfo, dynamic_lds: int = 0) -> list[str]:
    """Why one ``threads``-thread workgroup of ``meta`` cannot reside on a CU (empty: it can).

    A workgroup's waves spread over the CU's SIMDs; each SIMD's 512-entry (per lane) VGPR file
    must hold all of its waves' registers, each wave rounded up to the allocation granule.
    """
    out = []
    waves = ceil_div(threads, info.wavefront_size)
    per_simd = ceil_div(waves, info.simds_per_cu)
    regs = align_up(max(meta.vgpr, 1), info.vgpr_alloc_granule)
    if meta.agpr > meta.vgpr:
        out.append(
            f"agpr_count {meta.agpr} exceeds vgpr_count {meta.vgpr}, which should include it "
            "(unified register file): metadata not understood"
        )
    if regs * per_simd > info.vgprs_per_simd:
        out.append(
            f"registers: {meta.vgpr} VGPRs (incl. {meta.agpr} AGPRs) round to {regs} per wave; "
            f"{waves} waves put {per_simd} on each of {info.simds_per_cu} SIMDs, needing "
            f"{regs * per_simd} > {info.vgprs_per_simd} per SIMD (at most "
            f"{info.vgprs_per_simd // per_simd} per wave)"
        )
    sregs = align_up(max(meta.sgpr, 1), info.sgpr_alloc_granule)
    if sregs * per_simd > info.sgprs_per_simd:
        out.append(
            f"SGPRs: {meta.sgpr} round to {sregs} per wave; {per_simd} waves per SIMD need "
            f"{sregs * per_simd} > {info.sgprs_per_simd}"
        )
    lds = meta.lds + dynamic_lds
    if lds > info.lds_bytes_per_cu:
        how = f" ({meta.lds} static + {dynamic_lds} dynamic)" if dynamic_lds else ""
        out.append(f"LDS: {lds} bytes{how} > {info.lds_bytes_per_cu} per CU")
    if threads > meta.max_flat_workgroup_size:
        out.append(
            f"threads: the layout launches {threads} per workgroup, the kernel was compiled for "
            f"at most {meta.max_flat_workgroup_size} (max_flat_workgroup_size)"
        )
    if threads > info.max_threads_per_workgroup:
        out.append(
            f"threads: {threads} > {info.max_threads_per_workgroup} per workgroup on {info.name}"
        )
    if meta.wavefront_size != info.wavefront_size:
        out.append(f"wavefront size {meta.wavefront_size}, {info.name} runs {info.wavefront_size}")
    return out


def check(
    exp: Expectation,
    code: bytes,
    meta: CodeObjectInfo,
    stderr: str,
    launches: list[dict[str, Any]],
) -> list[Violation]:
    """Every rule the build enforces; an empty list means publishable."""
    info = arch_info(exp.arch)
    bad: list[Violation] = []

    def v(rule: str, detail: str) -> None:
        bad.append(Violation(exp.kernel, exp.arch, rule, detail))

    # compile: non-empty code and a clean compiler stderr
    errs = [ln.strip() for ln in stderr.splitlines() if _ERROR_RE.search(ln)]
    if errs:
        v("compile", f"the compiler printed {len(errs)} error line(s): {errs[0][:300]}")
    if not code:
        v("compile", "the code object is empty")
    elif meta.text_bytes < MIN_TEXT_BYTES:
        v("compile", f".text is {meta.text_bytes} bytes: the kernel body was lost")

    # elf: the header matches the arch
    want = {
        "machine": (meta.machine, EM_AMDGPU),
        "osabi": (meta.osabi, ELFOSABI_AMDGPU_HSA),
        "abi_version": (meta.abi_version, CODE_OBJECT_V6_ABI_VERSION),
        "e_flags": (meta.e_flags, info.e_flags),
    }
    for name, (got, exp_val) in want.items():
        if got != exp_val:
            v("elf", f"{name} is {got:#x}, {exp.arch} needs {exp_val:#x}")
    if meta.target and not meta.target.endswith(exp.arch):
        v("elf", f"amdhsa.target is {meta.target!r}, not {exp.arch}")

    # kernel: exactly the expected kernel
    names = [k.name for k in meta.kernels]
    if names != [exp.kernel]:
        v("kernel", f"the code object has kernels {names}, expected exactly [{exp.kernel!r}]")
        return bad
    k = meta.kernels[0]
    if k.symbol != exp.kernel + ".kd":
        v("kernel", f"descriptor symbol {k.symbol!r}, expected {exp.kernel + '.kd'!r}")

    # kernargs: the contract, by value, nothing hidden
    got = [(a.offset, a.size) for a in k.args]
    want_args = [(off, size) for _, off, size in exp.kernargs]
    if got != want_args:
        v(
            "kernargs",
            f"the code object's arguments (offset, size) {got} differ from the contract "
            f"{[(n, o, s) for n, o, s in exp.kernargs]}",
        )
    kinds = sorted({a.value_kind for a in k.args} - {"by_value"})
    if kinds:
        v("kernargs", f"arguments of kind {kinds}: the contract passes every argument by value")
    if exp.kernargs:
        _, off, size = exp.kernargs[-1]
        if k.kernarg_segment_size != off + size:
            v(
                "kernargs",
                f"kernarg_segment_size {k.kernarg_segment_size}, the contract needs {off + size}",
            )

    # launch: the host side launches the layout's geometry
    mine = [la for la in launches if la.get("kernel") == exp.kernel]
    if len(mine) != 1 or len(launches) != 1:
        v(
            "launch",
            f"expected one launch of {exp.kernel}, the launcher has {len(launches)} ({len(mine)} of it)",
        )
    else:
        la = mine[0]
        if list(la["grid"]) != [exp.ctas, 1, 1]:
            v(
                "launch",
                f"grid {la['grid']}, the layout needs [{exp.ctas}, 1, 1] (one workgroup per CU)",
            )
        if list(la["block"]) != [exp.threads, 1, 1]:
            v("launch", f"block {la['block']}, the layout needs [{exp.threads}, 1, 1]")
        if not isinstance(la.get("dynamic_lds"), int) or la["dynamic_lds"] < 0:
            v("launch", "the dynamic LDS size of the launch is not a compile-time constant")

    if k.scratch:
        v(
            "scratch",
            f"private_segment_fixed_size {k.scratch} bytes; the kernels must use no scratch",
        )
    if k.vgpr_spill or k.sgpr_spill:
        v("spills", f"{k.vgpr_spill} VGPR and {k.sgpr_spill} SGPR spills")
    dyn = 0
    if len(mine) == 1 and isinstance(mine[0].get("dynamic_lds"), int):
        dyn = mine[0]["dynamic_lds"]
    for why in coresidency(k, exp.threads, info, dyn):
        v("co-residency", f"{why} (at {exp.ctas} CTAs, one per CU)")
    return bad
