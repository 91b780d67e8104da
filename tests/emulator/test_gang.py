"""Gangs (``mono_aot/emulator/gang.py``): neighbouring waves at one instruction run it once on
all their lanes, and that computes exactly what running the waves one by one computes. On a
hand-assembled program whose waves disagree in every way a gang must respect (a scalar source
that differs between workgroups, per-wave VCC and EXEC, a wave with no lane active, paths that
part and meet again), and instruction by instruction on every gang-able instruction and fused
block of the small layout's real kernels, both archs."""

from __future__ import annotations

import numpy as np
import pytest

from mono_aot.emulator.gang import Gang
from mono_aot.emulator.machine import Machine
from mono_aot.emulator.wave import EXEC_LO, LANES, VCC_LO, Fault, Wave, Workgroup
from tests.emulator.asm import EXEC, LIT, VCC, Asm, i, kernel_object, s, v
from tests.emulator.conftest import stored_kernels
from tests.emulator.emu import OUT, buffer, kernargs, prologue

THREADS, GRID = 256, 3  # 4 waves a workgroup, 12 in all
IN = OUT + (1 << 24)
ROWS = [*range(2, 18), 22, 23, 24]  # the registers stored


def gang_program() -> Asm:
    a = prologue(Asm())  # s[4:5] = out, v1 = 4 * thread id
    a.vop1("v_cvt_f32_u32", 2, v(0))
    a.vop1("v_mov_b32", 3, s(2))  # the workgroup id: differs between neighbouring waves
    a.sop1("s_mov_b32", 6, LIT, lit=0x3F800000)  # 1.0: the same in every wave
    a.vop2("v_add_f32", 4, s(6), v(2))
    a.vop2("v_add_u32", 5, v(3), v(0))
    a.vop2("v_lshrrev_b32", 8, i(4), v(0))  # thread id / 16: 0..15
    a.vop2("v_lshlrev_b32", 19, i(2), v(0))  # 4 * thread id in the workgroup: its LDS word
    a.vopc("v_cmp_gt_u32", i(9), v(8))  # VCC: all of wave 0 and 1, part of wave 2, none of 3
    a.vop2("v_cndmask_b32", 9, v(4), v(5))
    a.sop1("s_mov_b64", 20, VCC)
    a.vop3("v_cndmask_b32", 10, v(5), v(4), s(20))  # the select from an SGPR pair
    a.vop1("v_mov_b32", 11, i(0)).vop1("v_mov_b32", 13, s(2))
    a.vop3("v_lshl_add_u64", 14, v(10), i(3), v(12))  # 64-bit sources and result
    a.label("loop")
    a.vopc("v_cmpx_gt_u32", i(11), v(8))  # EXEC: wave 2 in part, wave 3 empty
    a.vop3p("v_pk_fma_f32", 6, v(2), v(4), v(6))
    a.vop3p("v_pk_fma_f32", 16, v(4), v(2), v(16), opsel=0b001)
    a.vop2("v_add_f32", 2, v(2), v(4))
    a.vop3p("v_pk_mul_f32", 12, v(16), v(6))
    a.sop1("s_mov_b64", EXEC, i(-1))
    a.vop2("v_add_u32", 8, i(1), v(8))  # and again with one more lane group dropped
    a.vopc("v_cmp_gt_u32", i(13), v(8))
    a.branch("s_cbranch_vccnz", "loop")  # waves leave the loop at different passes
    a.vop2("v_add_f32", 7, s(6), v(7))
    a.vop1("v_mov_b32", 18, s(2)).vop2("v_lshlrev_b32", 18, i(10), v(18))  # 4 * THREADS * wg
    a.vop2("v_add_u32", 1, v(1), v(18))
    # loads under a per-wave EXEC: global memory (the input at 4 * global thread id), and LDS,
    # each workgroup's own: every thread writes its v5, reads its neighbour wave's
    a.smem("s_load_dwordx2", 22, 0, 8).waitcnt(lgkm=0)
    a.vop2("v_lshrrev_b32", 20, i(4), v(0)).vopc("v_cmpx_lt_u32", i(2), v(20))
    a.vop1("v_readfirstlane_b32", 24, v(5))  # the first active lane: 48 in wave 0, else 0
    a.vopc("v_cmpx_gt_u32", i(10), v(20))  # and EXEC: lanes 48.. of wave 0, none of wave 3
    a.glob("global_load_dword", addr=1, vdst=11, saddr=22)
    a.glob("global_load_dwordx2", addr=1, vdst=14, saddr=22, offset=8)
    # lane exchanges under that EXEC, each wave within its own: a swizzle (xor 3 within 32
    # lanes) and a backward permute (lane ^ 41)
    a.ds("ds_swizzle_b32", addr=5, vdst=22, offset=0x1F | 3 << 10)
    a.vop2("v_xor_b32", 25, LIT, v(19), lit=4 * 41)
    a.ds("ds_bpermute_b32", addr=25, data0=5, vdst=23)
    a.ds("ds_write_b32", addr=19, data0=5).sopp("s_barrier")
    a.vop2("v_xor_b32", 21, LIT, v(19), lit=4 * LANES)
    a.ds("ds_read_b32", addr=21, vdst=17).ds("ds_read2_b32", addr=21, vdst=12, offset0=1)
    a.waitcnt(vm=0, lgkm=0).sop1("s_mov_b64", EXEC, i(-1)).vop1("v_mov_b32", 24, s(24))
    for r in ROWS:  # row k of the output: register v(2 + k) of every thread of the grid
        a.glob("global_store_dword", addr=1, data=r, saddr=4)
        a.sop2("s_add_u32", 4, 4, LIT, lit=4 * THREADS * GRID).sop2("s_addc_u32", 5, 5, i(0))
    return a.endpgm()


