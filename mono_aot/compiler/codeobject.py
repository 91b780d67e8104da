"""Read an AMDGPU code object (HSACO): ELF header fields, ``.text`` size and the kernel metadata.

The metadata is the ``NT_AMDGPU_METADATA`` note (type 32, owner ``AMDGPU``): msgpack with an
``amdhsa.kernels`` list. pyelftools walks the ELF; the numeric header fields are read from the
raw bytes because pyelftools names OS/ABI 64 after ARM, not AMDGPU.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from mono_aot.spec.arch import NT_AMDGPU_METADATA


class CodeObjectError(ValueError):
    """The bytes are not a readable AMDGPU code object."""


@dataclass(frozen=True)
class KernargMeta:
    offset: int
    size: int
    value_kind: str
    name: str | None = None  # FlyDSL does not name arguments; kept if present


@dataclass(frozen=True)
class KernelMeta:
    name: str
    symbol: str
    kernarg_segment_size: int
    args: tuple[KernargMeta, ...]
    vgpr: int
    agpr: int
    sgpr: int
    vgpr_spill: int
    sgpr_spill: int
    lds: int  # group_segment_fixed_size
    scratch: int  # private_segment_fixed_size
    wavefront_size: int
    max_flat_workgroup_size: int
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)


@dataclass(frozen=True)
class CodeObjectInfo:
    machine: int
    osabi: int
    abi_version: int
    e_flags: int
    text_bytes: int
    comment: str  # the .comment section (the linker's version string)
    kernels: tuple[KernelMeta, ...]
    target: str  # amdhsa.target, e.g. amdgcn-amd-amdhsa--gfx942

    def kernel(self, name: str) -> KernelMeta:
        for k in self.kernels:
            if k.name == name:
                return k
        have = ", ".join(k.name for k in self.kernels) or "none"
        raise KeyError(f"no kernel {name!r} in the code object (it has: {have})")


def _int(md: dict[str, Any], key: str, default: int | None = None) -> int:
    v = md.get(key, default)
    if not isinstance(v, int):
        raise CodeObjectError(f"kernel metadata: {key} is missing or not an integer ({v!r})")
    return v


def _kernel(md: dict[str, Any]) -> KernelMeta:
    args = tuple(
        KernargMeta(
            offset=_int(a, ".offset"),
            size=_int(a, ".size"),
            value_kind=str(a.get(".value_kind", "")),
            name=a.get(".name"),
        )
        for a in md.get(".args", [])
    )
    return KernelMeta(
        name=str(md.get(".name", "")),
        symbol=str(md.get(".symbol", "")),
        kernarg_segment_size=_int(md, ".kernarg_segment_size"),
        args=args,
        vgpr=_int(md, ".vgpr_count"),
        agpr=_int(md, ".agpr_count", 0),
        sgpr=_int(md, ".sgpr_count"),
        vgpr_spill=_int(md, ".vgpr_spill_count", 0),
        sgpr_spill=_int(md, ".sgpr_spill_count", 0),
        lds=_int(md, ".group_segment_fixed_size"),
        scratch=_int(md, ".private_segment_fixed_size"),
        wavefront_size=_int(md, ".wavefront_size"),
        max_flat_workgroup_size=_int(md, ".max_flat_workgroup_size"),
        raw=md,
    )


def parse_code_object(data: bytes) -> CodeObjectInfo:
    """Parse ``data``; ``CodeObjectError`` says what is wrong with it."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise CodeObjectError(f"not an ELF file ({len(data)} bytes)")
    if data[4] != 2 or data[5] != 1:
        raise CodeObjectError("not a little-endian ELF64 file")
    osabi, abi_version = data[7], data[8]
    (machine,) = struct.unpack_from("<H", data, 18)
    (e_flags,) = struct.unpack_from("<I", data, 48)
    try:
        elf = ELFFile(io.BytesIO(data))
        text = elf.get_section_by_name(".text")
        comment_sec = elf.get_section_by_name(".comment")
        comment = b""
        if comment_sec is not None:
            comment = comment_sec.data()
        notes: list[bytes] = []
        for seg in elf.iter_segments():
            if seg["p_type"] != "PT_NOTE":
                continue
            for note in seg.iter_notes():
                if note["n_name"] == "AMDGPU" and note["n_type"] == NT_AMDGPU_METADATA:
                    desc = note["n_desc"]
                    notes.append(desc if isinstance(desc, bytes) else desc.encode("latin-1"))
    except (ELFError, struct.error, ValueError) as e:
        raise CodeObjectError(f"unreadable ELF: {e}") from None
    if not notes:
        raise CodeObjectError("no NT_AMDGPU_METADATA note (type 32, owner AMDGPU)")
    try:
        meta = msgpack.unpackb(notes[0], raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as e:
        raise CodeObjectError(f"the AMDGPU metadata note is not msgpack: {e}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("amdhsa.kernels"), list):
        raise CodeObjectError("the AMDGPU metadata note has no amdhsa.kernels list")
    return CodeObjectInfo(
        machine=machine,
        osabi=osabi,
        abi_version=abi_version,
        e_flags=e_flags,
        text_bytes=text.data_size if text is not None else 0,
        comment=comment.replace(b"\0", b"\n").decode("utf-8", "replace").strip(),
        kernels=tuple(_kernel(k) for k in meta["amdhsa.kernels"]),
        target=str(meta.get("amdhsa.target", "")),
    )
