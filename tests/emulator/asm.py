"""A tiny assembler for the executor's tests: instruction words built from the microcode formats
of the CDNA3 ISA guide (chapter "Microcode Formats"), opcodes looked up by name in the decoder's
own tables (``mono_aot.emulator.isa``). Each test decodes what it assembled, so an encoder
mistake shows up as a wrong rendering rather than a silently different program.

Operands: ``s(n)``, ``v(n)``, ``i(k)`` (inline integer -16..64), ``VCC``, ``EXEC``, ``LIT`` with
the literal passed separately.
"""

from __future__ import annotations

import struct

from mono_aot.emulator import isa
from tests.emulator.elfbuild import code_object

VCC, EXEC, M0, LIT, SCC = 106, 126, 124, 255, 253
OFF = 0x7F


def s(n: int) -> int:
    return n


def v(n: int) -> int:
    return 256 + n


def i(k: int) -> int:
    if 0 <= k <= 64:
        return 128 + k
    if -16 <= k < 0:
        return 192 - k
    raise ValueError(k)


def _code(table: dict, name: str) -> int:
    for c, op in table.items():
        if op.name == name:
            return c
    raise KeyError(name)


def _vgpr(enc: int) -> int:
    """The 8-bit VGPR field of a VOP2/VOPC src1: takes ``v(n)``."""
    if enc < 256:
        raise ValueError(f"vsrc1 must be a VGPR, not encoding {enc}")
    return enc - 256


def _vop_tables(arch: str) -> dict:
    return isa.tables(arch)


class Asm:
    """Collects dwords; ``label``/``branch`` resolve targets; ``code()`` gives the bytes."""

    def __init__(self, arch: str = "gfx942") -> None:
        self.arch = arch
        self.t = isa.tables(arch)
        self.words: list[int] = []
        self.labels: dict[str, int] = {}
        self.fix: list[tuple[int, str]] = []

    def _emit(self, *ws: int) -> Asm:
        self.words.extend(w & 0xFFFFFFFF for w in ws)
        return self

    def label(self, name: str) -> Asm:
        self.labels[name] = len(self.words)
        return self

    # ---- scalar
    def sop2(self, name: str, d: int, a: int, b: int, lit: int | None = None) -> Asm:
        w = 0b10 << 30 | _code(self.t["SOP2"], name) << 23 | d << 16 | b << 8 | a
        return self._emit(w, *([lit] if lit is not None else []))

    def sop1(self, name: str, d: int, a: int = 0, lit: int | None = None) -> Asm:
        w = 0x17D << 23 | d << 16 | _code(self.t["SOP1"], name) << 8 | a
        return self._emit(w, *([lit] if lit is not None else []))

    def sopk(self, name: str, d: int, k: int) -> Asm:
        return self._emit(0b1011 << 28 | _code(self.t["SOPK"], name) << 23 | d << 16 | k & 0xFFFF)

    def sopc(self, name: str, a: int, b: int, lit: int | None = None) -> Asm:
        w = 0x17E << 23 | _code(self.t["SOPC"], name) << 16 | b << 8 | a
        return self._emit(w, *([lit] if lit is not None else []))

    def sopp(self, name: str, k: int = 0) -> Asm:
        return self._emit(0x17F << 23 | _code(self.t["SOPP"], name) << 16 | k & 0xFFFF)

    def branch(self, name: str, label: str) -> Asm:
        self.fix.append((len(self.words), label))
        return self.sopp(name, 0)

    def waitcnt(self, vm: int = 63, lgkm: int = 15, exp: int = 7) -> Asm:
        k = (vm & 0xF) | (vm >> 4) << 14 | exp << 4 | lgkm << 8
        return self.sopp("s_waitcnt", k)

    def endpgm(self) -> Asm:
        return self.sopp("s_endpgm")

    def smem(self, name: str, sdata: int, sbase: int, offset: int = 0) -> Asm:
        imm = 0 if name in ("s_memtime", "s_memrealtime") else 1
        w0 = 0x30 << 26 | _code(self.t["SMEM"], name) << 18 | imm << 17 | sdata << 6 | sbase // 2
        return self._emit(w0, offset & 0x1FFFFF)

    # ---- vector
    def vop1(self, name: str, d: int, a: int, lit: int | None = None) -> Asm:
        w = 0x3F << 25 | d << 17 | _code(self.t["VOP1"], name) << 9 | a
        return self._emit(w, *([lit] if lit is not None else []))

    def vop2(self, name: str, d: int, a: int, b: int, lit: int | None = None) -> Asm:
        w = _code(self.t["VOP2"], name) << 25 | d << 17 | _vgpr(b) << 9 | a
        return self._emit(w, *([lit] if lit is not None else []))

    def vopc(self, name: str, a: int, b: int) -> Asm:
        return self._emit(0x3E << 25 | _code(self.t["VOPC"], name) << 17 | _vgpr(b) << 9 | a)

    def vop3(self, name: str, d: int, a: int, b: int = 0, c: int = 0, *, neg: int = 0,
             abs_: int = 0, opsel: int = 0, clamp: int = 0, sdst: int | None = None) -> Asm:  # fmt: skip
        for tbl, base in (("VOP3", 0), ("VOP2", 0x100), ("VOP1", 0x140), ("VOPC", 0)):
            try:
                opc = _code(self.t[tbl], name) + base
                break
            except KeyError:
                continue
        else:
            raise KeyError(name)
        mid = (sdst << 8) if sdst is not None else (opsel << 11 | abs_ << 8)
        w0 = 0x34 << 26 | opc << 16 | clamp << 15 | mid | d
        w1 = neg << 29 | c << 18 | b << 9 | a
        return self._emit(w0, w1)

    def vop3p(self, name: str, d: int, a: int, b: int, c: int = 0, *, opsel: int = 0,
              opsel_hi: int = 0b111, neg_lo: int = 0, neg_hi: int = 0) -> Asm:  # fmt: skip
        w0 = 0x1A7 << 23 | _code(self.t["VOP3P"], name) << 16 | (opsel_hi >> 2 & 1) << 14
        w0 |= opsel << 11 | neg_hi << 8 | d
        w1 = neg_lo << 29 | (opsel_hi & 3) << 27 | c << 18 | b << 9 | a
        return self._emit(w0, w1)

    def sdwa(self, name: str, d: int, a: int, b: int, *, src0_sel: int = 6, src1_sel: int = 6,
             dst_sel: int = 6, dst_unused: int = 0, sext0: int = 0, sext1: int = 0) -> Asm:  # fmt: skip
        """VOP2 in SDWA form: a and b are VGPR numbers (not encodings)."""
        w = _code(self.t["VOP2"], name) << 25 | d << 17 | b << 9 | 249
        sd = a | dst_sel << 8 | dst_unused << 11 | src0_sel << 16 | sext0 << 19
        sd |= src1_sel << 24 | sext1 << 27
        return self._emit(w, sd)

    def ds(self, name: str, *, addr: int = 0, data0: int = 0, data1: int = 0, vdst: int = 0,
           offset: int = 0, offset0: int | None = None, offset1: int = 0) -> Asm:  # fmt: skip
        o0 = offset & 0xFF if offset0 is None else offset0
        o1 = offset >> 8 if offset0 is None else offset1
        w0 = 0x36 << 26 | _code(self.t["DS"], name) << 17 | o1 << 8 | o0
        return self._emit(w0, vdst << 24 | data1 << 16 | data0 << 8 | addr)

    def glob(self, name: str, *, addr: int, data: int = 0, vdst: int = 0, saddr: int = OFF,
             offset: int = 0, sc0: int = 0) -> Asm:  # fmt: skip
        w0 = (
            0x37 << 26
            | _code(self.t["FLAT"], name.removeprefix("global_")) << 18
            | sc0 << 16
            | 2 << 14
        )
        w0 |= offset & 0x1FFF
        return self._emit(w0, vdst << 24 | saddr << 16 | data << 8 | addr)

    def code(self) -> bytes:
        ws = list(self.words)
        for at, lab in self.fix:
            delta = self.labels[lab] - (at + 1)
            ws[at] = (ws[at] & 0xFFFF0000) | (delta & 0xFFFF)
        return struct.pack(f"<{len(ws)}I", *ws)