def _run(gangs: bool, hold: dict[int, float] | None = None):
    m = Machine("gfx942", 1, gangs=gangs)
    ganged = [0]
    real = m._step_gang

    def counted(members, ln, q):
        n = real(members, ln, q)
        ganged[0] += n * len(members)
        return n

    m._step_gang = counted  # type: ignore[method-assign]
    out = buffer(m, OUT, 4 * THREADS * GRID * len(ROWS))
    data = buffer(m, IN, 4 * THREADS * GRID + 16, "in")
    data[:] = np.random.default_rng(3).integers(0, 256, data.size, dtype=np.uint8)
    k = m.load(kernel_object(gang_program(), lds=4 * THREADS))
    m.launch(0, k, GRID, THREADS, kernargs(OUT, IN), hold=hold)
    st = m.run()
    return out, st, ganged[0]


def test_gangs_compute_what_waves_one_by_one_compute():
    got, st, ganged = _run(True)
    want, st0, none = _run(False)
    assert none == 0 and ganged > st.instructions // 2  # most of the program ran in gangs
    assert got.tobytes() == want.tobytes()
    assert st.instructions == st0.instructions
    assert st.virtual_seconds == st0.virtual_seconds  # clocks as one by one
    # not degenerate: the workgroup id and the per-wave masks show in the results
    rows = got.view(np.uint32).reshape(len(ROWS), -1)
    assert len(np.unique(rows[ROWS.index(5)])) > THREADS
    first = rows[ROWS.index(24)].reshape(GRID * THREADS // LANES, LANES)
    assert (first == first[:, :1]).all() and len(np.unique(first[:, 0])) > GRID


def test_gangs_whose_clocks_spread_past_a_quantum_still_run_every_member():
    """Workgroup 1 starts 2,100 cycles late, beyond a gang's horizon: the gang that runs
    leaves it behind (a gang back in the schedule waits under one entry, ``Machine._run``),
    and every wave still runs to the end with the values and clocks of one by one."""
    got, st, ganged = _run(True, hold={1: 1e-6})
    want, st0, _ = _run(False, hold={1: 1e-6})
    assert ganged > st.instructions // 2
    assert got.tobytes() == want.tobytes()
    assert st.instructions == st0.instructions
    assert st.virtual_seconds == st0.virtual_seconds


# ------------------------------------------------------------------------------ real kernels
LAYOUT = "emulator-tiny-tp4"
G = 3  # waves in each gang the instructions are checked on


def _waves(k, regs: np.ndarray, svals: list[list[int]], execs: list[int]) -> list[Wave]:
    wg = Workgroup(0, np.zeros((1, 0), np.uint8), None)
    out = []
    for j in range(G):
        w = Wave(wg, j, k.vregs, k.accum, 0, regs[:, j * LANES : (j + 1) * LANES])
        w.s = list(svals[j])
        w.set_exec(execs[j])
        wg.waves.append(w)
        out.append(w)
    return out


def _state(rng, k, uniform: tuple[int, ...]):
    regs = rng.integers(0, 1 << 32, (k.vregs, G * LANES), dtype=np.uint64).astype(np.uint32)
    svals = [rng.integers(0, 1 << 32, 128, dtype=np.uint64).tolist() for _ in range(G)]
    for j in range(1, G):
        for r in uniform:
            svals[j][r] = svals[0][r]
    execs = [(1 << 64) - 1, int(rng.integers(0, 1 << 63)), 0]
    return regs, svals, execs


def _same_on_a_gang(k, pc: int, alone, ganged, regs, svals, execs) -> bool:
    """``ganged`` (instruction or fused block ``pc``, in the form a gang runs) on a gang
    leaves the registers ``alone`` (its form for one wave) leaves on each wave alone; or, when
    it faults alone, it faults on the gang before writing anything (the machine then steps the
    members alone, and the fault names one of them). True when it ran."""
    regs_alone = regs.copy()
    faults = 0
    singles = _waves(k, regs_alone, svals, execs)
    for w in singles:
        try:
            alone(w)
            w.wait(0, 0)  # a lane exchange's result lands at its wait
        except Fault:
            faults += 1
    waves = _waves(k, regs, svals, execs)
    if faults:
        kept = regs.copy()
        with pytest.raises(Fault):
            ganged(Gang(waves, regs))
        assert np.array_equal(regs, kept), k.texts[pc]
        return False
    ganged(Gang(waves, regs))
    for w in waves:
        w.wait(0, 0)
    if not np.array_equal(regs, regs_alone):
        bad = np.argwhere(regs != regs_alone)[0]
        raise AssertionError(
            f"{k.texts[pc]}: v-register row {bad[0]}, wave {bad[1] // LANES} lane "
            f"{bad[1] % LANES} differs on the gang"
        )
    # the SGPRs (a compare's mask, EXEC) each member wrote as it would alone
    assert [w.s for w in waves] == [w.s for w in singles], k.texts[pc]
    assert all(
        np.array_equal(w.exec_mask, x.exec_mask) for w, x in zip(waves, singles, strict=True)
    )
    return True


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("variant", ["narrow", "wide"])
def test_every_gang_able_instruction_of_the_kernels_runs_the_same_on_a_gang(
    tmp_path_factory: pytest.TempPathFactory, arch: str, variant: str
):
    """Each instruction (and fused block) ``Compiled.gang`` lets a gang run but those that
    touch memory (the program above runs them), on random
    registers, per-wave EXEC (all, some, no lanes) and per-wave lane masks (VCC and the other
    SGPRs but those the gang must agree on): once on the gang of 3 waves, and once on each
    wave alone; every register bit the same."""
    hit = stored_kernels(tmp_path_factory, LAYOUT, arch, (variant,))[1][variant]
    m = Machine(arch, 1)
    k = m.load(hit.data, hit.entry.symbol)
    prog = k.program
    rng = np.random.default_rng(7)
    lane_ops = {  # the DS instructions that exchange lanes and touch no LDS
        prog.steps[pc]
        for pc, inst in enumerate(k.decoded.instructions)
        if inst.fmt == "DS" and inst.op.kind in ("swizzle", "permute")
    }
    cases = [
        (pc, u, prog.steps[pc], prog.gang_steps[pc] or prog.steps[pc])
        for pc, u in enumerate(prog.gang)
        if u is not None
        and (k.decoded.instructions[pc].fmt not in ("FLAT", "DS") or prog.steps[pc] in lane_ops)
    ]  # LDS and global memory: test_gangs_compute_what_waves_one_by_one_compute runs them
    cases += [(b.start, b.gang, b.run, b.run) for b in prog.blocks if b and b.gang is not None]
    assert len(cases) > 500, "the kernel has few gang-able instructions: is Compiled.gang set?"
    assert variant == "narrow" or any("v_mfma" in k.texts[pc] for pc, *_ in cases)
    assert any(k.texts[pc].startswith("v_cmp") for pc, *_ in cases)
    assert any(k.texts[pc].startswith("v_readfirstlane") for pc, *_ in cases)
    assert any(k.texts[pc].startswith(("ds_swizzle", "ds_bpermute")) for pc, *_ in cases)
    for pc, uniform, alone, ganged in cases:  # random bits: NaNs, infinities, overflows
        regs, svals, execs = _state(rng, k, uniform)
        if not _same_on_a_gang(k, pc, alone, ganged, regs, svals, execs):  # MFMA, partial EXEC
            full = [(1 << 64) - 1] * G
            assert _same_on_a_gang(k, pc, alone, ganged, regs, svals, full), k.texts[pc]
    # EXEC and the lane-mask sources are each member's own: never a reason to step alone
    assert not any(VCC_LO in u or EXEC_LO in u for _, u, *_ in cases)


# ------------------------------------------------------------------------------ scalar
def scalar_program() -> Asm:
    """Scalar ALU work, SCC and branches that agree in every wave (a counted loop, a select,
    a carry chain, saveexec) beside work that differs between workgroups (the workgroup id in
    s2), each result stored by every thread."""
    a = prologue(Asm())
    a.sop1("s_mov_b32", 10, i(0)).sop1("s_mov_b32", 11, i(7))
    a.label("loop").sop2("s_add_u32", 10, s(10), LIT, lit=0x9E3779B9)
    a.sop2("s_addc_u32", 12, s(12), i(0))  # SCC from the add: the same in every wave
    a.sop2("s_sub_i32", 11, s(11), i(1)).sopc("s_cmp_lg_u32", s(11), i(0))
    a.branch("s_cbranch_scc1", "loop")
    a.sop2("s_mul_i32", 13, s(2), LIT, lit=1000003)  # differs between workgroups
    # a destination that differs between workgroups before an instruction that only writes it
    a.sop1("s_mov_b32", 19, s(2)).sopk("s_movk_i32", 19, 9)
    a.sopc("s_cmp_eq_u32", s(2), i(1)).sop2("s_cselect_b32", 14, s(13), s(10))
    a.sopk("s_movk_i32", 15, 77).sopk("s_addk_i32", 15, 5)
    a.vopc("v_cmp_gt_u32", i(40), v(0))
    a.sop1("s_and_saveexec_b64", 16, VCC).sop1("s_bcnt1_i32_b64", 18, EXEC)
    a.sop1("s_mov_b64", EXEC, s(16))
    a.vop1("v_mov_b32", 18, s(2)).vop2("v_lshlrev_b32", 18, i(10), v(18))  # 4 * THREADS * wg
    a.vop2("v_add_u32", 1, v(1), v(18))  # each thread its own word of a row
    for r in (10, 11, 12, 13, 14, 15, 16, 18, 19):
        a.vop1("v_mov_b32", 2, s(r))
        a.glob("global_store_dword", addr=1, data=2, saddr=4)
        a.sop2("s_add_u32", 4, 4, LIT, lit=4 * THREADS * GRID).sop2("s_addc_u32", 5, 5, i(0))
    return a.endpgm()


def _run_scalar(gangs: bool, monkeypatch: pytest.MonkeyPatch):
    once = [0, 0]  # scalar instructions run once for a gang; of them, ones whose destination
    # s19 differed between members before (a gang spanning workgroups)
    real = Gang.copy_scalar

    def counted(self, regs):
        once[0] += 1
        if 19 in regs:
            once[1] += any(w.s[19] != self.waves[0].s[19] for w in self.waves)
        return real(self, regs)

    monkeypatch.setattr(Gang, "copy_scalar", counted)
    m = Machine("gfx942", 1, gangs=gangs)
    out = buffer(m, OUT, 4 * THREADS * GRID * 9)
    k = m.load(kernel_object(scalar_program()))
    m.launch(0, k, GRID, THREADS, kernargs(OUT))
    return out, m.run(), once


def test_a_gang_runs_scalar_work_once_when_its_members_agree(monkeypatch):
    """The scalar ALU and branches run once for a gang whose members agree in the registers
    and SCC they touch (``Compiled.scalar``): the same memory, instruction counts and clocks
    as every wave alone; where the members disagree (the workgroup id) each runs its own."""
    got, st, once = _run_scalar(True, monkeypatch)
    want, st0, none = _run_scalar(False, monkeypatch)
    assert none == [0, 0] and once[0] > 20  # the loop's scalar work ran once a gang
    assert once[1] > 0  # and s_movk ran once although its destination differed before
    assert got.tobytes() == want.tobytes()
    assert (st.instructions, st.virtual_seconds) == (st0.instructions, st0.virtual_seconds)
    rows = got.view(np.uint32).reshape(9, GRID, THREADS)
    assert rows[8].min() == rows[8].max() == 9
    assert len(np.unique(rows[3])) == GRID  # s2 * 1000003: each workgroup its own
    assert rows[6].min() == rows[6].max() != 0  # saveexec's old EXEC: all lanes, in every wave


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
@pytest.mark.parametrize("variant", ["narrow", "wide"])
def test_every_scalar_instruction_of_the_kernels_runs_the_same_once_for_a_gang(
    tmp_path_factory: pytest.TempPathFactory, arch: str, variant: str
):
    """Each instruction ``Compiled.scalar`` lets a gang run once (the scalar ALU, branches,
    no-ops), on random SGPRs and SCC that agree in the three members where it reads and differ
    elsewhere (its destinations included): run on the first, its destinations and SCC given to
    the others, against each wave alone; every SGPR, SCC, EXEC and the next instruction the
    same."""
    hit = stored_kernels(tmp_path_factory, LAYOUT, arch, (variant,))[1][variant]
    m = Machine(arch, 1)
    k = m.load(hit.data, hit.entry.symbol)
    prog = k.program
    rng = np.random.default_rng(11)
    cases = [(pc, sc) for pc, sc in enumerate(prog.scalar) if sc is not None]
    assert len(cases) > 200, "the kernel has few scalar instructions: is Compiled.scalar set?"
    assert any(k.texts[pc].startswith("s_cbranch") for pc, _ in cases)
    assert any(set(writes) - set(reads) for _, (reads, writes) in cases)
    for pc, (reads, writes) in cases:
        vregs = np.zeros((k.vregs, G * LANES), dtype=np.uint32)
        _, svals, _ = _state(rng, k, reads)
        scc = int(rng.integers(0, 2))
        execs = [svals[0][EXEC_LO] | svals[0][EXEC_LO + 1] << 32] * G
        if EXEC_LO not in reads:
            execs = [int(rng.integers(0, 1 << 63)) for _ in range(G)]
        singles = _waves(k, vregs.copy(), svals, execs)
        nexts = []
        for w in singles:
            w.scc = scc
            nexts.append(prog.steps[pc](w))
        waves = _waves(k, vregs, svals, execs)
        for w in waves:
            w.scc = scc
        g = Gang(waves, vregs)
        assert g.scalar_agrees(reads), k.texts[pc]
        nxt = prog.steps[pc](waves[0])
        g.copy_scalar(writes)
        assert nexts == [nxt] * G, k.texts[pc]
        assert [w.s for w in waves] == [w.s for w in singles], k.texts[pc]
        assert [w.scc for w in waves] == [w.scc for w in singles], k.texts[pc]
        assert all(
            np.array_equal(w.exec_mask, x.exec_mask) for w, x in zip(waves, singles, strict=True)
        ), k.texts[pc]


# ------------------------------------------------------------------------------ shared counters
PART_ROWS = [11, 12, 14]


def parting_program() -> Asm:
    """A gang's loads in flight when its workgroups' paths part: workgroup 1 issues another
    load and waits for one of two, the others wait for all; then all meet and store."""
    a = prologue(Asm())
    a.smem("s_load_dwordx2", 22, 0, 8).waitcnt(lgkm=0)
    a.vop1("v_mov_b32", 18, s(2)).vop2("v_lshlrev_b32", 18, i(10), v(18))  # 4 * THREADS * wg
    a.vop2("v_add_u32", 1, v(1), v(18))
    a.glob("global_load_dword", addr=1, vdst=11, saddr=22)  # one record for the whole gang
    a.glob("global_load_dword", addr=1, vdst=12, saddr=22, offset=4)
    a.sopc("s_cmp_eq_u32", s(2), i(1))
    a.branch("s_cbranch_scc1", "other")
    a.waitcnt(vm=1)  # the others: the first load only, then the second
    a.vop2("v_add_u32", 11, i(7), v(11))
    a.waitcnt(vm=0)
    a.vop1("v_mov_b32", 14, i(3))
    a.branch("s_branch", "join")
    a.label("other")  # workgroup 1: its own copy of the counters from here
    a.glob("global_load_dword", addr=1, vdst=14, saddr=22, offset=8)
    a.waitcnt(vm=2)
    a.vop2("v_add_u32", 11, i(9), v(11))
    a.waitcnt(vm=0)
    a.label("join")
    for r in PART_ROWS:
        a.glob("global_store_dword", addr=1, data=r, saddr=4)
        a.sop2("s_add_u32", 4, 4, LIT, lit=4 * THREADS * GRID).sop2("s_addc_u32", 5, 5, i(0))
    return a.endpgm()


def test_a_gangs_accesses_are_one_record_its_members_share_until_their_paths_part(monkeypatch):
    """A gang's load is one record every member's counters hold (``wave.Counters``), its wait
    retires it once; when the members part with loads still in flight, each path takes its
    own copy: the values and clocks are those of the waves one by one."""
    from mono_aot.emulator import gang as gang_mod

    shared: list[int] = []
    real = gang_mod.Gang.counters

    def counters(self):
        c = real(self)
        if c is not None and c.vm:
            shared.append(len(self.waves))
        return c

    monkeypatch.setattr(gang_mod.Gang, "counters", counters)

    def run(gangs: bool):
        m = Machine("gfx942", 1, gangs=gangs)
        out = buffer(m, OUT, 4 * THREADS * GRID * len(PART_ROWS))
        data = buffer(m, IN, 4 * THREADS * GRID + 16, "in")
        data[:] = np.random.default_rng(5).integers(0, 256, data.size, dtype=np.uint8)
        k = m.load(kernel_object(parting_program(), lds=0))
        m.launch(0, k, GRID, THREADS, kernargs(OUT, IN))
        return out, m.run()

    got, st = run(True)
    assert shared and max(shared) == GRID * THREADS // LANES  # the whole launch, one record
    assert min(shared) < max(shared)  # and parts of it, after the paths parted
    want, st0 = run(False)
    assert got.tobytes() == want.tobytes()
    assert st.virtual_seconds == st0.virtual_seconds
    rows = got.view(np.uint32).reshape(len(PART_ROWS), GRID, THREADS)
    assert (rows[2, 1] != 3).all() and (rows[2, 0] == 3).all()  # the paths did part
