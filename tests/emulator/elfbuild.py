"""A minimal AMDGPU code object built by hand: one kernel, its code and its descriptor, so the
ELF reader and the decoder can be tested without a compile."""

from __future__ import annotations

import struct

TEXT_ADDR = 0x1000
KD_ADDR = 0x800


def code_object(code: bytes, name: str = "k_0", mach: int = 0x4C) -> bytes:
    """ELF64 AMDGPU with .text (``code`` at 0x1000), .rodata (the 64-byte descriptor of
    ``name`` at 0x800), .symtab, .strtab and .shstrtab."""
    kd = bytearray(64)
    struct.pack_into("<q", kd, 16, TEXT_ADDR - KD_ADDR)  # kernel_code_entry_byte_offset
    strtab = b"\0" + name.encode() + b"\0" + name.encode() + b".kd\0"
    sym_func, sym_kd = 1, 1 + len(name) + 1
    shnames = [b"", b".text", b".rodata", b".symtab", b".strtab", b".shstrtab"]
    shstrtab = b"\0".join(shnames) + b"\0"
    name_off = [shstrtab.index(b"\0" + n + b"\0") + 1 if n else 0 for n in shnames]
    # symbols: null, func in .text (index 1), kd object in .rodata (index 2); STB_GLOBAL = 1
    symtab = (
        bytes(24)
        + struct.pack("<IBBHQQ", sym_func, (1 << 4) | 2, 0, 1, TEXT_ADDR, len(code))
        + struct.pack("<IBBHQQ", sym_kd, (1 << 4) | 1, 0, 2, KD_ADDR, 64)
    )
    blobs = [bytes(code), bytes(kd), symtab, strtab, shstrtab]
    body = bytearray()
    offsets = []
    pos = 64
    for b in blobs:
        pad = -pos % 8
        body += bytes(pad)
        pos += pad
        offsets.append(pos)
        body += b
        pos += len(b)
    pos += -pos % 8
    body += bytes(-len(body) % 8)
    shoff = pos
    # (name, type, flags, addr, offset, size, link, info, align, entsize)
    sh = [(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    sh.append((name_off[1], 1, 6, TEXT_ADDR, offsets[0], len(code), 0, 0, 256, 0))
    sh.append((name_off[2], 1, 2, KD_ADDR, offsets[1], 64, 0, 0, 64, 0))
    sh.append((name_off[3], 2, 0, 0, offsets[2], len(symtab), 4, 1, 8, 24))
    sh.append((name_off[4], 3, 0, 0, offsets[3], len(strtab), 0, 0, 1, 0))
    sh.append((name_off[5], 3, 0, 0, offsets[4], len(shstrtab), 0, 0, 1, 0))
    headers = b"".join(struct.pack("<IIQQQQIIQQ", *s) for s in sh)
    ident = b"\x7fELF" + bytes([2, 1, 1, 64, 4]) + bytes(7)
    ehdr = ident + struct.pack(
        "<HHIQQQIHHHHHH", 1, 224, 1, 0, 0, shoff, 0x500 | mach, 64, 56, 0, 64, len(sh), 5
    )
    return ehdr + bytes(body) + headers


def words(*ws: int) -> bytes:
    return struct.pack(f"<{len(ws)}I", *ws)
