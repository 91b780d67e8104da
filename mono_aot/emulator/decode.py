"""Decode gfx942 / gfx950 machine code into structured instructions, rendered in LLVM syntax.

Encodings follow the "Microcode Formats" chapter of the AMD Instinct MI300 (CDNA3) and CDNA4 ISA
reference guides: every instruction is one or two dwords (a literal constant or the second dword
of SMEM, VOP3, VOP3P, SDWA, DS, FLAT and MUBUF), little-endian. The text form is LLVM's AMDGPU
assembly syntax (LLVM's "AMDGPU Instruction Syntax", "AMDGPU Operand Syntax" and "AMDGPU
Modifier Syntax" documents), so a decoded kernel can be compared with the ISA listing of the
same compile.

An encoding the tables do not know, a reserved field that is set, or a modifier the renderer
cannot print raises ``DecodeError`` naming the kernel, the byte offset and the instruction's bits.
Nothing is skipped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace

from mono_aot.emulator.elf import CodeObject, KernelCode
from mono_aot.emulator.isa import FLAT_SEGMENTS, WIDTH, Op, tables


class DecodeError(ValueError):
    """An instruction the decoder does not know: names kernel, byte offset and bits."""

    def __init__(self, kernel: str, offset: int, words: tuple[int, ...], why: str) -> None:
        bits = " ".join(f"0x{w:08x}" for w in words)
        super().__init__(f"{kernel}: offset 0x{offset:x}: bits {bits}: {why}")
        self.kernel, self.offset, self.words, self.why = kernel, offset, words, why


class _Bad(Exception):
    """Raised inside the decoder, turned into a DecodeError with the instruction's context."""


# ------------------------------------------------------------------------------ operands
@dataclass(frozen=True)
class Operand:
    """One operand. ``kind``: ``s``/``v``/``a`` (registers, ``index`` and ``width`` dwords),
    ``special`` (a named scalar register: ``name``, ``index`` its encoding), ``const`` (an inline
    constant: ``value`` the integer or float it stands for), ``literal`` (``value`` the 32-bit
    literal dword), ``target`` (a branch target: ``value`` the byte offset in the kernel),
    ``off`` (no scalar address)."""

    kind: str
    index: int = 0
    width: int = 1
    value: int | float = 0
    name: str = ""
    neg: bool = False
    abs: bool = False
    sext: bool = False
    type: str = "b32"

    def text(self) -> str:
        if self.kind in ("s", "v", "a"):
            t = (
                f"{self.kind}{self.index}"
                if self.width == 1
                else f"{self.kind}[{self.index}:{self.index + self.width - 1}]"
            )
        elif self.kind == "special":
            t = self.name
        elif self.kind == "const":
            t = self.name
        elif self.kind == "literal":
            t = f"0x{int(self.value):x}"
        elif self.kind == "target":
            t = f"0x{int(self.value):x}"
        elif self.kind == "off":
            t = "off"
        else:
            raise AssertionError(self.kind)
        if self.abs:
            t = f"|{t}|"
        if self.neg:
            t = f"-{t}"
        if self.sext:
            t = f"sext({t})"
        return t


_FLOAT_CONSTS = {240: 0.5, 241: -0.5, 242: 1.0, 243: -1.0, 244: 2.0, 245: -2.0, 246: 4.0,
                 247: -4.0}  # fmt: skip
INV_2PI = 0.15915494309189532
_SPECIAL_32 = {102: "flat_scratch_lo", 103: "flat_scratch_hi", 104: "xnack_mask_lo",
               105: "xnack_mask_hi", 106: "vcc_lo", 107: "vcc_hi", 124: "m0", 126: "exec_lo",
               127: "exec_hi", 235: "src_shared_base", 236: "src_shared_limit",
               237: "src_private_base", 238: "src_private_limit",
               239: "src_pops_exiting_wave_id", 251: "src_vccz", 252: "src_execz",
               253: "src_scc", 254: "src_lds_direct"}  # fmt: skip
_SPECIAL_64 = {102: "flat_scratch", 104: "xnack_mask", 106: "vcc", 126: "exec",
               235: "src_shared_base", 236: "src_shared_limit", 237: "src_private_base",
               238: "src_private_limit"}  # fmt: skip
LITERAL = 255
SDWA_SRC0 = 249
DPP_SRC0 = 250


def scalar_operand(code: int, type_: str, literal: int | None = None) -> Operand:
    """A scalar-encoded source or destination (0-255): SGPRs, special registers, inline
    constants, the literal (255)."""
    w = WIDTH[type_]
    if code <= 101:
        if code + w - 1 > 101:
            raise _Bad(f"s{code} is too close to the end of the SGPRs for {w} dwords")
        return Operand("s", code, w, type=type_)
    if 108 <= code <= 123:
        i = code - 108
        if w == 1:
            return Operand("special", code, 1, name=f"ttmp{i}", type=type_)
        return Operand("special", code, w, name=f"ttmp[{i}:{i + w - 1}]", type=type_)
    if 128 <= code <= 192:
        return Operand("const", code, w, value=code - 128, name=str(code - 128), type=type_)
    if 193 <= code <= 208:
        return Operand("const", code, w, value=192 - code, name=str(192 - code), type=type_)
    if code in _FLOAT_CONSTS:
        v = _FLOAT_CONSTS[code]
        return Operand("const", code, w, value=v, name=repr(v), type=type_)
    if code == 248:
        name = "0.15915494309189532" if w == 2 else "0.15915494"
        return Operand("const", code, w, value=INV_2PI, name=name, type=type_)
    if code == LITERAL:
        if literal is None:
            raise _Bad("a literal constant where this encoding has none")
        return Operand("literal", code, w, value=literal, type=type_)
    names = _SPECIAL_64 if w == 2 else _SPECIAL_32 if w == 1 else {}
    if code in names:
        return Operand("special", code, w, name=names[code], type=type_)
    raise _Bad(f"scalar operand encoding {code} is not valid for a {w}-dword operand")


def src9(code: int, type_: str, literal: int | None = None) -> Operand:
    """A 9-bit source: 256-511 are v0-v255, the rest as ``scalar_operand``."""
    if code >= 256:
        w = WIDTH[type_]
        if code - 256 + w > 256:
            raise _Bad(f"v{code - 256} is too close to the end of the VGPRs for {w} dwords")
        return Operand("v", code - 256, w, type=type_)
    return scalar_operand(code, type_, literal)


