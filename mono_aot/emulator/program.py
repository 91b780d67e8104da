"""Pre-compile decoded instructions into Python closures, once per kernel.

Each instruction becomes ``fn(wave) -> int``: it executes on the wave and returns the index of
the next instruction, or ``~index`` (negative) when the wave must yield to the scheduler after
it (``s_sleep``, ``s_barrier``, ``s_endpgm``, atomics, an ``s_waitcnt`` that waited). Operand
fetchers are bound to register indices and the lane operation is bound at load time, so running
an instruction is one call.

What the executor does around a lane operation (the contract in ``lanes.py``), per the CDNA3 ISA
guide ("AMD Instinct MI300 ISA", chapters "Vector ALU Operations" and "Microcode Formats"):

* sources: SGPRs and constants are broadcast to 64 lanes; inline constants take the operand
  type's encoding (f32 bits for 32-bit operands, f64 bits for 64-bit ones, f16 bits for 16-bit
  ones; integers sign-extended); a 32-bit literal used as a 64-bit integer operand must be
  below 2**31 (zero- and sign-extension agree there; anything else is refused at load).
* VOP3 ``abs``/``neg`` act on the sign bit of the source's float type (bit 31; bit 63 of a
  64-bit source; bit 15 of a 16-bit one); VOP3 ``op_sel`` bit i on a source passes its high
  16-bit word in the low 16 bits; ``op_sel[3]`` (``opsel_dst`` opcodes) sets ``ctx.dst_word``
  and ``ctx.old_dst`` and the operation returns the merged dword.
* SDWA: ``src*_sel`` extracts the byte/word (zero- or, with ``sext``, sign-extended) before
  ``neg``/``abs``; ``dst_sel`` places the result's low bits with ``dst_unused`` padding (zero),
  sign extension or preservation of the old destination bits.
* VOP3P packed f32: each 64-bit source is passed as ``(64, 2)`` with column 0 = the dword
  ``op_sel[i]`` selects and column 1 = the one ``op_sel_hi[i]`` selects, then ``neg_lo``/
  ``neg_hi`` flip the sign of column 0/1. ``v_pk_mov_b32`` is the executor's: D.lo =
  S0[op_sel[0]], D.hi = S1[op_sel[1]], op_sel_hi ignored (the ISA guide's pseudo-code names
  only OPSEL; LLVM lowers a 64-bit copy and a word swap to it with equal op_sel_hi and op_sel
  [0,1] vs [1,0]); neg and clamp, which the pseudo-code does not define, are refused.
* ``v_fmac_f32`` (``mac``): the accumulator (the old destination) is the third source and also
  ``ctx.old_dst``; carry-in, ``v_cndmask`` select and ``v_div_fmas`` VCC arrive as ``ctx.mask``.
* results are written under EXEC; a compare's mask (and a carry-out) is written to VCC or the
  SGPR pair with inactive lanes 0; ``v_cmpx`` also writes EXEC; float ``clamp`` (f32 to
  [0, 1], NaN to 0) is applied by the executor to float results, integer ``clamp`` is passed
  as ``ctx.clamp``; ``omod`` is refused (no shipped kernel uses it).
"""

from __future__ import annotations

import functools
import inspect
import struct
from collections.abc import Callable, Mapping

import numpy as np

from mono_aot.emulator import scalar as S
from mono_aot.emulator.decode import DecodedKernel, Instruction, Operand
from mono_aot.emulator.fuse import fuse_blocks
from mono_aot.emulator.lanes import OpContext
from mono_aot.emulator.wave import (
    EXEC_HI,
    EXEC_LO,
    LANES,
    VCC_HI,
    VCC_LO,
    Fault,
    Pending,
    Wave,
    bits_of,
)

Step = Callable[[Wave], int]
M32 = 0xFFFFFFFF
M64 = (1 << 64) - 1
SHARED_APERTURE_HI = 0x10000  # src_shared_base: the flat address of LDS is this << 32
PRIVATE_APERTURE_HI = 0x20000
_U32 = np.uint32


class LoadError(Exception):
    """An instruction the executor cannot run as encoded: (offset, text, why)."""


class Config:
    """What compiling a kernel needs besides its instructions."""

    def __init__(self, arch: str, accum: int, vregs: int, ops: Mapping[str, Callable],
                 mfma: Callable | None, memory, kernel: str) -> None:  # fmt: skip
        self.arch, self.accum, self.vregs, self.ops = arch, accum, vregs, ops
        self.mfma, self.memory, self.kernel = mfma, memory, kernel