MACH = {"gfx942": 0x4C, "gfx950": 0x4F}


def kernel_object(asm: Asm, *, vgpr_granules: int = 4, accum_granules: int = 7,
                  lds: int = 0, kernarg_size: int = 64, name: str = "k_0") -> bytes:  # fmt: skip
    """A code object whose descriptor enables the kernarg pointer (s[0:1]) and workgroup id X
    (s2), ``(vgpr_granules + 1) * 8`` VGPRs and accum_offset ``(accum_granules + 1) * 4``."""
    co = bytearray(code_object(asm.code(), name=name, mach=MACH[asm.arch]))
    # find the descriptor: the 64 bytes whose entry offset is TEXT_ADDR - KD_ADDR
    from tests.emulator.elfbuild import KD_ADDR, TEXT_ADDR

    pat = struct.pack("<q", TEXT_ADDR - KD_ADDR)
    at = co.index(bytes(16) + pat) if co.find(bytes(16) + pat) >= 0 else -1
    if at < 0:
        raise AssertionError("descriptor not found")
    kd = at
    struct.pack_into("<III", co, kd, lds, 0, kernarg_size)
    rsrc1 = vgpr_granules & 0x3F | 1 << 23  # IEEE mode
    rsrc2 = 2 << 1 | 1 << 7  # user SGPRs: 2 (kernarg ptr); workgroup id X
    rsrc3 = accum_granules & 0x3F
    struct.pack_into("<III", co, kd + 44, rsrc3, rsrc1, rsrc2)
    struct.pack_into("<HH", co, kd + 56, 1 << 3, 0)  # enable_sgpr_kernarg_segment_ptr
    return bytes(co)