def vreg(index: int, type_: str, kind: str = "v") -> Operand:
    w = WIDTH[type_]
    if index + w > 256:
        raise _Bad(f"{kind}{index} is too close to the end of the register file for {w} dwords")
    return Operand(kind, index, w, type=type_)


# ------------------------------------------------------------------------------ instructions
@dataclass(frozen=True)
class Instruction:
    """One decoded instruction.

    ``name`` is the LLVM mnemonic as printed (with ``_e32``/``_e64``/``_sdwa`` where LLVM prints
    one); ``base`` the opcode's name without it; ``fmt`` the encoding (SOP2, SOPK, SOP1, SOPC,
    SOPP, SMEM, VOP1, VOP2, VOPC, VOP3, VOP3P, MAI, DS, FLAT, MUBUF, and for VOP1/VOP2/VOPC the
    variant ``SDWA``); ``operands`` in printed order, each with its role in ``roles``;
    ``modifiers`` the printed modifiers in order (name, value); ``fields`` every decoded field.
    """

    offset: int
    words: tuple[int, ...]
    fmt: str
    opcode: int
    op: Op
    name: str
    operands: tuple[Operand, ...]
    roles: tuple[str, ...]
    modifiers: tuple[tuple[str, object], ...] = ()
    literal: int | None = None
    fields: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def size(self) -> int:
        return 4 * len(self.words)

    @property
    def base(self) -> str:
        return self.op.name

    def operand(self, role: str) -> Operand:
        return self.operands[self.roles.index(role)]

    def text(self) -> str:
        """The instruction in LLVM's assembly syntax (branch targets as byte offsets)."""
        ops = ", ".join(o.text() for o in self.operands)
        out = self.name + (" " + ops if ops else "")
        mods = []
        for k, v in self.modifiers:
            if v is True:
                mods.append(k)
            elif isinstance(v, tuple):
                mods.append(f"{k}:[{','.join(str(x) for x in v)}]")
            else:
                mods.append(f"{k}:{v}")
        if mods:
            out += " " + " ".join(mods)
        return out


def _bits(w: int, lo: int, n: int) -> int:
    return (w >> lo) & ((1 << n) - 1)


def _sext(v: int, n: int) -> int:
    return v - (1 << n) if v & (1 << (n - 1)) else v


_SDWA_SEL = ("BYTE_0", "BYTE_1", "BYTE_2", "BYTE_3", "WORD_0", "WORD_1", "DWORD")
_SDWA_UNUSED = ("UNUSED_PAD", "UNUSED_SEXT", "UNUSED_PRESERVE")