class Compiled:
    """A kernel's closures and, per instruction, the registers it reads and writes."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.reads_v: list[tuple[int, ...]] = []
        self.writes_v: list[tuple[int, ...]] = []
        self.reads_s: list[tuple[int, ...]] = []
        self.writes_s: list[tuple[int, ...]] = []
        # per instruction, every vector / scalar register it reads or writes (the scheduler's
        # quick test before ``Wave.hazard`` names the offending one)
        # per instruction: None, or for a "plain" VALU instruction (writes one vector
        # destination under EXEC and nothing else, never yields) a tuple (packed, ...) where
        # packed is None or, for a packed-f32 elementwise operation on VGPR sources,
        # (fn, source rows ((lo, hi) per source), destination rows (lo, hi)) (``fuse.py``)
        self.plain: list[tuple | None] = []
        # per instruction: None, or the scalar registers it reads as values (not EXEC, not a
        # lane-mask source) when it may run once for a ``gang.Gang`` of waves: a VALU
        # instruction that writes only a vector destination under EXEC; the gang runs it when
        # these registers hold the same value in every wave of the gang
        self.gang: list[tuple[int, ...] | None] = []
        # per gang-able instruction, the closure a gang runs when it is not the wave's own
        # (None: ``steps``): loads, whose accesses in flight are each member's, and VALU
        # instructions that write a lane mask (compares, carry-outs) to each member's SGPRs
        self.gang_steps: list[Step | None] = []
        # per instruction: whether it accesses memory or retires accesses (s_waitcnt): a
        # gang's union of registers in flight (``gang.Gang.clear_of_loads``) may change after
        self.memory: list[bool] = []
        # per instruction: None, or (the scalar registers it reads, those it writes) when it
        # is a pure function of what it reads and SCC (the scalar ALU, branches, s_nop): a
        # gang runs it once on its first member when every member holds the same values in
        # the registers read and in SCC, and gives the others the registers written and SCC
        # (``gang.Gang.scalar_agrees``, ``Gang.copy_scalar``)
        self.scalar: list[tuple[tuple[int, ...], tuple[int, ...]] | None] = []
        self.blocks: list = []  # fuse.Block | None per instruction
        self.touch_v: list[frozenset[int]] = []
        self.touch_s: list[frozenset[int]] = []
        # per instruction: whether it writes EXEC (a gang whose members ran it one by one
        # then refreshes its EXEC)
        self.writes_exec: list[bool] = []
        self.missing: dict[str, int] = {}  # lane operation not available -> uses
        self.counts: dict[str, int] = {}


_MEMORY_FORMATS = frozenset({"SMEM", "DS", "FLAT", "MUBUF"})

# SOPP instructions that only choose the next instruction from SGPRs, SCC and EXEC (or nothing)
_SCALAR_SOPP = frozenset({"s_nop", "s_setprio", "s_icache_inv", "s_wakeup", "s_branch"})


def _scalar_only(inst: Instruction) -> bool:
    """Whether ``inst`` reads and writes nothing but SGPRs (its listed ones, EXEC among them),
    SCC and the PC: every scalar ALU opcode the executor has (``scalar.py``; it has none that
    reads hardware registers or indexes SGPRs by M0), branches and the no-ops."""
    if inst.fmt in ("SOP1", "SOP2", "SOPC", "SOPK"):
        return True
    return inst.fmt == "SOPP" and (inst.base in _SCALAR_SOPP or inst.base.startswith("s_cbranch"))


# ------------------------------------------------------------------------------ constants
def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _f64_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def _f16_bits(x: float) -> int:
    return struct.unpack("<H", struct.pack("<e", x))[0]


def const_bits(o: Operand, width_bits: int) -> int:
    """The bits an inline constant or literal stands for in an operand of ``o.type``."""
    if o.kind == "literal":
        v = int(o.value)
        if width_bits == 64:
            if o.type == "f64":
                return v << 32  # a 32-bit literal gives the high dword of an f64
            if v >> 31:
                raise LoadError(f"a 32-bit literal 0x{v:x} with bit 31 set as a 64-bit integer")
        return v
    v = o.value
    if isinstance(v, float):
        if o.type in ("f16", "b16"):
            return _f16_bits(v)
        if width_bits == 64:
            return _f64_bits(v)
        return _f32_bits(v)
    return int(v) & ((1 << width_bits) - 1)


# ------------------------------------------------------------------------------ compiler
class Compiler:
    def __init__(self, cfg: Config, dk: DecodedKernel) -> None:
        self.cfg = cfg
        self.dk = dk
        self.index = {inst.offset: i for i, inst in enumerate(dk.instructions)}
        self.out = Compiled()

    # ---- registers
    def vrow(self, o: Operand) -> int:
        if o.kind == "v":
            r = o.index
            if r + o.width > self.cfg.accum:
                raise LoadError(
                    f"v{r}..v{r + o.width - 1} reach past the architected VGPRs "
                    f"(accum_offset {self.cfg.accum})"
                )
        elif o.kind == "a":
            r = self.cfg.accum + o.index
        else:
            raise LoadError(f"operand {o.text()} is not a vector register")
        if r + o.width > self.cfg.vregs:
            raise LoadError(
                f"{o.text()} is beyond the {self.cfg.vregs} vector registers the kernel "
                "descriptor allocates"
            )
        return r

    @staticmethod
    def srows(o: Operand) -> tuple[int, ...]:
        if o.kind in ("s", "special") and o.index < 128:
            return tuple(range(o.index, o.index + o.width))
        return ()

    def vrows(self, o: Operand) -> tuple[int, ...]:
        if o.kind in ("v", "a"):
            r = self.vrow(o)
            return tuple(range(r, r + o.width))
        return ()

    # ---- scalar operand readers: value as an int of the operand's width (32 or 64 bits)
    def sread(self, o: Operand) -> Callable[[Wave], int]:
        wbits = 64 if o.width == 2 else 32
        if o.kind in ("const", "literal"):
            c = const_bits(o, wbits)
            return lambda w: c
        if o.kind == "special":
            code = o.index
            if code == 253:
                return lambda w: w.scc
            if code == 251:
                return lambda w: int(w.s[VCC_LO] == 0 and w.s[VCC_HI] == 0)
            if code == 252:
                return lambda w: int(w.s[EXEC_LO] == 0 and w.s[EXEC_HI] == 0)
            if code in (235, 236, 237, 238):
                hi = SHARED_APERTURE_HI if code in (235, 236) else PRIVATE_APERTURE_HI
                val = hi if code in (235, 237) else hi + 0xFFFF  # base / limit (high dword)
                c = val << 32 if wbits == 64 else val
                return lambda w: c
            if code > 127:
                raise LoadError(f"source {o.name} is not supported")
        if o.kind in ("s", "special"):
            i = o.index
            if o.width == 1:
                return lambda w: w.s[i]
            if o.width == 2:
                return lambda w: w.s[i] | w.s[i + 1] << 32
        raise LoadError(f"operand {o.text()} is not a scalar source")

    def swrite(self, o: Operand) -> Callable[[Wave, int], None]:
        """A writer of a scalar destination (32 or 64 bits) that keeps the EXEC cache right."""
        if o.kind not in ("s", "special") or o.index > 127:
            raise LoadError(f"operand {o.text()} is not a scalar destination")
        i = o.index
        exec_ = i <= EXEC_HI < i + o.width or i <= EXEC_LO < i + o.width
        if o.width == 1:
            if exec_:

                def wr(w, v):
                    w.s[i] = v & M32
                    w.sync_exec()

                return wr

            def wr1(w, v):
                w.s[i] = v & M32

            return wr1
        if exec_:

            def wr2e(w, v):
                w.s[i] = v & M32
                w.s[i + 1] = (v >> 32) & M32
                w.sync_exec()

            return wr2e

        def wr2(w, v):
            w.s[i] = v & M32
            w.s[i + 1] = (v >> 32) & M32

        return wr2

    # ---- vector operand fetchers: lanes (64,) uint32 or (64, n)
    def vfetch(self, o: Operand) -> Callable[[Wave], np.ndarray]:
        if o.kind in ("v", "a"):
            r = self.vrow(o)
            if o.width == 1:
                return lambda w: w.v[r]
            n = o.width
            return lambda w: w.v[r : r + n].T.copy()
        if o.kind in ("const", "literal"):
            if o.width == 1:
                arr = np.full(LANES, const_bits(o, 32), dtype=_U32)
            elif o.width == 2:
                c = const_bits(o, 64)
                arr = np.empty((LANES, 2), dtype=_U32)
                arr[:, 0], arr[:, 1] = c & M32, c >> 32
            else:  # an MFMA accumulator tile given as an inline constant: every dword
                arr = np.full((LANES, o.width), const_bits(o, 32), dtype=_U32)
            arr.flags.writeable = False
            return lambda w: arr if w.lanes == LANES else _widen(arr, w.lanes)
        rd = self.sread(o)
        if o.width == 1:
            return lambda w: np.full(w.lanes, rd(w), dtype=_U32)

        def f2(w):
            v = rd(w)
            a = np.empty((w.lanes, 2), dtype=_U32)
            a[:, 0], a[:, 1] = v & M32, v >> 32
            return a

        return f2

    def vwrite(self, o: Operand) -> Callable[[Wave, np.ndarray], None]:
        """Write lanes (64,) or (64, n) to a vector destination under EXEC."""
        r = self.vrow(o)
        n = o.width
        if n == 1:

            def wr(w, res):
                if w.exec_all:
                    w.v[r] = res
                else:
                    np.copyto(w.v[r], res, where=w.exec_mask)

            return wr

        def wrn(w, res):
            if w.exec_all:
                w.v[r : r + n] = res.T
            else:
                np.copyto(w.v[r : r + n], res.T, where=w.exec_mask[None, :])

        return wrn

    # ---- the kernel
    def compile(self) -> Compiled:
        for inst in self.dk.instructions:
            nxt = self.index.get(inst.offset + inst.size, len(self.dk.instructions))
            self.meta = None
            self.gang_s = None
            self.gang_step = None
            try:
                step, rv, wv, rs, ws = self.one(inst, nxt)
            except LoadError as e:
                raise LoadError(f"0x{inst.offset:x}: {inst.text()}: {e}") from None
            o = self.out
            o.steps.append(step)
            o.plain.append(self.meta)
            o.gang.append(self.gang_s)
            o.gang_steps.append(self.gang_step)
            o.memory.append(inst.fmt in _MEMORY_FORMATS or inst.base == "s_waitcnt")
            o.scalar.append((tuple(sorted(set(rs))), tuple(sorted(set(ws))))
                            if _scalar_only(inst) else None)  # fmt: skip
            o.reads_v.append(rv)
            o.writes_v.append(wv)
            o.reads_s.append(rs)
            o.writes_s.append(ws)
        # the end: running past the last instruction is a fault
        o.steps.append(_off_the_end)
        for lst in (o.reads_v, o.writes_v, o.reads_s, o.writes_s):
            lst.append(())
        o.plain.append(None)
        o.gang.append(None)
        o.gang_steps.append(None)
        o.memory.append(False)
        o.scalar.append(None)
        o.touch_v = [frozenset(r + w) for r, w in zip(o.reads_v, o.writes_v, strict=True)]
        o.touch_s = [frozenset(r + w) for r, w in zip(o.reads_s, o.writes_s, strict=True)]
        o.writes_exec = [EXEC_LO in w or EXEC_HI in w for w in o.writes_s]
        o.blocks = fuse_blocks(o)
        return o

    def gang_able(self, reads_s: tuple[int, ...], lane_masks: tuple[int, ...] = (),
                  gang_step: Step | None = None) -> None:  # fmt: skip
        """Mark the instruction being compiled gang-able (``Compiled.gang``): its scalar value
        sources are ``reads_s`` but EXEC and the ``lane_masks`` rows, each member's own."""
        self.gang_s = tuple(r for r in reads_s if r not in (EXEC_LO, EXEC_HI, *lane_masks))
        self.gang_step = gang_step

    def _regs(self, inst: Instruction, reads: tuple[str, ...], writes: tuple[str, ...],
              extra_rs: tuple[int, ...] = (), extra_ws: tuple[int, ...] = ()):  # fmt: skip
        rv: list[int] = []
        wv: list[int] = []
        rs: list[int] = list(extra_rs)
        ws: list[int] = list(extra_ws)
        for o, role in zip(inst.operands, inst.roles, strict=True):
            tgt_v, tgt_s = (
                (rv, rs) if role in reads else (wv, ws) if role in writes else (None, None)
            )
            if tgt_v is None:
                continue
            tgt_v.extend(self.vrows(o))
            tgt_s.extend(self.srows(o))
        return tuple(rv), tuple(wv), tuple(rs), tuple(ws)

    def one(self, inst: Instruction, nxt: int):
        fmt = inst.fmt
        self.out.counts[inst.base] = self.out.counts.get(inst.base, 0) + 1
        if fmt in ("SOP1", "SOP2", "SOPC", "SOPK"):
            return self.salu(inst, nxt)
        if fmt == "SOPP":
            return self.sopp(inst, nxt)
        if fmt == "SMEM":
            return self.smem(inst, nxt)
        if fmt == "DS":
            return self.ds(inst, nxt)
        if fmt == "FLAT":
            return self.flat(inst, nxt)
        if fmt == "MUBUF":
            return self.mubuf(inst, nxt)
        if fmt == "MAI":
            return self.mai(inst, nxt)
        return self.valu(inst, nxt)

    # ================================================================== scalar ALU
    def salu(self, inst: Instruction, nxt: int):
        b = inst.base
        srcs = [o for o, r in zip(inst.operands, inst.roles, strict=True) if r.startswith("src")]
        regs = self._regs(inst, ("src0", "src1"), ("sdst",))
        if b == "s_setpc_b64":  # LLVM's long branch, resolved by the decoder
            if "target" not in inst.fields or inst.fields["target"] not in self.index:
                raise LoadError(f"s_setpc_b64 at 0x{inst.offset:x} is a computed jump")
            t = self.index[inst.fields["target"]]
            return (lambda w: t, *regs)
        if inst.fmt == "SOPK":
            d = inst.operand("sdst")
            k = int(inst.operand("simm16").value)
            fn = S.SOPK[b]
            rd = self.sread(d)
            if b.startswith("s_cmpk"):
                regs = (regs[0], regs[1], regs[3], ())  # reads its "destination" register

                def cmpk(w):
                    w.scc = fn(rd(w), k, w.scc)[1]
                    return nxt

                return (cmpk, *regs)
            wr = self.swrite(d)
            rv, wv, rs, ws = regs
            if b != "s_movk_i32":
                rs = rs + ws  # addk/mulk read the destination (cmovk keeps it)

            def sopk(w):
                r, c = fn(rd(w), k, w.scc)
                wr(w, r)
                if c is not None:
                    w.scc = c
                return nxt

            return sopk, rv, wv, rs, ws
        if inst.fmt == "SOPC":
            fn = S.SOPC[b]
            a, c_ = (self.sread(o) for o in srcs)

            def sopc(w):
                w.scc = fn(a(w), c_(w), w.scc)[1]
                return nxt

            return (sopc, *regs)
        d = inst.operand("sdst")
        wr = self.swrite(d)
        if b == "s_getpc_b64":
            pc = self.dk.kernel.address + inst.offset + inst.size

            def getpc(w):
                wr(w, pc)
                return nxt

            return (getpc, *regs)
        if b in S.SAVEEXEC or b in S.WREXEC:
            fn = S.SAVEEXEC.get(b) or S.WREXEC[b]
            new_to_dst = b in S.WREXEC
            a = self.sread(srcs[0])
            rv, wv, rs, ws = regs

            def saveexec(w):
                old = w.exec
                new = fn(a(w), old)
                w.set_exec(new)
                wr(w, new if new_to_dst else old)
                w.scc = int(new != 0)
                return nxt

            return saveexec, rv, wv, rs + (EXEC_LO, EXEC_HI), ws + (EXEC_LO, EXEC_HI)
        if inst.fmt == "SOP1":
            fn = S.SOP1[b]
            a = self.sread(srcs[0])
            if b in S.SOP1_READS_DST:
                old = self.sread(d)
                rv, wv, rs, ws = regs

                def sop1d(w):
                    r, c = fn(a(w), old(w), w.scc)
                    wr(w, r)
                    if c is not None:
                        w.scc = c
                    return nxt

                return sop1d, rv, wv, rs + ws, ws

            def sop1(w):
                r, c = fn(a(w), 0, w.scc)
                wr(w, r)
                if c is not None:
                    w.scc = c
                return nxt

            return (sop1, *regs)
        fn = S.SOP2[b]
        a, c_ = (self.sread(o) for o in srcs)

        def sop2(w):
            r, c = fn(a(w), c_(w), w.scc)
            wr(w, r)
            if c is not None:
                w.scc = c
            return nxt

        return (sop2, *regs)

    # ================================================================== program control
    def sopp(self, inst: Instruction, nxt: int):
        b = inst.base
        none = ((), (), (), ())
        if b in ("s_nop", "s_setprio", "s_icache_inv", "s_wakeup"):
            return (lambda w: nxt, *none)
        if b == "s_endpgm":

            def endpgm(w):
                w.block = "end"
                return ~nxt

            return (endpgm, *none)
        if b == "s_barrier":

            def barrier(w):
                w.block = "barrier"
                return ~nxt

            def barrier_gang(g):  # every member arrives (``Machine._step_gang`` yields them)
                for w in g.waves:
                    w.block = "barrier"
                return ~nxt

            self.gang_able((), gang_step=barrier_gang)
            return (barrier, *none)
        if b == "s_sleep":
            cycles = 64 * (int(inst.operands[0].value) & 0x7F)  # CDNA3 S_SLEEP: 64 * SIMM16[6:0]

            def sleep(w):
                w.time += cycles
                return ~nxt

            return (sleep, *none)
        if b == "s_waitcnt":
            f = inst.fields
            vm, lgkm = f["vmcnt"], f["lgkmcnt"]

            def waitcnt(w):
                return ~nxt if w.wait(vm, lgkm) else nxt

            def waitcnt_gang(g):  # each member's own accesses; all yield if any waited
                return ~nxt if g.wait(vm, lgkm) else nxt

            self.gang_able((), gang_step=waitcnt_gang)
            return (waitcnt, *none)
        if b == "s_branch" or b.startswith("s_cbranch"):
            tgt_off = int(inst.operand("target").value)
            if tgt_off not in self.index:
                raise LoadError(f"branch target 0x{tgt_off:x} is not an instruction boundary")
            t = self.index[tgt_off]
            cond = b[len("s_cbranch_") :] if b != "s_branch" else ""
            rs: tuple[int, ...] = ()
            if cond == "":
                return (lambda w: t, *none)
            if cond == "scc0":
                fn = lambda w: nxt if w.scc else t  # noqa: E731
            elif cond == "scc1":
                fn = lambda w: t if w.scc else nxt  # noqa: E731
            elif cond == "vccz":
                fn = lambda w: nxt if (w.s[VCC_LO] or w.s[VCC_HI]) else t  # noqa: E731
                rs = (VCC_LO, VCC_HI)
            elif cond == "vccnz":
                fn = lambda w: t if (w.s[VCC_LO] or w.s[VCC_HI]) else nxt  # noqa: E731
                rs = (VCC_LO, VCC_HI)
            elif cond == "execz":
                fn = lambda w: nxt if (w.s[EXEC_LO] or w.s[EXEC_HI]) else t  # noqa: E731
                rs = (EXEC_LO, EXEC_HI)
            elif cond == "execnz":
                fn = lambda w: t if (w.s[EXEC_LO] or w.s[EXEC_HI]) else nxt  # noqa: E731
                rs = (EXEC_LO, EXEC_HI)
            else:
                raise LoadError(f"{b} is not supported")
            return fn, (), (), rs, ()
        raise LoadError(f"{b} is not supported")

    # ================================================================== scalar memory
    def smem(self, inst: Instruction, nxt: int):
        b = inst.base
        off = inst.offset
        if inst.op.kind == "none":  # s_dcache_inv / wb: no data in this model
            return (lambda w: nxt, (), (), (), ())
        d = inst.operand("sdst")
        first = d.index
        n = d.width
        srows = tuple(range(first, first + n))
        if inst.op.kind == "time":
            # s_memrealtime: the 100 MHz constant clock; s_memtime: the core clock (2.1 GHz)
            div = 21 if b == "s_memrealtime" else 1

            def memtime(w):
                val = w.time // div

                def apply(w2, val=val):
                    w2.s[first] = val & M32
                    w2.s[first + 1] = (val >> 32) & M32

                w.issue(Pending("smem", off, (), srows, apply, w.time))
                return nxt

            return memtime, (), (), (), ()
        if first + n > 102:
            raise LoadError("an SMEM destination outside s0..s101 is not supported")
        base = self.sread(inst.operand("sbase"))
        imm = int(inst.operand("offset").value)
        mem = self.cfg.memory
        nbytes = 4 * n
        rs = self.srows(inst.operand("sbase"))

        def sload(w):
            addr = (base(w) + imm) & ~3 & M64  # dword loads ignore the low two address bits
            try:
                a, o = mem.find(addr, nbytes)
            except Exception as e:  # MemoryFault
                raise Fault(f"scalar load: {e}", address=addr) from None
            vals = a.buf[o : o + nbytes].view(np.uint32).tolist()

            def apply(w2, vals=vals):
                w2.s[first : first + n] = vals

            w.issue(Pending("smem", off, (), srows, apply, w.time))
            return nxt

        return sload, (), (), rs, ()

    # ================================================================== vector ALU
    def valu(self, inst: Instruction, nxt: int):
        b = inst.base
        fmt = inst.fmt
        own = _OWN.get(b)
        if own is not None:
            return own(self, inst, nxt)
        op = self.cfg.ops.get(b)
        roles = inst.roles
        ops = inst.operands
        kind = inst.op.kind
        src_idx = [i for i, r in enumerate(roles) if r.startswith("src")]
        mask_src: Operand | None = None
        if kind in ("cndmask", "carry") and fmt == "VOP3":
            mask_src = ops[src_idx[-1]]  # the SGPR pair the decoder appends
            src_idx = src_idx[:-1]
        elif "vcc_in" in roles:
            mask_src = ops[roles.index("vcc_in")]
        elif b == "v_div_fmas_f32":
            mask_src = Operand("special", VCC_LO, 2, name="vcc", type="b64")
        srcs = [ops[i] for i in src_idx]
        fetch = [self.vsource(inst, k, o) for k, o in enumerate(srcs)]
        if b == "v_pk_mov_b32":
            return self.pk_mov(inst, nxt)
        dst = inst.operand("vdst") if "vdst" in roles else None
        sdst = None
        for r in ("sdst", "vcc_out"):
            if r in roles:
                sdst = inst.operand(r)
        cmpx = kind == "cmpx"
        if (kind in ("cmp", "cmpx")) and sdst is None:
            raise LoadError("a compare without a destination mask")
        mods = dict(inst.modifiers)
        if "mul" in mods or "div" in mods:
            raise LoadError("omod is not supported")
        clamp = bool(mods.get("clamp"))
        f = inst.fields
        dst_word = 0
        # a 16-bit result (the opsel_dst opcodes) keeps the destination's other half
        old_dst = kind == "mac" or inst.op.opsel_dst
        if inst.op.opsel_dst and fmt == "VOP3" and f.get("op_sel", 0) >> 3 & 1:
            dst_word = 1
        rv, wv, rs, ws = self._regs(
            inst, tuple(roles[i] for i in src_idx), ("vdst", "sdst", "vcc_out")
        )
        if mask_src is not None:
            rs = rs + self.srows(mask_src)
        rs = rs + (EXEC_LO, EXEC_HI)
        if cmpx:
            ws = ws + (EXEC_LO, EXEC_HI)
        dwr = self.vwrite(dst) if dst is not None else None
        dold = self.vfetch(dst) if (dst is not None and old_dst) else None
        if dst is not None and old_dst:
            rv = rv + self.vrows(dst)
        sdw = self.swrite(sdst) if sdst is not None else None
        mread = self.sread(mask_src) if mask_src is not None else None
        # SDWA destination select
        sdwa_dst = None
        if fmt == "SDWA" and dst is not None and dst.width == 1:
            sel, unused = mods.get("dst_sel", "DWORD"), mods.get("dst_unused", "UNUSED_PAD")
            if sel != "DWORD":
                sdwa_dst = (sel, unused)
                if unused == "UNUSED_PRESERVE":
                    dold = self.vfetch(dst)
                    rv = rv + self.vrows(dst)
        float_dst = dst is not None and inst.op.dst in ("f32", "f64", "f16", "pf32")
        int_clamp = clamp and not float_dst
        arch = self.cfg.arch
        base_ctx = OpContext(arch, dst_word=dst_word, clamp=int_clamp)
        if op is None:
            self.out.missing[b] = self.out.missing.get(b, 0) + 1
            names = "valu.VALU / numerics.NUMERICS"

            def missing(w):
                raise Fault(f"no lane operation for {b} in {names} (not available in this build)")

            return missing, rv, wv, rs, ws
        mac_as_src = False
        if kind == "mac":
            try:
                params = inspect.signature(op).parameters.values()
                npos = sum(
                    1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                )
                var = any(p.kind == p.VAR_POSITIONAL for p in params)
                mac_as_src = var or npos >= 4
            except (TypeError, ValueError):
                mac_as_src = True
        need_ctx = mread is not None or dold is not None
        fclamp = clamp and float_dst
        nsrc = len(fetch)
        if (dwr is not None or sdw is not None) and not any(
            o.kind == "special" and o.index in _WAVE_STATE for o in srcs
        ):  # a gang's waves share every operand but VGPRs, EXEC and a lane-mask source
            self.gang_able(rs, self.srows(mask_src) if mask_src is not None else ())
        if not (need_ctx or fclamp or sdwa_dst or cmpx) and dwr is not None and sdw is None:
            self.meta = (self._packed(inst, srcs, dst, op),)
            return self._plain_valu(op, base_ctx, fetch, dwr, nxt), rv, wv, rs, ws

        def operate(w) -> np.ndarray | None:
            """Compute and write the vector result; the lane mask a compare or carry-out
            produces (None without one)."""
            args = [fch(w) for fch in fetch] if nsrc != 2 else [fetch[0](w), fetch[1](w)]
            if need_ctx:
                old = dold(w) if dold is not None else None
                ctx = OpContext(arch, mask=w.lane_mask(mread) if mread is not None else None,
                                old_dst=old if (old_dst or sdwa_dst) else None,
                                dst_word=dst_word, clamp=int_clamp)  # fmt: skip
                if mac_as_src:
                    args.append(old)
            else:
                ctx = base_ctx
                old = None
            res = op(ctx, *args)
            m = None
            if type(res) is tuple:
                res, m = res
            if res is not None and dwr is not None:
                if fclamp:
                    res = _clamp_float(res, inst.op.dst)
                if sdwa_dst is not None:
                    res = _sdwa_place(res, old, *sdwa_dst)
                dwr(w, res)
            return m

        def step(w):
            m = operate(w)
            if m is not None and sdw is not None:
                bits = bits_of(m & w.exec_mask)
                sdw(w, bits)
                if cmpx:
                    w.set_exec(bits)
            return nxt

        def step_gang(g):  # each member's lanes of the mask to its own SGPRs (and EXEC)
            m = operate(g)
            if m is not None and sdw is not None:
                for j, w in enumerate(g.waves):
                    bits = bits_of(m[j * LANES : (j + 1) * LANES] & w.exec_mask)
                    sdw(w, bits)
                    if cmpx:
                        w.set_exec(bits)
                if cmpx:
                    g.sync_exec()
            return nxt

        if sdw is not None and self.gang_s is not None:
            self.gang_step = step_gang
        return step, rv, wv, rs, ws

    def _packed(self, inst: Instruction, srcs: list[Operand], dst: Operand, op) -> tuple | None:
        """(fn, source rows, destination rows) of a packed-f32 instruction whose operation is
        elementwise (``valu._pk`` says so) on VGPR/AGPR sources without neg: several such
        instructions may run as one (``fuse.py``); None for any other."""
        fn = getattr(op, "elementwise_f32", None)
        f = inst.fields
        if fn is None or inst.fmt != "VOP3P" or f.get("neg_lo") or f.get("neg_hi"):
            return None
        if f.get("clamp") or dst.width != 2:
            return None
        rows = []
        for k, o in enumerate(srcs):
            if o.kind not in ("v", "a") or o.width != 2:
                return None
            r = self.vrow(o)
            rows.append((r + ((f["op_sel"] >> k) & 1), r + ((f["op_sel_hi"] >> k) & 1)))
        d = self.vrow(dst)
        return fn, tuple(rows), (d, d + 1)

    @staticmethod
    def _plain_valu(op, ctx, fetch, dwr, nxt: int) -> Step:
        """The common VALU instruction (no mask input, old destination, clamp, SDWA destination
        or mask result) as one closure per source count: the same steps as the general one."""

        def unpack(res):
            return res[0] if type(res) is tuple else res

        if len(fetch) == 1:
            (f0,) = fetch

            def step1(w):
                res = op(ctx, f0(w))
                if type(res) is tuple:
                    res = res[0]
                if res is not None:
                    dwr(w, res)
                return nxt

            return step1
        if len(fetch) == 2:
            f0, f1 = fetch

            def step2(w):
                res = op(ctx, f0(w), f1(w))
                if type(res) is tuple:
                    res = res[0]
                if res is not None:
                    dwr(w, res)
                return nxt

            return step2
        if len(fetch) == 3:
            f0, f1, f2 = fetch

            def step3(w):
                res = op(ctx, f0(w), f1(w), f2(w))
                if type(res) is tuple:
                    res = res[0]
                if res is not None:
                    dwr(w, res)
                return nxt

            return step3

        def stepn(w):
            res = unpack(op(ctx, *[f(w) for f in fetch]))
            if res is not None:
                dwr(w, res)
            return nxt

        return stepn

    def vsource(self, inst: Instruction, k: int, o: Operand) -> Callable[[Wave], np.ndarray]:
        """Fetch source ``k`` with the encoding's selects and modifiers applied."""
        fmt = inst.fmt
        f = inst.fields
        fetch = self.vfetch(o)
        if fmt == "VOP3P" and inst.op.kind not in ("acc_read", "acc_write"):
            return self._vop3p_source(inst, k, o, fetch)
        sel = None
        if fmt == "SDWA":
            sel = dict(inst.modifiers).get(f"src{k}_sel", "DWORD")
            if sel == "DWORD" and not o.sext:
                sel = None
        opsel_hi = fmt == "VOP3" and (f.get("op_sel", 0) >> k) & 1
        if opsel_hi and o.width != 1:
            raise LoadError(f"op_sel on the 64-bit source src{k}")
        neg, ab = o.neg, o.abs
        if not (sel or opsel_hi or neg or ab):
            return fetch
        sign = {"f16": 0x8000, "b16": 0x8000}.get(o.type, 0x80000000)
        wide = o.width == 2
        sext = o.sext

        def mod(w):
            x = fetch(w)
            if opsel_hi:
                x = x >> _U32(16)
            if sel is not None:
                x = _sdwa_select(x, sel, sext)
            if wide:
                x = x.copy()
                if ab:
                    x[:, 1] &= _U32(0x7FFFFFFF)
                if neg:
                    x[:, 1] ^= _U32(0x80000000)
                return x
            if ab:
                x = x & _U32(~sign & M32)
            if neg:
                x = x ^ _U32(sign)
            return x

        return mod

    def _vop3p_source(self, inst, k, o, fetch):
        f = inst.fields
        lo_sel = (f["op_sel"] >> k) & 1
        hi_sel = (f["op_sel_hi"] >> k) & 1
        nlo, nhi = (f["neg_lo"] >> k) & 1, (f["neg_hi"] >> k) & 1
        if o.width != 2:
            raise LoadError(f"VOP3P source src{k} is not 64-bit")
        if o.kind == "const" and const_bits(o, 64) != 0 and (lo_sel or hi_sel):
            # how the hardware extends a 32-bit inline constant to the high dword of a
            # packed-f32 operand is not modelled: only the low dword may be selected
            raise LoadError(f"src{k}: the high dword of a nonzero inline constant is selected")
        if o.kind == "const":
            c = const_bits(o, 32)
            arr = np.full((LANES, 2), c, dtype=_U32)
            if nlo:
                arr[:, 0] ^= _U32(0x80000000)
            if nhi:
                arr[:, 1] ^= _U32(0x80000000)
            arr.flags.writeable = False
            return lambda w: arr if w.lanes == LANES else _widen(arr, w.lanes)
        if (lo_sel, hi_sel, nlo, nhi) == (0, 1, 0, 0):
            return fetch
        if lo_sel == hi_sel and not (nlo or nhi) and o.kind in ("v", "a"):
            row = self.vrow(o) + lo_sel  # one dword in both columns

            def dup(w):
                return np.repeat(w.v[row], 2).reshape(-1, 2)

            return dup

        def sel(w):
            x = fetch(w)
            out = np.empty_like(x)
            out[:, 0] = x[:, lo_sel]
            out[:, 1] = x[:, hi_sel]
            if nlo:
                out[:, 0] ^= _U32(0x80000000)
            if nhi:
                out[:, 1] ^= _U32(0x80000000)
            return out

        return sel

    def pk_mov(self, inst: Instruction, nxt: int):
        f = inst.fields
        if f["neg_lo"] or f["neg_hi"] or f["clamp"]:
            raise LoadError("v_pk_mov_b32 with neg or clamp")
        s0, s1 = inst.operand("src0"), inst.operand("src1")
        a, b_ = self.vfetch(s0), self.vfetch(s1)
        l0, l1 = f["op_sel"] & 1, (f["op_sel"] >> 1) & 1
        wr = self.vwrite(inst.operand("vdst"))
        regs = self._regs(inst, ("src0", "src1"), ("vdst",))

        def pkmov(w):
            x, y = a(w), b_(w)
            out = np.empty((len(x), 2), dtype=_U32)
            out[:, 0] = x[:, l0]
            out[:, 1] = y[:, l1]
            wr(w, out)
            return nxt

        rv, wv, rs, ws = regs
        self.gang_able(rs)
        return pkmov, rv, wv, rs + (EXEC_LO, EXEC_HI), ws

    # ---- lane-crossing operations the executor owns
    def readfirstlane(self, inst: Instruction, nxt: int):
        src = inst.operand("src0")
        sdst = inst.operand("sdst")
        wr = self.swrite(sdst)
        fetch = self.vfetch(src)
        regs = self._regs(inst, ("src0",), ("sdst",))
        exec_dst = any(EXEC_LO <= r <= EXEC_HI for r in range(sdst.index, sdst.index + sdst.width))

        def rfl(w):
            wr(w, int(fetch(w)[_first_lane(w)]))
            return nxt

        def rfl_gang(g):  # each member's first active lane to its own SGPR
            x = fetch(g)
            for j, w in enumerate(g.waves):
                wr(w, int(x[j * LANES + _first_lane(w)]))
            if exec_dst:
                g.sync_exec()
            return nxt

        rv, wv, rs, ws = regs
        self.gang_able(rs, gang_step=rfl_gang)
        return rfl, rv, wv, rs + (EXEC_LO, EXEC_HI), ws

    def readlane(self, inst: Instruction, nxt: int):
        fetch = self.vfetch(inst.operand("src0"))
        sel = self.sread(inst.operand("src1"))
        wr = self.swrite(inst.operand("sdst"))

        def rl(w):
            wr(w, int(fetch(w)[sel(w) & 63]))
            return nxt

        return (rl, *self._regs(inst, ("src0", "src1"), ("sdst",)))

    def writelane(self, inst: Instruction, nxt: int):
        val = self.sread(inst.operand("src0"))
        sel = self.sread(inst.operand("src1"))
        r = self.vrow(inst.operand("vdst"))

        def wl(w):  # ignores EXEC (CDNA3 V_WRITELANE_B32)
            w.v[r, sel(w) & 63] = val(w) & M32
            return nxt

        return (wl, *self._regs(inst, ("src0", "src1"), ("vdst",)))

    def mbcnt(self, inst: Instruction, nxt: int):
        hi = inst.base == "v_mbcnt_hi_u32_b32"
        a = self.vsource(inst, 0, inst.operand("src0"))
        c = self.vsource(inst, 1, inst.operand("src1"))
        wr = self.vwrite(inst.operand("vdst"))
        sel = _MBCNT_HI if hi else _MBCNT_LO  # (64, 32): which mask bits each lane counts
        bit = np.uint32(1) << np.arange(32, dtype=_U32)

        def mb(w):
            m = a(w)
            cnt = (((m[:, None] & bit) != 0) & sel).sum(axis=1, dtype=np.uint32)
            wr(w, (cnt + c(w)).astype(_U32))
            return nxt

        rv, wv, rs, ws = self._regs(inst, ("src0", "src1"), ("vdst",))
        return mb, rv, wv, rs + (EXEC_LO, EXEC_HI), ws

    def permlane_swap(self, inst: Instruction, nxt: int):
        """gfx950 V_PERMLANE16_SWAP_B32 / V_PERMLANE32_SWAP_B32 (CDNA4 ISA guide): swap the
        odd 16-lane rows of VDST with the even rows of SRC0 (16), or the upper 32 lanes of VDST
        with the lower 32 of SRC0 (32); both registers are written."""
        d, s = inst.operand("vdst"), inst.operand("src0")
        if s.kind != "v":
            raise LoadError("permlane swap of a non-VGPR source")
        rd, rsrc = self.vrow(d), self.vrow(s)
        if inst.base == "v_permlane16_swap_b32":
            dl = np.array([i for i in range(64) if (i // 16) % 2 == 1])
        else:
            dl = np.arange(32, 64)
        sl = dl - (16 if inst.base == "v_permlane16_swap_b32" else 32)

        def swap(w):
            if not w.exec_all:
                raise Fault("permlane swap with a partial EXEC mask is not modelled")
            x = w.v[rd, dl].copy()
            w.v[rd, dl] = w.v[rsrc, sl]
            w.v[rsrc, sl] = x
            return nxt

        rows = (rd, rsrc)
        return swap, rows, rows, (EXEC_LO, EXEC_HI), ()

    def nop(self, inst: Instruction, nxt: int):
        return (lambda w: nxt), (), (), (), ()

    # ================================================================== MFMA
    def mai(self, inst: Instruction, nxt: int):
        mfma = self.cfg.mfma
        d, a, b_, c = (inst.operand(r) for r in ("vdst", "src0", "src1", "src2"))
        fa, fb, fc = self.vfetch(a), self.vfetch(b_), self.vfetch(c)
        if a.width == 1 or b_.width == 1:
            raise LoadError("MFMA operands of one dword are not supported")
        wr = self.vwrite(d)
        f = inst.fields
        name, arch = inst.base, self.cfg.arch
        cbsz, abid, blgp = f["cbsz"], f["abid"], f["blgp"]
        regs = self._regs(inst, ("src0", "src1", "src2"), ("vdst",))
        rv, wv, rs, ws = regs
        if mfma is None:
            self.out.missing[name] = self.out.missing.get(name, 0) + 1

            def missing(w):
                raise Fault(f"no MFMA implementation for {name} (numerics.mfma is not available)")

            return missing, rv, wv, rs, ws

        self.gang_able(rs)

        def step(w):
            if not w.exec_all:
                raise Fault("MFMA with a partial EXEC mask is not modelled")
            out = mfma(name, arch, fa(w), fb(w), fc(w), cbsz=cbsz, abid=abid, blgp=blgp)
            wr(w, np.asarray(out, dtype=_U32))
            return nxt

        return step, rv, wv, rs + (EXEC_LO, EXEC_HI), ws

    # ================================================================== LDS
    def ds(self, inst: Instruction, nxt: int):
        b = inst.base
        kind = inst.op.kind
        off = inst.offset
        mods = dict(inst.modifiers)
        if mods.get("gds"):
            raise LoadError("GDS is not supported")
        addr_r = self.vrow(inst.operand("addr"))
        offset = inst.fields["offset0"] | inst.fields["offset1"] << 8
        rv, wv, rs, ws = self._regs(inst, ("addr", "data0", "data1"), ("vdst",))
        rs = rs + (EXEC_LO, EXEC_HI)
        lgkm_w = wv
        if kind in ("swizzle", "permute"):
            # ds_swizzle takes its data from "addr", ds_bpermute from "data0"
            data_r = self.vrow(inst.operand("addr" if kind == "swizzle" else "data0"))
            d_r = self.vrow(inst.operand("vdst"))
            if kind == "swizzle":
                pattern = functools.cache(functools.partial(_repeat_lanes, _swizzle_lanes(offset)))

                def sources(w, n):  # each lane's source lane, fixed by the pattern
                    return pattern(n)

                exchange = _pull
            else:

                def sources(w, n):  # the lane each lane's address names, within its wave
                    lanes = ((w.v[addr_r].astype(np.int64) + offset) >> 2) & 63
                    return lanes if n == 1 else lanes + _member_bases(n)

                exchange = _pull if b == "ds_bpermute_b32" else _push

            def xchg(w):
                act = w.exec_mask
                out = exchange(w.v[data_r], sources(w, 1), act)
                writer = _lane_writer(d_r, 1, out, act, w.exec_all)
                w.issue(Pending("lds", off, lgkm_w, (), writer, w.time))
                return nxt

            def xchg_gang(g):  # every member's lanes at once, each its own access in flight
                n = len(g.waves)
                out = exchange(g.v[data_r], sources(g, n), g.exec_mask)
                _issue_each(g, "lds", off, lgkm_w, d_r, 1, out)
                return nxt

            self.gang_able(rs, gang_step=xchg_gang)
            return xchg, rv, (), rs, ()
        elem = {"b32": 4, "x2": 8, "x3": 12, "x4": 16}
        if kind in ("read", "read2"):
            d = inst.operand("vdst")
            d_r = self.vrow(d)
            if kind == "read":
                size = {"ds_read_u8": 1, "ds_read_i8": 1, "ds_read_u16": 2,
                        "ds_read_i16": 2}.get(b, elem[inst.op.dst])  # fmt: skip
                parts = [(offset, size)]
            else:
                size = 4 if d.width == 2 else 8
                stride = size * (64 if "st64" in b else 1)
                parts = [(inst.fields["offset0"] * stride, size),
                         (inst.fields["offset1"] * stride, size)]  # fmt: skip
            signed = b in ("ds_read_i8", "ds_read_i16")
            ndw = d.width

            def read(lds: np.ndarray, size: int, first, base: np.ndarray,
                     act: np.ndarray) -> np.ndarray:  # fmt: skip
                chunks = [_lds_gather(lds, size, first, base + o, act, n) for o, n in parts]
                raw = chunks[0] if len(chunks) == 1 else np.concatenate(chunks, axis=1)
                return _extend(raw, signed, ndw)

            def dsread(w):
                act, lds = w.exec_mask, w.wg.lds
                vals = read(lds, lds.size, 0, w.v[addr_r].astype(np.int64), act)
                writer = _lane_writer(d_r, ndw, vals, act, w.exec_all)
                w.issue(Pending("lds", off, lgkm_w, (), writer, w.time))
                return nxt

            def dsread_gang(g):  # one gather for every member, each lane its workgroup's LDS
                base, act = g.v[addr_r].astype(np.int64), g.exec_mask
                flat, first = g.lds_lanes()
                vals = read(flat, g.waves[0].wg.lds.size, first, base, act)
                _issue_each(g, "lds", off, lgkm_w, d_r, ndw, vals)
                return nxt

            self.gang_able(rs, gang_step=dsread_gang)
            return dsread, rv, (), rs, ()
        if kind in ("write", "write2"):
            d0 = inst.operand("data0")
            r0 = self.vrow(d0)
            if kind == "write":
                size = {"ds_write_b8": 1, "ds_write_b16": 2}.get(b, elem[inst.op.srcs[0]])
                parts = [(offset, r0, size)]
            else:
                r1 = self.vrow(inst.operand("data1"))
                size = 4 * d0.width
                stride = size * (64 if "st64" in b else 1)
                parts = [(inst.fields["offset0"] * stride, r0, size),
                         (inst.fields["offset1"] * stride, r1, size)]  # fmt: skip

            def dswrite(w):
                act = w.exec_mask
                base = w.v[addr_r].astype(np.int64)
                for o, r, n in parts:
                    _lds_scatter(w.wg.lds, base + o, act, _lane_bytes(w.v, r, n))
                return nxt

            def dswrite_gang(g):  # one scatter for every member, in schedule order
                act = g.exec_mask
                base = g.v[addr_r].astype(np.int64)
                size = g.waves[0].wg.lds.size  # one kernel: every workgroup's LDS has its size
                flat, first = g.lds_lanes()
                writes = []
                for o, r, n in parts:
                    addr = (base + o) & M32
                    _lds_check(size, addr, act, n)  # every fault before any write
                    writes.append((addr + first, _lane_bytes(g.v, r, n)))
                # members of different workgroups write different rows: only the order within
                # a workgroup matters, and the schedule's order of all of them keeps it
                lanes = _schedule_lanes(g.waves, 0, len(g.waves))
                lanes = lanes[act[lanes]]
                for addr, data in writes:
                    _lds_put(flat, addr, lanes, data)
                return nxt

            self.gang_able(rs, gang_step=dswrite_gang)
            return dswrite, rv, wv, rs, ws
        raise LoadError(f"{b} is not supported")

    # ================================================================== global memory
    def _address(self, inst: Instruction):
        """Per-lane 64-bit addresses (uint64) of a FLAT/GLOBAL instruction."""
        offset = int(dict(inst.modifiers).get("offset", 0))
        va = inst.operand("vaddr")
        r = self.vrow(va)
        if "saddr" in inst.roles and inst.operand("saddr").kind != "off":
            sb = self.sread(inst.operand("saddr"))

            def addr(w):  # saddr + zero-extended 32-bit vaddr + signed offset
                return w.v[r].astype(np.uint64) + np.uint64((sb(w) + offset) & M64)

            return addr
        off64 = np.uint64(offset & M64)

        def addr2(w):
            v = w.v
            return (v[r].astype(np.uint64) | (v[r + 1].astype(np.uint64) << np.uint64(32))) + off64

        return addr2

    def flat(self, inst: Instruction, nxt: int):
        if inst.fields["seg"] != 2:
            raise LoadError("flat_* (address-space generic) accesses are not supported")
        kind = inst.op.kind
        b = inst.base
        off = inst.offset
        mem = self.cfg.memory
        addr = self._address(inst)
        rv, wv, rs, ws = self._regs(inst, ("vaddr", "vdata", "saddr"), ("vdst",))
        rs = rs + (EXEC_LO, EXEC_HI)
        vm_w = wv

        def fault(e, what):
            return Fault(f"{what}: {e}", lane=getattr(e, "lane", None),
                         address=getattr(e, "address", None))  # fmt: skip

        if kind == "load":
            d = inst.operand("vdst")
            d_r, ndw = self.vrow(d), d.width
            size = {"load_ubyte": 1, "load_sbyte": 1, "load_ushort": 2,
                    "load_sshort": 2}.get(b, 4 * ndw)  # fmt: skip
            signed = b in ("load_sbyte", "load_sshort")

            def load(w) -> np.ndarray:
                try:
                    raw = mem.gather(addr(w), w.exec_mask, size)
                except Exception as e:
                    raise fault(e, "global load") from None
                return _extend(raw, signed, ndw)

            def gload(w):
                vals = load(w)
                writer = _lane_writer(d_r, ndw, vals, w.exec_mask, w.exec_all)
                w.issue(Pending("vm", off, vm_w, (), writer, w.time))
                return nxt

            def gload_gang(g):
                _issue_each(g, "vm", off, vm_w, d_r, ndw, load(g))
                return nxt

            self.gang_able(rs, gang_step=gload_gang)
            return gload, rv, (), rs, ()
        if kind == "store":
            dv = inst.operand("vdata")
            r0, ndw = self.vrow(dv), dv.width
            size, shift = {"store_byte": (1, 0), "store_byte_d16_hi": (1, 2),
                           "store_short": (2, 0), "store_short_d16_hi": (2, 2)}.get(b, (4 * ndw, 0))  # fmt: skip

            def gstore(w):
                act = w.exec_mask
                data = np.ascontiguousarray(w.v[r0 : r0 + ndw].T).view(np.uint8)
                data = data[:, shift : shift + size]
                try:
                    mem.scatter(addr(w), act, data)
                except Exception as e:
                    raise fault(e, "global store") from None
                w.issue(Pending("vm", off, (), (), None, w.time))
                return nxt

            return gstore, rv, wv, rs, ws
        # atomics: applied lane by lane in lane order, each lane a read-modify-write
        name = b[len("atomic_") :]
        fn, width = _ATOMICS.get(name, (None, 0))
        if fn is None:
            raise LoadError(f"global atomic {name} is not supported")
        dv = inst.operand("vdata")
        r0 = self.vrow(dv)
        ndata = dv.width
        ret = "vdst" in inst.roles
        d_r = self.vrow(inst.operand("vdst")) if ret else 0
        nbytes = 4 * width

        def atomic(w):
            act = w.exec_mask
            a = addr(w)
            data = w.v[r0 : r0 + ndata]
            lanes = np.flatnonzero(act)
            old = np.zeros((LANES, width), dtype=_U32)
            for lane in lanes.tolist():
                at = int(a[lane])
                try:
                    al, o = mem.find(at, nbytes)
                except Exception as e:
                    raise Fault(f"global atomic: lane {lane}: {e}", lane=lane, address=at) from None
                cell = al.buf[o : o + nbytes]
                cur = (
                    cell.view(np.uint32).copy()
                    if o % 4 == 0
                    else np.frombuffer(cell.tobytes(), np.uint32).copy()
                )
                old[lane] = cur
                new = fn(cur, data[:, lane])
                cell[:] = np.asarray(new, dtype=_U32).view(np.uint8)
            apply = _lane_writer(d_r, width, old, act, bool(act.all())) if ret else None
            w.issue(Pending("vm", off, vm_w if ret else (), (), apply, w.time))
            return ~nxt

        return atomic, rv, (), rs, ()

    def mubuf(self, inst: Instruction, nxt: int):
        off = inst.offset

        def cache(w):  # buffer_wbl2 / buffer_inv: no data effect; counted by VM_CNT
            w.issue(Pending("vm", off, (), (), None, w.time))
            return nxt

        return cache, (), (), (), ()


# ------------------------------------------------------------------------------ helpers
# scalar state a source may name that is not a register (SCC, VCCZ, EXECZ): a gang would read
# its first wave's
_WAVE_STATE = (251, 252, 253)


def _widen(arr: np.ndarray, lanes: int) -> np.ndarray:
    """A constant source of one wave's lanes, repeated for a gang's ``lanes``."""
    return np.ascontiguousarray(np.broadcast_to(arr[0], (lanes, *arr.shape[1:])))


def _off_the_end(w: Wave) -> int:
    raise Fault("execution ran past the last instruction of the kernel (no s_endpgm)")


def _clamp_float(res: np.ndarray, t: str) -> np.ndarray:
    if t != "f32":
        raise Fault(f"clamp of a {t} result is not supported")
    f = res.view(np.float32)
    out = np.clip(np.nan_to_num(f, nan=0.0), 0.0, 1.0).astype(np.float32)
    return out.view(np.uint32)


_SEL_SHIFT = {"BYTE_0": (0, 8), "BYTE_1": (8, 8), "BYTE_2": (16, 8), "BYTE_3": (24, 8),
              "WORD_0": (0, 16), "WORD_1": (16, 16), "DWORD": (0, 32)}  # fmt: skip


def _sdwa_select(x: np.ndarray, sel: str, sext: bool) -> np.ndarray:
    sh, n = _SEL_SHIFT[sel]
    if n == 32:
        return x
    v = (x >> _U32(sh)) & _U32((1 << n) - 1)
    if sext:
        v = ((v.astype(np.int64) ^ (1 << (n - 1))) - (1 << (n - 1))).astype(np.uint32)
    return v


def _sdwa_place(res: np.ndarray, old: np.ndarray | None, sel: str, unused: str) -> np.ndarray:
    sh, n = _SEL_SHIFT[sel]
    field = _U32(((1 << n) - 1) << sh)
    v = (res << _U32(sh)) & field
    if unused == "UNUSED_PRESERVE":
        return (old & ~field) | v
    if unused == "UNUSED_SEXT":
        top = (v >> _U32(sh + n - 1)) & _U32(1)
        above = _U32((M32 << (sh + n)) & M32)
        return v | np.where(top.astype(bool), above, _U32(0))
    return v


_MBCNT_LO = np.array([[b < min(lane, 32) for b in range(32)] for lane in range(64)])
_MBCNT_HI = np.array([[b < lane - 32 for b in range(32)] for lane in range(64)])


def _swizzle_lanes(offset: int) -> np.ndarray:
    """The source lane of each lane for a ds_swizzle_b32 offset (the "swizzle pattern" of
    LLVM's AMDGPU modifier syntax): quad-permute mode (offset[15] = 1) within each group of 4,
    else bitmask mode within each group of 32."""
    lanes = np.arange(64)
    if offset & 0x8000:
        sel = np.array([(offset >> (2 * i)) & 3 for i in range(4)])
        return (lanes & ~3) | sel[lanes & 3]
    and_m, or_m, xor_m = offset & 0x1F, (offset >> 5) & 0x1F, (offset >> 10) & 0x1F
    return (lanes & 0x20) | ((((lanes & 0x1F) & and_m) | or_m) ^ xor_m)


def _lane_writer(row: int, n: int, vals: np.ndarray, act: np.ndarray, full: bool):
    """Retire-time writer of ``vals`` ((64,) or (64, n)) to rows ``row..row+n-1`` under the
    EXEC mask ``act`` of the issuing instruction (``full``: every lane active)."""
    if vals.ndim == 1:
        vals = vals[:, None]

    def apply(w: Wave) -> None:
        if full:
            w.v[row : row + n] = vals.T
        else:
            np.copyto(w.v[row : row + n], vals.T, where=act[None, :])

    return apply


def _issue_each(g, kind: str, off: int, rows: tuple[int, ...], d_r: int, ndw: int,
                vals: np.ndarray) -> None:  # fmt: skip
    """Put a gang's load in flight in each member (``vals``: the gang's lanes' values), as if
    each had run it alone: one record, which every member's counters hold and the first of
    them to retire writes for all (``wave.Counters``), with each member's clock at issue."""
    write = _lane_writer(d_r, ndw, vals, g.exec_mask, g.exec_all)
    times = {w: w.time for w in g.waves}
    g.issue(Pending(kind, off, rows, (), lambda _w: write(g), times))


def _first_lane(w) -> int:
    """The lane v_readfirstlane reads: the lowest active one (lane 0 when none is)."""
    if w.exec_all:
        return 0
    e = w.exec
    return (e & -e).bit_length() - 1 if e else 0


@functools.cache
def _member_bases(n: int) -> np.ndarray:
    """The first lane of each of ``n`` gang members, per lane: lane k of member j is j*64+k."""
    return np.repeat(np.arange(n, dtype=np.int64) * LANES, LANES)


def _repeat_lanes(pattern: np.ndarray, n: int) -> np.ndarray:
    """A wave's lane pattern (64,) for each of ``n`` gang members, as gang lanes."""
    return pattern if n == 1 else np.tile(pattern, n) + _member_bases(n)


def _pull(data: np.ndarray, src: np.ndarray, act: np.ndarray) -> np.ndarray:
    """Each lane reads the lane ``src`` names; an inactive source reads 0 (ds_swizzle,
    ds_bpermute)."""
    return np.where(act[src], data[src], _U32(0))


def _push(data: np.ndarray, dst: np.ndarray, act: np.ndarray) -> np.ndarray:
    """Each active lane writes into the lane ``dst`` names; unwritten lanes read 0
    (ds_permute)."""
    out = np.zeros(data.shape[0], dtype=_U32)
    sel = np.flatnonzero(act)
    out[dst[sel]] = data[sel]
    return out


def _schedule_lanes(waves, lo: int, hi: int) -> np.ndarray:
    """The gang lanes of members ``lo..hi-1`` in the order the schedule would run them alone
    (by clock, then tie-break), so a later writer to one LDS byte wins as it would alone."""
    ids = sorted(range(lo, hi), key=lambda j: (waves[j].time, waves[j].tie))
    if ids == list(range(lo, hi)):
        return np.arange(lo * LANES, hi * LANES)
    return np.concatenate([np.arange(j * LANES, (j + 1) * LANES) for j in ids])


def _extend(raw: np.ndarray, signed: bool, ndw: int) -> np.ndarray:
    """Bytes (64, size) to dwords (64, ndw): sub-dword loads zero- or sign-extend."""
    size = raw.shape[1]
    if size >= 4:
        return np.ascontiguousarray(raw).view(np.uint32).reshape(-1, ndw)
    v = (
        raw[:, 0].astype(np.uint32)
        if size == 1
        else np.ascontiguousarray(raw).view(np.uint16)[:, 0].astype(np.uint32)
    )
    if signed:
        bits = 8 * size
        v = ((v.astype(np.int64) ^ (1 << (bits - 1))) - (1 << (bits - 1))).astype(np.uint32)
    return v.reshape(-1, 1)


def _lds_check(size: int, addr: np.ndarray, act: np.ndarray, n: int) -> None:
    bad = act & ((addr < 0) | (addr + n > size))
    if bad.any():
        lane = int(np.flatnonzero(bad)[0])
        raise Fault(
            f"lane {lane}: LDS address 0x{int(addr[lane]) & M32:x} (+{n} bytes) is outside the "
            f"workgroup's {size} bytes of LDS",
            lane=lane,
            address=int(addr[lane]),
        )


def _lds_gather(lds: np.ndarray, size: int, first: np.ndarray | int, addr: np.ndarray,
                act: np.ndarray, n: int) -> np.ndarray:  # fmt: skip
    """Each active lane's ``n`` bytes at ``addr`` of its workgroup's ``size`` bytes of LDS,
    which start at ``first`` (per lane, or one for all) in ``lds``; inactive lanes read 0."""
    addr = addr & M32  # ADDR + OFFSET is a 32-bit sum (a negative base plus an offset is fine)
    _lds_check(size, addr, act, n)
    safe = np.where(act, addr, 0) + first
    if n % 4 == 0 and lds.size % 4 == 0 and not (safe & 3).any():
        # whole aligned dwords (the kernels' ds_read_b32..b128): a quarter of the indices
        words = lds.view(np.uint32)[(safe >> 2)[:, None] + np.arange(n // 4)]
        out = words.view(np.uint8)
    else:
        out = lds[safe[:, None] + np.arange(n)]
    if not act.all():
        out[~act] = 0
    return out


def _lds_scatter(lds: np.ndarray, addr: np.ndarray, act: np.ndarray, data: np.ndarray) -> None:
    addr = addr & M32  # as in _lds_gather
    _lds_check(lds.size, addr, act, data.shape[1])
    _lds_put(lds, addr, np.flatnonzero(act), data)


def _lds_put(lds: np.ndarray, addr: np.ndarray, lanes: np.ndarray, data: np.ndarray) -> None:
    """Each of ``lanes``, in order, writes its bytes ``data`` at its checked address ``addr``."""
    lds[addr[lanes][:, None] + np.arange(data.shape[1])] = data[lanes]


def _lane_bytes(v: np.ndarray, row: int, n: int) -> np.ndarray:
    """The first ``n`` bytes of each lane's registers from ``row``: (lanes, n) uint8."""
    return np.ascontiguousarray(v[row : row + (n + 3) // 4].T).view(np.uint8)[:, :n]


def _u64(x: np.ndarray) -> int:
    return int(x[0]) | int(x[1]) << 32


def _from64(v: int) -> list[int]:
    return [v & M32, (v >> 32) & M32]


def _f32add(cur, d):
    return (cur.view(np.float32) + d[:1].view(np.float32)).view(np.uint32)


def _s32(x: int) -> int:
    return S.s32(x)


# name -> (fn(old dwords, data dwords) -> new dwords, width in dwords); CDNA3 "FLAT, Scratch
# and Global Instructions": cmpswap data is (src, cmp), the new value is src when old == cmp
_ATOMICS: dict[str, tuple[Callable, int]] = {
    "swap": (lambda c, d: d[:1], 1),
    "cmpswap": (lambda c, d: d[:1] if int(c[0]) == int(d[1]) else c, 1),
    "add": (lambda c, d: [(int(c[0]) + int(d[0])) & M32], 1),
    "sub": (lambda c, d: [(int(c[0]) - int(d[0])) & M32], 1),
    "smin": (lambda c, d: [min(_s32(int(c[0])), _s32(int(d[0]))) & M32], 1),
    "umin": (lambda c, d: [min(int(c[0]), int(d[0]))], 1),
    "smax": (lambda c, d: [max(_s32(int(c[0])), _s32(int(d[0]))) & M32], 1),
    "umax": (lambda c, d: [max(int(c[0]), int(d[0]))], 1),
    "and": (lambda c, d: [int(c[0]) & int(d[0])], 1),
    "or": (lambda c, d: [int(c[0]) | int(d[0])], 1),
    "xor": (lambda c, d: [int(c[0]) ^ int(d[0])], 1),
    "inc": (lambda c, d: [0 if int(c[0]) >= int(d[0]) else int(c[0]) + 1], 1),
    "dec": (
        lambda c, d: [int(d[0]) if int(c[0]) == 0 or int(c[0]) > int(d[0]) else int(c[0]) - 1],
        1,
    ),
    "add_f32": (_f32add, 1),
    "swap_x2": (lambda c, d: d[:2], 2),
    "cmpswap_x2": (lambda c, d: d[:2] if _u64(c) == _u64(d[2:4]) else c, 2),
    "add_x2": (lambda c, d: _from64((_u64(c) + _u64(d)) & M64), 2),
    "sub_x2": (lambda c, d: _from64((_u64(c) - _u64(d)) & M64), 2),
}

_OWN: dict[str, Callable] = {
    "v_readfirstlane_b32": Compiler.readfirstlane,
    "v_readlane_b32": Compiler.readlane,
    "v_writelane_b32": Compiler.writelane,
    "v_mbcnt_lo_u32_b32": Compiler.mbcnt,
    "v_mbcnt_hi_u32_b32": Compiler.mbcnt,
    "v_pk_mov_b32": Compiler.pk_mov,
    "v_permlane16_swap_b32": Compiler.permlane_swap,
    "v_permlane32_swap_b32": Compiler.permlane_swap,
    "v_nop": Compiler.nop,
}


def compile_kernel(cfg: Config, dk: DecodedKernel) -> Compiled:
    """Compile every instruction of ``dk``; raises ``LoadError`` naming the first one that the
    executor cannot run as encoded."""
    return Compiler(cfg, dk).compile()
