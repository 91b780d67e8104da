"""The parts of an AMDGPU code object the emulator needs, read with ``struct`` only.

The emulator must run where only the serving install is present (no pyelftools, no msgpack), so
this module walks the ELF64 section headers and the symbol table itself. What it returns:

* the target from ``e_flags`` (``EF_AMDGPU_MACH``, the low byte: 0x4c gfx942, 0x4f gfx950);
* each kernel: its code symbol (``STT_FUNC``, value and size inside ``.text``), its code bytes,
  and its 64-byte kernel descriptor (the ``<name>.kd`` ``STT_OBJECT`` symbol in ``.rodata``),
  which the executor reads for the dispatch registers (AMDGPU code object v6; the layout is
  LLVM's "AMDGPUUsage" document, "Kernel Descriptor").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from mono_aot.spec.arch import EF_AMDGPU_MACH, EM_AMDGPU, MACH_TO_ARCH

SHT_SYMTAB = 2
STT_OBJECT = 1
STT_FUNC = 2
KERNEL_DESCRIPTOR_BYTES = 64


class ElfError(ValueError):
    """The bytes are not an AMDGPU code object the emulator can read."""


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int
    type: int
    shndx: int


@dataclass(frozen=True)
class KernelCode:
    """One kernel of a code object: its machine code and kernel descriptor."""

    name: str  # the code symbol, e.g. mono_drafter_narrow_0
    arch: str
    address: int  # virtual address of the first instruction
    code: bytes  # exactly the symbol's size
    descriptor: bytes  # the 64-byte kernel descriptor


class CodeObject:
    """An ELF64 little-endian AMDGPU code object."""

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)
        d = self.data
        if len(d) < 64 or d[:4] != b"\x7fELF":
            raise ElfError(f"not an ELF file ({len(d)} bytes)")
        if d[4] != 2 or d[5] != 1:
            raise ElfError("not a little-endian ELF64 file")
        (self.machine,) = struct.unpack_from("<H", d, 18)
        if self.machine != EM_AMDGPU:
            raise ElfError(f"ELF machine {self.machine} is not AMDGPU ({EM_AMDGPU})")
        (self.e_flags,) = struct.unpack_from("<I", d, 48)
        mach = self.e_flags & EF_AMDGPU_MACH
        if mach not in MACH_TO_ARCH:
            raise ElfError(
                f"e_flags 0x{self.e_flags:x}: EF_AMDGPU_MACH 0x{mach:x} is not a supported "
                f"target ({', '.join(f'0x{k:x} {v}' for k, v in MACH_TO_ARCH.items())})"
            )
        self.arch = MACH_TO_ARCH[mach]
        (shoff,) = struct.unpack_from("<Q", d, 40)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 58)
        if shoff == 0 or shnum == 0 or shentsize < 64 or shoff + shnum * shentsize > len(d):
            raise ElfError("no readable section header table")
        raw = []
        for i in range(shnum):
            (nm, typ, _flags, addr, off, size, link, _info, _align, entsize) = struct.unpack_from(
                "<IIQQQQIIQQ", d, shoff + i * shentsize
            )
            raw.append((nm, typ, addr, off, size, link, entsize))
        if shstrndx >= shnum:
            raise ElfError("section name table index out of range")
        strtab = raw[shstrndx]
        self.sections = [
            Section(self._cstr(strtab[3], strtab[4], r[0]), r[1], r[2], r[3], r[4], r[5], r[6])
            for r in raw
        ]
        for s in self.sections:
            if s.type != 8 and s.offset + s.size > len(d):  # 8 = SHT_NOBITS
                raise ElfError(f"section {s.name} runs past the end of the file")
        self.symbols = self._symbols()

    def _cstr(self, base: int, limit: int, off: int) -> str:
        if off >= limit:
            raise ElfError(f"string offset {off} outside its table")
        end = self.data.find(b"\0", base + off, base + limit)
        if end < 0:
            raise ElfError("unterminated string in a string table")
        return self.data[base + off : end].decode("utf-8", "replace")

    def section(self, name: str) -> Section:
        for s in self.sections:
            if s.name == name:
                return s
        raise ElfError(f"no {name} section")

    def _symbols(self) -> list[Symbol]:
        out = []
        for s in self.sections:
            if s.type != SHT_SYMTAB:
                continue
            names = self.sections[s.link]
            for i in range(s.size // 24):
                nm, info, _other, shndx, value, size = struct.unpack_from(
                    "<IBBHQQ", self.data, s.offset + i * 24
                )
                if nm == 0:
                    continue
                out.append(
                    Symbol(self._cstr(names.offset, names.size, nm), value, size, info & 0xF, shndx)
                )
        return out

    def bytes_at(self, addr: int, size: int) -> bytes:
        """``size`` bytes at virtual address ``addr`` (inside one allocated section)."""
        for s in self.sections:
            if s.addr and s.addr <= addr and addr + size <= s.addr + s.size and s.type != 8:
                start = s.offset + addr - s.addr
                return self.data[start : start + size]
        raise ElfError(f"address 0x{addr:x}+{size} is in no section with file contents")

    def kernel_names(self) -> list[str]:
        kds = {s.name[:-3] for s in self.symbols if s.type == STT_OBJECT and s.name.endswith(".kd")}
        return sorted(s.name for s in self.symbols if s.type == STT_FUNC and s.name in kds)

    def kernel(self, name: str) -> KernelCode:
        funcs = [s for s in self.symbols if s.type == STT_FUNC and s.name == name]
        kds = [s for s in self.symbols if s.type == STT_OBJECT and s.name == name + ".kd"]
        if len(funcs) != 1 or len(kds) != 1:
            have = ", ".join(self.kernel_names()) or "none"
            raise ElfError(f"no kernel {name!r} in the code object (it has: {have})")
        f, kd = funcs[0], kds[0]
        text = self.section(".text")
        if not (text.addr <= f.value and f.value + f.size <= text.addr + text.size):
            raise ElfError(f"kernel {name}: its code is not inside .text")
        if f.size == 0 or f.size % 4:
            raise ElfError(f"kernel {name}: code size {f.size} is not a positive multiple of 4")
        desc = self.bytes_at(kd.value, KERNEL_DESCRIPTOR_BYTES)
        (entry,) = struct.unpack_from("<q", desc, 16)  # kernel_code_entry_byte_offset
        if kd.value + entry != f.value:
            raise ElfError(
                f"kernel {name}: the descriptor's entry 0x{kd.value + entry:x} is not the code "
                f"symbol 0x{f.value:x}"
            )
        return KernelCode(name, self.arch, f.value, self.bytes_at(f.value, f.size), desc)