class Decoder:
    """Decodes the code of one kernel; ``arch`` selects the opcode tables."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.t = tables(arch)

    def decode(self, code: bytes, kernel: str = "?") -> list[Instruction]:
        if len(code) % 4:
            raise DecodeError(
                kernel, len(code) - len(code) % 4, (), "code size is not a multiple of 4"
            )
        words = struct.unpack(f"<{len(code) // 4}I", code)
        out: list[Instruction] = []
        i = 0
        while i < len(words):
            w0 = words[i]
            nxt = words[i + 1] if i + 1 < len(words) else None
            try:
                inst = self.one(4 * i, w0, nxt, words[i + 2] if i + 2 < len(words) else None)
            except _Bad as e:
                shown = tuple(x for x in (w0, nxt) if x is not None)
                raise DecodeError(kernel, 4 * i, shown, str(e)) from None
            out.append(inst)
            i += len(inst.words)
        return out

    # one instruction at byte ``off``: first dword ``w``, the next two (or None past the end)
    def one(self, off: int, w: int, w1: int | None, w2: int | None) -> Instruction:
        if (w >> 25) == 0x3F:
            return self._vop1(off, w, w1)
        if (w >> 25) == 0x3E:
            return self._vopc(off, w, w1)
        if (w >> 31) == 0:
            return self._vop2(off, w, w1)
        if (w >> 30) == 0b10:
            top9 = w >> 23
            if top9 == 0x17D:
                return self._sop1(off, w, w1)
            if top9 == 0x17E:
                return self._sopc(off, w, w1)
            if top9 == 0x17F:
                return self._sopp(off, w)
            if (w >> 28) == 0xB:
                return self._sopk(off, w)
            return self._sop2(off, w, w1)
        if (w >> 23) == 0x1A7:
            return self._vop3p(off, w, self._need(w1))
        enc = w >> 26
        if enc == 0x30:
            return self._smem(off, w, self._need(w1))
        if enc == 0x34:
            return self._vop3(off, w, self._need(w1))
        if enc == 0x36:
            return self._ds(off, w, self._need(w1))
        if enc == 0x37:
            return self._flat(off, w, self._need(w1))
        if enc == 0x38:
            return self._mubuf(off, w, self._need(w1))
        raise _Bad(f"unknown encoding (bits 31:26 = 0b{enc:06b})")

    @staticmethod
    def _need(w1: int | None) -> int:
        if w1 is None:
            raise _Bad("a 64-bit encoding truncated by the end of the code")
        return w1

    def _lookup(self, fmt: str, opcode: int, tbl: str | None = None) -> Op:
        op = self.t[tbl or fmt].get(opcode)
        if op is None:
            raise _Bad(f"unknown {fmt} opcode {opcode} (0x{opcode:x}) for {self.arch}")
        return op

    @staticmethod
    def _words(
        w: int, w1: int | None, srcs: list[int], *extra: int
    ) -> tuple[tuple[int, ...], int | None]:
        """The instruction's dwords and its literal when any 8/9-bit source is 255."""
        if any(s == LITERAL for s in srcs):
            lit = Decoder._need(w1)
            return (w, *extra, lit), lit
        return (w, *extra), None

    # ---- scalar ALU
    def _sop2(self, off: int, w: int, w1: int | None) -> Instruction:
        opc = _bits(w, 23, 7)
        op = self._lookup("SOP2", opc)
        s0, s1, d = _bits(w, 0, 8), _bits(w, 8, 8), _bits(w, 16, 7)
        words, lit = self._words(w, w1, [s0, s1])
        ops = (scalar_operand(d, op.dst), scalar_operand(s0, op.srcs[0], lit),
               scalar_operand(s1, op.srcs[1], lit))  # fmt: skip
        return Instruction(off, words, "SOP2", opc, op, op.name, ops, ("sdst", "src0", "src1"),
                           literal=lit, fields={"sdst": d, "ssrc0": s0, "ssrc1": s1})  # fmt: skip

    def _sop1(self, off: int, w: int, w1: int | None) -> Instruction:
        opc = _bits(w, 8, 8)
        op = self._lookup("SOP1", opc)
        s0, d = _bits(w, 0, 8), _bits(w, 16, 7)
        if not op.srcs:
            if s0:
                raise _Bad(f"{op.name}: ssrc0 must be 0")
            return Instruction(off, (w,), "SOP1", opc, op, op.name, (scalar_operand(d, op.dst),),
                               ("sdst",), fields={"sdst": d})  # fmt: skip
        words, lit = self._words(w, w1, [s0])
        if op.dst is None:  # s_setpc_b64: a source only
            if d:
                raise _Bad(f"{op.name}: sdst must be 0")
            return Instruction(off, words, "SOP1", opc, op, op.name,
                               (scalar_operand(s0, op.srcs[0], lit),), ("src0",), literal=lit,
                               fields={"ssrc0": s0})  # fmt: skip
        ops = (scalar_operand(d, op.dst), scalar_operand(s0, op.srcs[0], lit))
        return Instruction(off, words, "SOP1", opc, op, op.name, ops, ("sdst", "src0"),
                           literal=lit, fields={"sdst": d, "ssrc0": s0})  # fmt: skip

    def _sopc(self, off: int, w: int, w1: int | None) -> Instruction:
        opc = _bits(w, 16, 7)
        op = self._lookup("SOPC", opc)
        s0, s1 = _bits(w, 0, 8), _bits(w, 8, 8)
        words, lit = self._words(w, w1, [s0, s1])
        ops = (scalar_operand(s0, op.srcs[0], lit), scalar_operand(s1, op.srcs[1], lit))
        return Instruction(off, words, "SOPC", opc, op, op.name, ops, ("src0", "src1"),
                           literal=lit, fields={"ssrc0": s0, "ssrc1": s1})  # fmt: skip

    def _sopk(self, off: int, w: int) -> Instruction:
        opc = _bits(w, 23, 5)
        op = self._lookup("SOPK", opc)
        d, k = _bits(w, 16, 7), _bits(w, 0, 16)
        ops = (scalar_operand(d, op.dst), Operand("literal", 0, 1, value=k, type="b16"))
        return Instruction(off, (w,), "SOPK", opc, op, op.name, ops, ("sdst", "simm16"),
                           fields={"sdst": d, "simm16": k})  # fmt: skip

    def _sopp(self, off: int, w: int) -> Instruction:
        opc = _bits(w, 16, 7)
        op = self._lookup("SOPP", opc)
        k = _bits(w, 0, 16)
        f = {"simm16": k}
        if op.kind == "":
            if k:
                raise _Bad(f"{op.name}: simm16 must be 0")
            return Instruction(off, (w,), "SOPP", opc, op, op.name, (), (), fields=f)
        if op.kind == "imm":
            return Instruction(off, (w,), "SOPP", opc, op, op.name,
                               (Operand("const", 0, 1, value=k, name=str(k)),), ("simm16",),
                               fields=f)  # fmt: skip
        if op.kind == "branch":
            target = off + 4 + 4 * _sext(k, 16)
            return Instruction(off, (w,), "SOPP", opc, op, op.name,
                               (Operand("target", 0, 1, value=target),), ("target",), fields=f)  # fmt: skip
        if op.kind == "waitcnt":
            vm = _bits(k, 0, 4) | (_bits(k, 14, 2) << 4)
            exp, lgkm = _bits(k, 4, 3), _bits(k, 8, 4)
            if k & 0x3080:
                raise _Bad("s_waitcnt: reserved bits 7, 12 or 13 are set")
            f.update(vmcnt=vm, expcnt=exp, lgkmcnt=lgkm)
            parts = [(n, v) for n, v, m in (("vmcnt", vm, 63), ("expcnt", exp, 7),
                                            ("lgkmcnt", lgkm, 15)) if v != m]  # fmt: skip
            if not parts:
                parts = [("vmcnt", vm), ("expcnt", exp), ("lgkmcnt", lgkm)]
            ops = tuple(Operand("const", 0, 1, value=v, name=f"{n}({v})") for n, v in parts)
            return _Waitcnt(off, (w,), "SOPP", opc, op, op.name, ops,
                            tuple(n for n, _ in parts), fields=f)  # fmt: skip
        raise AssertionError(op.kind)

    # ---- scalar memory
    def _smem(self, off: int, w: int, w1: int) -> Instruction:
        opc = _bits(w, 18, 8)
        op = self._lookup("SMEM", opc)
        sbase, sdata = _bits(w, 0, 6) * 2, _bits(w, 6, 7)
        soe, nv, glc, imm = _bits(w, 14, 1), _bits(w, 15, 1), _bits(w, 16, 1), _bits(w, 17, 1)
        offset, soffset = _bits(w1, 0, 21), _bits(w1, 25, 7)
        f = {"sbase": sbase, "sdata": sdata, "soe": soe, "nv": nv, "glc": glc, "imm": imm,
             "offset": offset, "soffset": soffset}  # fmt: skip
        if nv or _bits(w, 13, 1) or _bits(w1, 21, 4):
            raise _Bad("SMEM: nv or a reserved bit is set")
        mods: tuple[tuple[str, object], ...] = (("glc", True),) if glc else ()
        if op.kind == "none" or op.kind == "time":
            if sbase or offset or soffset or imm or soe or (op.kind == "none" and sdata):
                raise _Bad(f"{op.name}: address fields must be 0")
            ops = (scalar_operand(sdata, op.dst),) if op.kind == "time" else ()
            return Instruction(off, (w, w1), "SMEM", opc, op, op.name, ops,
                               ("sdst",)[: len(ops)], mods, fields=f)  # fmt: skip
        if not imm or soe:
            raise _Bad("SMEM: only an immediate offset (imm=1, soe=0) is supported")
        offset_s = _sext(offset, 21)
        if offset_s < 0:
            raise _Bad("SMEM: a negative immediate offset is not supported by the renderer")
        ops = (scalar_operand(sdata, op.dst), scalar_operand(sbase, "b64"),
               Operand("literal", 0, 1, value=offset_s))  # fmt: skip
        return Instruction(off, (w, w1), "SMEM", opc, op, op.name, ops,
                           ("sdst", "sbase", "offset"), mods, fields=f)  # fmt: skip

    # ---- vector ALU, 32-bit encodings
    def _vop2(self, off: int, w: int, w1: int | None) -> Instruction:
        opc = _bits(w, 25, 6)
        op = self._lookup("VOP2", opc)
        s0, vs1, vd = _bits(w, 0, 9), _bits(w, 9, 8), _bits(w, 17, 8)
        if s0 == SDWA_SRC0:
            return self._sdwa(off, w, self._need(w1), "VOP2", opc, op)
        if s0 == DPP_SRC0:
            raise _Bad(f"{op.name}: DPP encodings are not supported")
        words, lit = self._words(w, w1, [s0])
        d = vreg(vd, op.dst)
        a = src9(s0, op.srcs[0], lit)
        b = vreg(vs1, op.srcs[1])
        vcc = Operand("special", 106, 2, name="vcc", type="b64")
        if op.kind == "cndmask":
            ops, roles = (d, a, b, vcc), ("vdst", "src0", "src1", "vcc_in")
        elif op.kind == "carryout":
            ops, roles = (d, vcc, a, b), ("vdst", "vcc_out", "src0", "src1")
        elif op.kind == "carry":
            ops, roles = (d, vcc, a, b, vcc), ("vdst", "vcc_out", "src0", "src1", "vcc_in")
        else:
            ops, roles = (d, a, b), ("vdst", "src0", "src1")
        return Instruction(off, words, "VOP2", opc, op, op.name + "_e32", ops, roles,
                           literal=lit, fields={"vdst": vd, "src0": s0, "vsrc1": vs1})  # fmt: skip

    def _vop1(self, off: int, w: int, w1: int | None) -> Instruction:
        opc = _bits(w, 9, 8)
        op = self._lookup("VOP1", opc)
        s0, vd = _bits(w, 0, 9), _bits(w, 17, 8)
        if s0 == SDWA_SRC0 and op.srcs:
            return self._sdwa(off, w, self._need(w1), "VOP1", opc, op)
        if s0 == DPP_SRC0 and op.srcs:
            raise _Bad(f"{op.name}: DPP encodings are not supported")
        f = {"vdst": vd, "src0": s0}
        name = op.name + ("_e32" if op.e32 else "")
        if op.dst is None:
            if s0 or vd:
                raise _Bad(f"{op.name}: operand fields must be 0")
            return Instruction(off, (w,), "VOP1", opc, op, name, (), (), fields=f)
        words, lit = self._words(w, w1, [s0])
        d = scalar_operand(vd, op.dst) if op.kind == "readlane" else vreg(vd, op.dst)
        ops = (d, src9(s0, op.srcs[0], lit))
        return Instruction(off, words, "VOP1", opc, op, name, ops,
                           ("sdst" if op.kind == "readlane" else "vdst", "src0"), literal=lit,
                           fields=f)  # fmt: skip

    def _vopc(self, off: int, w: int, w1: int | None) -> Instruction:
        opc = _bits(w, 17, 8)
        op = self._lookup("VOPC", opc)
        s0, vs1 = _bits(w, 0, 9), _bits(w, 9, 8)
        if s0 == SDWA_SRC0:
            return self._sdwa(off, w, self._need(w1), "VOPC", opc, op)
        if s0 == DPP_SRC0:
            raise _Bad(f"{op.name}: DPP encodings are not supported")
        words, lit = self._words(w, w1, [s0])
        ops = (Operand("special", 106, 2, name="vcc", type="b64"), src9(s0, op.srcs[0], lit),
               vreg(vs1, op.srcs[1]))  # fmt: skip
        return Instruction(off, words, "VOPC", opc, op, op.name + "_e32", ops,
                           ("sdst", "src0", "src1"), literal=lit,
                           fields={"src0": s0, "vsrc1": vs1})  # fmt: skip

    def _sdwa(self, off: int, w: int, s: int, base: str, opc: int, op: Op) -> Instruction:
        """VOP1/VOP2/VOPC with src0 = 249: the SDWA dword (sub-dword selects) follows."""
        src0, dst_sel, dst_unused = _bits(s, 0, 8), _bits(s, 8, 3), _bits(s, 11, 2)
        clamp, omod = _bits(s, 13, 1), _bits(s, 14, 2)
        sel0, sext0, neg0, abs0, s0is = (_bits(s, 16, 3), _bits(s, 19, 1), _bits(s, 20, 1),
                                         _bits(s, 21, 1), _bits(s, 23, 1))  # fmt: skip
        sel1, sext1, neg1, abs1, s1is = (_bits(s, 24, 3), _bits(s, 27, 1), _bits(s, 28, 1),
                                         _bits(s, 29, 1), _bits(s, 31, 1))  # fmt: skip
        f = {"src0": src0, "dst_sel": dst_sel, "dst_unused": dst_unused, "clamp": clamp,
             "omod": omod, "src0_sel": sel0, "src0_sext": sext0, "src0_neg": neg0,
             "src0_abs": abs0, "s0": s0is, "src1_sel": sel1, "src1_sext": sext1,
             "src1_neg": neg1, "src1_abs": abs1, "s1": s1is}  # fmt: skip
        if max(sel0, sel1) > 6 or _bits(s, 22, 1) or _bits(s, 30, 1):
            raise _Bad(f"{op.name}: invalid or reserved SDWA fields")
        if base != "VOPC":  # VOPC keeps sdst and SD in bits 8-15 instead
            if dst_sel > 6 or dst_unused > 2:
                raise _Bad(f"{op.name}: invalid SDWA dst_sel or dst_unused")
            if omod:
                raise _Bad(f"{op.name}: SDWA omod is not supported by the renderer")

        def src(code: int, is_s: int, type_: str, neg: int, ab: int, sx: int) -> Operand:
            if WIDTH[type_] != 1:
                raise _Bad(f"{op.name}: SDWA takes 32-bit sources only")
            o = scalar_operand(code, type_) if is_s else vreg(code, type_)
            if o.kind == "literal":
                raise _Bad(f"{op.name}: SDWA cannot take a literal")
            return Operand(o.kind, o.index, o.width, o.value, o.name, bool(neg), bool(ab),
                           bool(sx), o.type)  # fmt: skip

        a = src(src0, s0is, op.srcs[0], neg0, abs0, sext0)
        vcc = Operand("special", 106, 2, name="vcc", type="b64")
        mods: list[tuple[str, object]] = []
        if clamp and base != "VOPC":
            mods.append(("clamp", True))
        if base == "VOPC":
            b = src(_bits(w, 9, 8), s1is, op.srcs[1], neg1, abs1, sext1)
            sd, sdst = _bits(s, 15, 1), _bits(s, 8, 7)
            if sd:
                d = scalar_operand(sdst, "b64")
            else:
                if _bits(s, 8, 7):
                    raise _Bad(f"{op.name}: SDWA sdst is set without SD")
                d = vcc
            for k in ("dst_sel", "dst_unused", "clamp", "omod"):
                del f[k]
            f.update(sd=sd, sdst=sdst)
            ops, roles = (d, a, b), ("sdst", "src0", "src1")
            mods += [("src0_sel", _SDWA_SEL[sel0]), ("src1_sel", _SDWA_SEL[sel1])]
        else:
            vd = _bits(w, 17, 8)
            d = vreg(vd, op.dst)
            f["vdst"] = vd
            if base == "VOP2":
                b = src(_bits(w, 9, 8), s1is, op.srcs[1], neg1, abs1, sext1)
                if op.kind == "cndmask":
                    ops, roles = (d, a, b, vcc), ("vdst", "src0", "src1", "vcc_in")
                elif op.kind == "carryout":
                    ops, roles = (d, vcc, a, b), ("vdst", "vcc_out", "src0", "src1")
                elif op.kind == "carry":
                    ops, roles = (d, vcc, a, b, vcc), ("vdst", "vcc_out", "src0", "src1", "vcc_in")
                else:
                    ops, roles = (d, a, b), ("vdst", "src0", "src1")
            else:
                if sel1 or sext1 or neg1 or abs1 or s1is:
                    raise _Bad(f"{op.name}: src1 SDWA fields set on a VOP1")
                ops, roles = (d, a), ("vdst", "src0")
            if WIDTH[op.dst] == 1:
                mods += [("dst_sel", _SDWA_SEL[dst_sel]), ("dst_unused", _SDWA_UNUSED[dst_unused])]
            elif dst_sel != 6 or dst_unused:
                raise _Bad(f"{op.name}: a 64-bit destination takes no dst_sel")
            mods.append(("src0_sel", _SDWA_SEL[sel0]))
            if base == "VOP2":
                mods.append(("src1_sel", _SDWA_SEL[sel1]))
        return Instruction(off, (w, s), "SDWA", opc, op, op.name + "_sdwa", ops, roles,
                           tuple(mods), fields={**f, "encoding": {"VOP1": 1, "VOP2": 2, "VOPC": 3}[base]})  # fmt: skip

    # ---- vector ALU, 64-bit encodings
    def _vop3(self, off: int, w: int, w1: int) -> Instruction:
        opc = _bits(w, 16, 10)
        vd, absm, opsel, clamp = _bits(w, 0, 8), _bits(w, 8, 3), _bits(w, 11, 4), _bits(w, 15, 1)
        s = [_bits(w1, 0, 9), _bits(w1, 9, 9), _bits(w1, 18, 9)]
        omod, neg = _bits(w1, 27, 2), _bits(w1, 29, 3)
        f = {"vdst": vd, "abs": absm, "op_sel": opsel, "clamp": clamp, "src0": s[0],
             "src1": s[1], "src2": s[2], "omod": omod, "neg": neg}  # fmt: skip
        if LITERAL in s:
            raise _Bad("VOP3 cannot take a literal constant on this target")
        if opc < 0x100:
            op, src_from, sfx = self._lookup("VOP3", opc, "VOPC"), "VOPC", "_e64"
        elif opc < 0x140:
            op, src_from, sfx = self._lookup("VOP3", opc - 0x100, "VOP2"), "VOP2", "_e64"
        elif opc < 0x1C0:
            op, src_from, sfx = self._lookup("VOP3", opc - 0x140, "VOP1"), "VOP1", "_e64"
        else:
            op, src_from, sfx = self._lookup("VOP3", opc), "VOP3", ""
        if src_from != "VOP3" and not op.e32:
            sfx = ""
        srcs = list(op.srcs)
        vop3b = op.kind in ("vop3b", "carryout", "carry")
        if op.kind in ("cndmask", "carry"):
            srcs.append("b64")  # the condition / carry-in, an SGPR pair
        # "mac" (v_fmac_f32_e64): src2 is the tied destination and is not printed
        ops: list[Operand] = []
        roles: list[str] = []
        if src_from == "VOPC":
            ops.append(scalar_operand(vd, "b64"))
            roles.append("sdst")
        elif op.kind == "readlane":
            ops.append(scalar_operand(vd, op.dst))
            roles.append("sdst")
        elif op.dst is not None:
            ops.append(vreg(vd, op.dst))
            roles.append("vdst")
        if vop3b:
            sd = _bits(w, 8, 7)
            f["sdst"] = sd
            ops.append(scalar_operand(sd, "b64"))
            roles.append("sdst")
            absm = opsel = 0  # VOP3b: bits 8-14 hold sdst, there are no abs or op_sel bits
            f.update(abs=0, op_sel=0)
        for i, ty in enumerate(srcs):
            o = src9(s[i], ty)
            if absm >> i & 1 or neg >> i & 1:
                if o.kind == "literal":
                    raise _Bad("modifier on a literal")
                o = Operand(o.kind, o.index, o.width, o.value, o.name, bool(neg >> i & 1),
                            bool(absm >> i & 1), False, o.type)  # fmt: skip
            ops.append(o)
            roles.append(f"src{i}")
        n = len(srcs)
        for i in range(n, 3):
            if s[i] or neg >> i & 1 or absm >> i & 1:
                raise _Bad(f"{op.name}: unused source field src{i} is set")
        mods: list[tuple[str, object]] = []
        if op.opsel_dst:
            if opsel:
                bits_ = [opsel >> i & 1 for i in range(n)] + [opsel >> 3 & 1]
                if any(opsel >> i & 1 for i in range(n, 3)):
                    raise _Bad(f"{op.name}: op_sel set for a missing source")
                mods.append(("op_sel", tuple(bits_)))
        elif opsel:
            raise _Bad(f"{op.name}: op_sel is not supported for this opcode")
        if clamp:
            mods.append(("clamp", True))
        if omod:
            mods.append({1: ("mul", 2), 2: ("mul", 4), 3: ("div", 2)}[omod])
        return Instruction(off, (w, w1), "VOP3", opc, op, op.name + sfx, tuple(ops), tuple(roles),
                           tuple(mods), fields={**f, "from": {"VOPC": 0, "VOP2": 2, "VOP1": 1, "VOP3": 3}[src_from]})  # fmt: skip

    def _vop3p(self, off: int, w: int, w1: int) -> Instruction:
        opc = _bits(w, 16, 7)
        if opc in self.t["MAI"]:
            return self._mai(off, w, w1, opc)
        op = self._lookup("VOP3P", opc)
        vd, neg_hi, opsel, opsel_hi2, clamp = (_bits(w, 0, 8), _bits(w, 8, 3), _bits(w, 11, 3),
                                               _bits(w, 14, 1), _bits(w, 15, 1))  # fmt: skip
        s = [_bits(w1, 0, 9), _bits(w1, 9, 9), _bits(w1, 18, 9)]
        opsel_hi = _bits(w1, 27, 2) | (opsel_hi2 << 2)
        neg_lo = _bits(w1, 29, 3)
        f = {"vdst": vd, "neg_hi": neg_hi, "op_sel": opsel, "op_sel_hi": opsel_hi,
             "clamp": clamp, "src0": s[0], "src1": s[1], "src2": s[2], "neg_lo": neg_lo}  # fmt: skip
        if LITERAL in s:
            raise _Bad("VOP3P cannot take a literal constant on this target")
        n = len(op.srcs)
        if op.kind in ("acc_read", "acc_write"):
            if s[1] or s[2] or opsel or neg_lo or neg_hi or clamp:
                raise _Bad(f"{op.name}: only vdst and src0 may be set")
            if op.kind == "acc_read":
                if s[0] < 256:
                    raise _Bad(f"{op.name}: src0 must be an AGPR")
                ops = (vreg(vd, "b32"), vreg(s[0] - 256, "b32", "a"))
            else:
                ops = (vreg(vd, "b32", "a"), src9(s[0], "b32"))
            return Instruction(off, (w, w1), "VOP3P", opc, op, op.name, ops, ("vdst", "src0"),
                               (), fields=f)  # fmt: skip
        ops = [vreg(vd, op.dst)]
        for i, ty in enumerate(op.srcs):
            ops.append(src9(s[i], ty))
        for i in range(n, 3):
            if s[i] or opsel >> i & 1 or neg_lo >> i & 1 or neg_hi >> i & 1:
                raise _Bad(f"{op.name}: unused source field src{i} is set")
        mods: list[tuple[str, object]] = []
        if opsel:
            mods.append(("op_sel", tuple(opsel >> i & 1 for i in range(n))))
        default_hi = (1 << n) - 1
        if (opsel_hi & default_hi) != default_hi:
            mods.append(("op_sel_hi", tuple(opsel_hi >> i & 1 for i in range(n))))
        if opsel_hi >> n and n < 3 and (opsel_hi >> n) != (0b111 >> n):
            raise _Bad(f"{op.name}: op_sel_hi set for a missing source")
        if neg_lo:
            mods.append(("neg_lo", tuple(neg_lo >> i & 1 for i in range(n))))
        if neg_hi:
            mods.append(("neg_hi", tuple(neg_hi >> i & 1 for i in range(n))))
        if clamp:
            mods.append(("clamp", True))
        roles = ("vdst",) + tuple(f"src{i}" for i in range(n))
        return Instruction(off, (w, w1), "VOP3P", opc, op, op.name, tuple(ops), roles,
                           tuple(mods), fields=f)  # fmt: skip

    def _mai(self, off: int, w: int, w1: int, opc: int) -> Instruction:
        op = self.t["MAI"][opc]
        vd, cbsz, abid, acc_cd = _bits(w, 0, 8), _bits(w, 8, 3), _bits(w, 11, 4), _bits(w, 15, 1)
        s = [_bits(w1, 0, 9), _bits(w1, 9, 9), _bits(w1, 18, 9)]
        acc, blgp = _bits(w1, 27, 2), _bits(w1, 29, 3)
        f = {"vdst": vd, "cbsz": cbsz, "abid": abid, "acc_cd": acc_cd, "src0": s[0],
             "src1": s[1], "src2": s[2], "acc": acc, "blgp": blgp}  # fmt: skip
        if LITERAL in s:
            raise _Bad("MFMA cannot take a literal constant")
        kind_cd = "a" if acc_cd else "v"
        ops = [vreg(vd, op.dst, kind_cd)]
        for i in range(2):
            if s[i] < 256:
                raise _Bad(f"{op.name}: src{i} must be a vector register")
            ops.append(vreg(s[i] - 256, op.srcs[i], "a" if acc >> i & 1 else "v"))
        c = s[2]
        ops.append(
            vreg(c - 256, op.srcs[2], kind_cd) if c >= 256 else scalar_operand(c, op.srcs[2])
        )
        if ops[-1].kind in ("s", "special", "literal"):
            raise _Bad(f"{op.name}: srcC must be a register tile or an inline constant")
        mods: list[tuple[str, object]] = []
        if cbsz:
            mods.append(("cbsz", cbsz))
        if abid:
            mods.append(("abid", abid))
        if blgp:
            mods.append(("blgp", blgp))
        return Instruction(off, (w, w1), "MAI", opc, op, op.name, tuple(ops),
                           ("vdst", "src0", "src1", "src2"), tuple(mods), fields=f)  # fmt: skip

    # ---- LDS
    def _ds(self, off: int, w: int, w1: int) -> Instruction:
        opc = _bits(w, 17, 8)
        op = self._lookup("DS", opc)
        o0, o1, gds, acc = _bits(w, 0, 8), _bits(w, 8, 8), _bits(w, 16, 1), _bits(w, 25, 1)
        addr, d0, d1, vd = _bits(w1, 0, 8), _bits(w1, 8, 8), _bits(w1, 16, 8), _bits(w1, 24, 8)
        f = {"offset0": o0, "offset1": o1, "gds": gds, "acc": acc, "addr": addr, "data0": d0,
             "data1": d1, "vdst": vd}  # fmt: skip
        k = "a" if acc else "v"
        a = vreg(addr, "b32")
        offset = o0 | (o1 << 8)
        mods: list[tuple[str, object]] = []
        used = {"addr"}
        if op.kind == "read":
            ops, roles = (vreg(vd, op.dst, k), a), ("vdst", "addr")
            used.add("vdst")
        elif op.kind == "write":
            ops, roles = (a, vreg(d0, op.srcs[0], k)), ("addr", "data0")
            used.add("data0")
        elif op.kind == "read2":
            ops, roles = (vreg(vd, op.dst, k), a), ("vdst", "addr")
            used.add("vdst")
        elif op.kind == "write2":
            ops = (a, vreg(d0, op.srcs[0], k), vreg(d1, op.srcs[0], k))
            roles = ("addr", "data0", "data1")
            used |= {"data0", "data1"}
        elif op.kind == "permute":
            ops, roles = (
                (vreg(vd, op.dst, k), a, vreg(d0, op.srcs[0], k)),
                ("vdst", "addr", "data0"),
            )
            used |= {"vdst", "data0"}
        elif op.kind == "swizzle":
            ops, roles = (vreg(vd, op.dst, k), a), ("vdst", "addr")
            used.add("vdst")
        else:
            raise AssertionError(op.kind)
        for nm, v in (("data0", d0), ("data1", d1), ("vdst", vd)):
            if nm not in used and v:
                raise _Bad(f"{op.name}: unused field {nm} is set")
        if op.kind in ("read2", "write2"):
            if o0:
                mods.append(("offset0", o0))
            if o1:
                mods.append(("offset1", o1))
        elif op.kind == "swizzle":
            if offset:
                mods.append(("offset", swizzle_text(offset)))
        elif offset:
            mods.append(("offset", offset))
        if gds:
            mods.append(("gds", True))
        return Instruction(off, (w, w1), "DS", opc, op, op.name, ops, roles, tuple(mods), fields=f)

    # ---- global memory
    def _flat(self, off: int, w: int, w1: int) -> Instruction:
        opc = _bits(w, 18, 7)
        seg = _bits(w, 14, 2)
        if seg not in FLAT_SEGMENTS:
            raise _Bad(f"FLAT segment {seg} (scratch or reserved) is not supported")
        op = self._lookup("FLAT", opc)
        lds, sc0, nt, sc1 = _bits(w, 13, 1), _bits(w, 16, 1), _bits(w, 17, 1), _bits(w, 25, 1)
        addr, data, saddr, acc, vd = (_bits(w1, 0, 8), _bits(w1, 8, 8), _bits(w1, 16, 7),
                                      _bits(w1, 23, 1), _bits(w1, 24, 8))  # fmt: skip
        raw_off = _bits(w, 0, 13)
        f = {"offset": raw_off, "lds": lds, "seg": seg, "sc0": sc0, "nt": nt, "sc1": sc1,
             "addr": addr, "data": data, "saddr": saddr, "acc": acc, "vdst": vd}  # fmt: skip
        if lds:
            raise _Bad("FLAT lds (load to LDS) is not supported")
        prefix = FLAT_SEGMENTS[seg]
        k = "a" if acc else "v"
        if seg == 0:
            if saddr != 0x7F:
                raise _Bad("flat_* takes no scalar address (saddr must be off)")
            offset = raw_off & 0xFFF
            if raw_off >> 12:
                raise _Bad("flat_* offset bit 12 is set")
            vaddr = vreg(addr, "b64")
            sa: tuple[Operand, ...] = ()
        else:
            offset = _sext(raw_off, 13)
            if saddr == 0x7F:
                vaddr, sa = vreg(addr, "b64"), (Operand("off"),)
            else:
                vaddr, sa = vreg(addr, "b32"), (scalar_operand(saddr, "b64"),)
        sar = ("saddr",) if sa else ()
        if op.kind == "load":
            if data:
                raise _Bad(f"{op.name}: data field set on a load")
            ops, roles = (vreg(vd, op.dst, k), vaddr, *sa), ("vdst", "vaddr", *sar)
        elif op.kind == "store":
            if vd:
                raise _Bad(f"{op.name}: vdst field set on a store")
            ops, roles = (vaddr, vreg(data, op.srcs[0], k), *sa), ("vaddr", "vdata", *sar)
        else:
            dv = vreg(data, op.srcs[0], k)
            if sc0:  # returns the old value
                ops, roles = (vreg(vd, op.dst, k), vaddr, dv, *sa), ("vdst", "vaddr", "vdata", *sar)
            else:
                if vd:
                    raise _Bad(f"{op.name}: vdst set on an atomic without return")
                ops, roles = (vaddr, dv, *sa), ("vaddr", "vdata", *sar)
        mods: list[tuple[str, object]] = []
        if offset:
            mods.append(("offset", offset))
        for nm, v in (("sc0", sc0), ("sc1", sc1), ("nt", nt)):
            if v:
                mods.append((nm, True))
        return Instruction(off, (w, w1), "FLAT", opc, op, f"{prefix}_{op.name}", ops, roles,
                           tuple(mods), fields=f)  # fmt: skip

    def _mubuf(self, off: int, w: int, w1: int) -> Instruction:
        opc = _bits(w, 18, 7)
        op = self._lookup("MUBUF", opc)
        sc0, sc1, nt = _bits(w, 14, 1), _bits(w, 15, 1), _bits(w, 17, 1)
        f = {"sc0": sc0, "sc1": sc1, "nt": nt}
        if (w & ~((0x7F << 18) | (0x3F << 26) | (1 << 14) | (1 << 15) | (1 << 17))) or w1:
            raise _Bad(f"{op.name}: takes no address or data operands")
        mods = tuple((nm, True) for nm, v in (("sc0", sc0), ("sc1", sc1), ("nt", nt)) if v)
        return Instruction(off, (w, w1), "MUBUF", opc, op, op.name, (), (), mods, fields=f)


