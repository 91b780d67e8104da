"""The flow and sync tests' gfx942 encodings assembled by hand (CDNA3 ISA reference guide,
chapter 12 "Microcode Formats"; the executor's tests have their own, ``tests/emulator/asm.py``),
with labels and cache bits, so the flow graph and the sync checks can be tested on small kernels
without a compile. ``tests/emulator/test_flow.py`` checks that the decoder renders each of them
as LLVM prints it, so a wrong encoding here fails there."""

from __future__ import annotations

from mono_aot.emulator.decode import DecodedKernel, decode_kernel
from tests.emulator.elfbuild import code_object, words

_SOPP = {"s_nop": 0, "s_endpgm": 1, "s_branch": 2, "s_cbranch_scc0": 4, "s_cbranch_scc1": 5,
         "s_cbranch_vccz": 6, "s_cbranch_vccnz": 7, "s_cbranch_execz": 8, "s_cbranch_execnz": 9,
         "s_barrier": 10, "s_sleep": 14}  # fmt: skip
_SOP2 = {"s_sub_u32": 1, "s_cselect_b32": 10, "s_and_b32": 12}
_SOPC = {"s_cmp_eq_u32": 6, "s_cmp_lt_u32": 10}
_FLAT = {"global_load_dword": 0x14, "global_store_dword": 0x1C, "global_atomic_swap": 0x40}
_CONST = {0: 128, 1: 129}


class Asm:
    """Appends instructions; branches name labels, resolved by ``code()``."""

    def __init__(self) -> None:
        self.ws: list[int] = []
        self.labels: dict[str, int] = {}
        self.fixups: list[tuple[int, str]] = []

    @property
    def here(self) -> int:
        """Byte offset of the next instruction."""
        return 4 * len(self.ws)

    def label(self, name: str) -> Asm:
        self.labels[name] = self.here
        return self

    def sopp(self, name: str, simm: int = 0) -> Asm:
        self.ws.append(0xBF800000 | _SOPP[name] << 16 | simm)
        return self

    def branch(self, name: str, label: str) -> Asm:
        self.fixups.append((len(self.ws), label))
        return self.sopp(name)

    def waitcnt_vm0(self) -> Asm:
        self.ws.append(0xBF8C0F70)  # s_waitcnt vmcnt(0): expcnt 7, lgkmcnt 15 = not waited
        return self

    def sop2(self, name: str, d: int, s0: int, s1: int, *, consts: bool = False) -> Asm:
        """``name sD, sS0, sS1`` (``consts``: s0/s1 are the inline constants 0/1)."""
        a, b = (_CONST[s0], _CONST[s1]) if consts else (s0, s1)
        self.ws.append(0x80000000 | _SOP2[name] << 23 | d << 16 | b << 8 | a)
        return self

    def sopc(self, name: str, s0: int, s1: int) -> Asm:
        self.ws.append(0xBF000000 | _SOPC[name] << 16 | s1 << 8 | s0)
        return self

    def memrealtime(self, d: int) -> Asm:
        self.ws += [0xC0000000 | 37 << 18 | d << 6, 0]
        return self

    def s_load_dword(self, d: int, base: int) -> Asm:
        self.ws += [0xC0000000 | 1 << 17 | d << 6 | base >> 1, 0]  # imm = 1, offset 0
        return self

    def readfirstlane(self, sd: int, v: int) -> Asm:
        self.ws.append(0x7E000000 | sd << 17 | 2 << 9 | 256 + v)
        return self

    def flat(self, name: str, *, addr: int, data: int = 0, vdst: int = 0, sc0: bool = False,
             sc1: bool = False) -> Asm:  # fmt: skip
        """A ``global_*`` instruction with a 64-bit VGPR address and no scalar base."""
        w0 = 0xDC000000 | _FLAT[name] << 18 | 2 << 14 | int(sc0) << 16 | int(sc1) << 25
        self.ws += [w0, addr | data << 8 | 0x7F << 16 | vdst << 24]
        return self

    def cache(self, name: str, *, sc0: bool = False, sc1: bool = False) -> Asm:
        """``buffer_wbl2`` or ``buffer_inv`` with the given scope bits."""
        op = {"buffer_wbl2": 0x28, "buffer_inv": 0x29}[name]
        self.ws += [0xE0000000 | op << 18 | int(sc0) << 14 | int(sc1) << 15, 0]
        return self

    def code(self) -> bytes:
        ws = list(self.ws)
        for i, lab in self.fixups:
            rel = (self.labels[lab] - 4 * (i + 1)) // 4
            ws[i] |= rel & 0xFFFF
        return words(*ws)

    def kernel(self) -> DecodedKernel:
        return decode_kernel(code_object(self.code()))
