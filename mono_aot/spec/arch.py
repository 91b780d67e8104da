"""What mono-aot knows about each supported GPU target, in one table.

To support another arch, add an ``ArchInfo`` here (the ELF flags, the fp8 format its
``v_cvt_*_fp8`` instructions read, the per-CU limits), give it a CTA count in the layout
specs that should target it, and make the kernels' arch-dependent choices cover it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchInfo:
    name: str
    products: tuple[str, ...]
    max_cus: int  # CUs of the largest product: no more workgroups than that can be co-resident
    e_flags: int  # ELF e_flags of FlyDSL's code objects (xnack/sramecc "any")
    fp8_format: str  # what v_cvt_pk_f32_fp8 reads on this arch
    fp8_max: float
    lds_bytes_per_cu: int
    vgprs_per_simd: int  # per lane, shared by the waves resident on one SIMD
    simds_per_cu: int
    sgprs_per_wave: int
    max_threads_per_workgroup: int
    wavefront_size: int
    hbm_bytes_per_s: float  # peak HBM bandwidth of products[0] (the performance model's floor)
    # VGPRs are allocated per wave in blocks of this many; on gfx90a and later the AGPRs share
    # the same 512-entry file, and the code object's .vgpr_count is already the unified total
    # (arch VGPRs aligned to 4, plus AGPRs).
    vgpr_alloc_granule: int = 8
    # SGPRs: each SIMD has 800 (gfx9 family), allocated per wave in blocks of 16; the code
    # object's .sgpr_count includes the reserved VCC/FLAT_SCRATCH/XNACK registers, so it may
    # exceed the 102 addressable ones (sgprs_per_wave) in a valid kernel.
    sgprs_per_simd: int = 800
    sgpr_alloc_granule: int = 16


ARCHS: dict[str, ArchInfo] = {
    "gfx942": ArchInfo(
        name="gfx942",
        products=("MI300X", "MI325X"),
        max_cus=304,
        e_flags=0x54C,
        fp8_format="e4m3fnuz",
        fp8_max=240.0,
        lds_bytes_per_cu=64 * 1024,
        vgprs_per_simd=512,
        simds_per_cu=4,
        sgprs_per_wave=102,
        max_threads_per_workgroup=1024,
        wavefront_size=64,
        hbm_bytes_per_s=5.3e12,
    ),
    "gfx950": ArchInfo(
        name="gfx950",
        products=("MI350X", "MI355X"),
        max_cus=256,
        e_flags=0x54F,
        fp8_format="e4m3fn",
        fp8_max=448.0,
        lds_bytes_per_cu=160 * 1024,
        vgprs_per_simd=512,
        simds_per_cu=4,
        sgprs_per_wave=102,
        max_threads_per_workgroup=1024,
        wavefront_size=64,
        hbm_bytes_per_s=8.0e12,
    ),
}

SUPPORTED_ARCHS: tuple[str, ...] = tuple(sorted(ARCHS))

# The ELF facts of an AMDGPU code object, shared by the build's checks, the runtime's loader and
# the emulator's reader.
EM_AMDGPU = 224  # e_machine
ELFOSABI_AMDGPU_HSA = 64  # e_ident[EI_OSABI]
NT_AMDGPU_METADATA = 32  # the msgpack metadata note
EF_AMDGPU_MACH = 0x0FF  # the e_flags bits naming the processor
MACH_TO_ARCH: dict[int, str] = {info.e_flags & EF_AMDGPU_MACH: name for name, info in ARCHS.items()}


def arch_info(name: str) -> ArchInfo:
    """The arch's facts; ``KeyError`` names the supported set."""
    try:
        return ARCHS[name]
    except KeyError:
        raise KeyError(
            f"unsupported arch {name!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
        ) from None


def base_arch(gcn_arch_name: str) -> str:
    """``gfx942:sramecc+:xnack-`` (HIP's gcnArchName) -> ``gfx942``."""
    return gcn_arch_name.split(":", 1)[0].strip()