class _Waitcnt(Instruction):
    """s_waitcnt prints its counters separated by spaces, not commas."""

    def text(self) -> str:
        return self.name + " " + " ".join(o.name for o in self.operands)


def swizzle_text(offset: int) -> str:
    """The ``ds_swizzle_b32`` offset in LLVM's ``swizzle(...)`` macro syntax (LLVM "AMDGPU
    Modifier Syntax", ``swizzle pattern``); a pattern with no macro form prints as a number."""
    if offset & 0x8000:
        lanes = [(offset >> (2 * i)) & 3 for i in range(4)]
        if offset & 0x7F00:
            return str(offset)
        return "swizzle(QUAD_PERM," + ",".join(map(str, lanes)) + ")"
    and_m, or_m, xor_m = offset & 0x1F, (offset >> 5) & 0x1F, (offset >> 10) & 0x1F
    if and_m == 0x1F and or_m == 0 and xor_m and xor_m & (xor_m - 1) == 0:
        return f"swizzle(SWAP,{xor_m})"
    if and_m == 0x1F and or_m == 0 and xor_m and (xor_m + 1) & xor_m == 0:
        return f"swizzle(REVERSE,{xor_m + 1})"
    for size_log in range(1, 6):
        size = 1 << size_log
        if xor_m == 0 and and_m == (0x1F & ~(size - 1)) and or_m < size:
            return f"swizzle(BROADCAST,{size},{or_m})"
    chars = []
    for bit in range(4, -1, -1):
        a, o, x = and_m >> bit & 1, or_m >> bit & 1, xor_m >> bit & 1
        if a and not o:
            chars.append("i" if x else "p")
        elif not a and not x:
            chars.append("1" if o else "0")
        else:
            return str(offset)
    return f'swizzle(BITMASK_PERM,"{"".join(chars)}")'


