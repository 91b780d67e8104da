"""The entry document: what a store records about one published code object.

An entry is small JSON, parsed with pydantic and versioned; nothing in it ever becomes a path
(blob paths derive from the digest, which is checked to be 64 hex digits).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ENTRY_SCHEMA_VERSION = 1
HEX64 = r"^[0-9a-f]{64}$"


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BlobRef(_Doc):
    sha256: str = Field(pattern=HEX64)
    size: int = Field(gt=0)


class Launch(_Doc):
    grid: int = Field(gt=0)  # workgroups (the layout's CTA count)
    block: int = Field(gt=0)  # threads per workgroup
    dynamic_lds: int = Field(ge=0)


class KernargSlot(_Doc):
    name: str  # from the kernel contract (mono_aot.abi)
    offset: int = Field(ge=0)
    size: int = Field(gt=0)
    value_kind: str  # from the code object's metadata: by_value, global_buffer, ...


class Resources(_Doc):
    vgpr: int = Field(ge=0)
    agpr: int = Field(ge=0)
    sgpr: int = Field(ge=0)
    lds: int = Field(ge=0)  # group_segment_fixed_size
    scratch: int = Field(ge=0)  # private_segment_fixed_size
    vgpr_spill: int = Field(ge=0)
    sgpr_spill: int = Field(ge=0)
    wavefront_size: int = Field(gt=0)
    max_flat_workgroup_size: int = Field(gt=0)
    code_bytes: int = Field(ge=0)  # size of the .text section


class ElfInfo(_Doc):
    machine: int  # EM_AMDGPU = 224
    osabi: int  # 64 = ELFOSABI_AMDGPU_HSA
    abi_version: int  # 4 = code object v6
    e_flags: int


class Provenance(_Doc):
    """Who built it and when: informative, never part of a key."""

    mono_aot_version: str
    flydsl_version: str
    linker_version: str
    built_at: str  # ISO 8601, UTC
    build_seconds: float = Field(ge=0)


class Entry(_Doc):
    schema_version: Literal[1] = ENTRY_SCHEMA_VERSION
    key: str = Field(pattern=HEX64)
    variant: str
    arch: str
    layout: str  # the layout's name (informative; its canonical form is in lookup_inputs)
    lookup_inputs: dict[str, Any]  # everything the key hashes: computable without a compiler
    build_inputs: dict[str, Any]  # the toolchain and options that produced these bytes
    blob: BlobRef
    symbol: str  # the kernel's symbol in the code object (hipModuleGetFunction name)
    launch: Launch
    kernarg_segment_size: int = Field(ge=0)
    kernargs: list[KernargSlot]
    resources: Resources
    elf: ElfInfo
    provenance: Provenance