# ------------------------------------------------------------------------------ kernels
@dataclass(frozen=True)
class DecodedKernel:
    kernel: KernelCode
    instructions: tuple[Instruction, ...]

    def at(self, offset: int) -> Instruction:
        for inst in self.instructions:
            if inst.offset == offset:
                return inst
        raise KeyError(f"{self.kernel.name}: no instruction starts at offset 0x{offset:x}")

    def text(self) -> list[str]:
        return [i.text() for i in self.instructions]


LONG_JUMP = "s_setpc_b64"


def _constant(o: Operand, literal: int | None) -> int | None:
    """The 32 bits of a literal or inline integer source; None for anything else."""
    if o.kind == "literal":
        return literal
    if o.kind == "const" and isinstance(o.value, int):
        return o.value & 0xFFFFFFFF
    return None


def _resolve_long_jumps(insts: list[Instruction], kernel: str) -> list[Instruction]:
    """Give each ``s_setpc_b64`` of LLVM's long branch its static target (field ``target``).

    LLVM's branch relaxation (a branch further than the 16-bit word offset reaches, in code
    over 128 KB) emits ``s_getpc_b64 s[a:a+1]; s_add_u32 sa, sa, lo; s_addc_u32 sa+1, sa+1,
    hi; s_setpc_b64 s[a:a+1]``: the target is the address after ``s_getpc_b64`` plus the
    64-bit literal. Any other ``s_setpc_b64`` is a computed jump and stays unresolved (the
    flow graph refuses it)."""
    out = list(insts)
    for i in range(3, len(out)):
        jump = out[i]
        if jump.base != LONG_JUMP:
            continue
        getpc, lo, hi = out[i - 3], out[i - 2], out[i - 1]
        reg = jump.operands[0]
        pc = getpc.operands[0] if getpc.base == "s_getpc_b64" else None
        ok = (
            pc is not None
            and reg.kind == pc.kind == "s"
            and reg.index == pc.index
            and lo.base == "s_add_u32"
            and hi.base == "s_addc_u32"
            and [(o.kind, o.index) for o in lo.operands[:2]] == [("s", reg.index)] * 2
            and [(o.kind, o.index) for o in hi.operands[:2]] == [("s", reg.index + 1)] * 2
        )
        parts = [_constant(x.operands[2], x.literal) for x in (lo, hi)] if ok else [None]
        if None in parts:
            continue
        delta = (parts[0] | parts[1] << 32) & ((1 << 64) - 1)
        target = (getpc.offset + getpc.size + delta) & ((1 << 64) - 1)
        if target >= 1 << 63:
            target -= 1 << 64
        out[i] = replace(jump, fields={**jump.fields, "target": target})
    return out


def decode_kernel(code_object: bytes | CodeObject, name: str | None = None) -> DecodedKernel:
    """Decode kernel ``name`` (the only kernel when None) of a code object."""
    co = code_object if isinstance(code_object, CodeObject) else CodeObject(code_object)
    if name is None:
        names = co.kernel_names()
        if len(names) != 1:
            raise ValueError(
                f"the code object has {len(names)} kernels ({', '.join(names)}): name one"
            )
        name = names[0]
    k = co.kernel(name)
    insts = _resolve_long_jumps(Decoder(k.arch).decode(k.code, k.name), k.name)
    for inst in insts:
        if "target" in inst.fields and not (0 <= inst.fields["target"] < len(k.code)):
            raise DecodeError(k.name, inst.offset, inst.words,
                              f"long jump target 0x{inst.fields['target']:x} is outside the kernel")  # fmt: skip
        for o in inst.operands:
            if o.kind == "target" and not (0 <= int(o.value) < len(k.code)):
                raise DecodeError(k.name, inst.offset, inst.words,
                                  f"branch target 0x{int(o.value):x} is outside the kernel")  # fmt: skip
    return DecodedKernel(k, tuple(insts))
