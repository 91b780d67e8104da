"""The executor on hand-assembled programs: scalar and vector operand handling, memory faults,
the s_waitcnt check, barriers, the virtual clock, the scheduler, peer flags across devices and
atomics across workgroups. Fast (no compile): the programs are built by ``tests/emulator/asm``
and run with the test-only lane operations of ``tests/emulator/lane_ops``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mono_aot.emulator.decode import decode_kernel
from mono_aot.emulator.machine import CLOCK_HZ, EmulatorError
from mono_aot.emulator.memory import Memory, MemoryFault
from tests.emulator.asm import EXEC, LIT, VCC, Asm, i, kernel_object, s, v
from tests.emulator.emu import OUT, buffer, kernargs, machine, prologue, run


def store_sgprs(a: Asm, regs: list[int], base: int = 0) -> Asm:
    """Store s[r] for r in regs to out[base..] from lane 0 (EXEC becomes 1)."""
    a.sop1("s_mov_b64", EXEC, i(1)).vop1("v_mov_b32", 3, i(0))
    for k, r in enumerate(regs):
        a.vop1("v_mov_b32", 2, s(r)).glob("global_store_dword", addr=3, data=2, saddr=4,
                                           offset=base + 4 * k)  # fmt: skip
    return a.endpgm()


def test_scalar_alu_branches_and_saveexec():
    a = prologue(Asm())
    a.sop1("s_mov_b32", 10, LIT, lit=0xFFFFFFFF)
    a.sop2("s_add_u32", 11, s(10), i(2))  # 1, carry out
    a.sop2("s_addc_u32", 12, i(0), i(0))  # the carry: 1
    a.sop2("s_mul_hi_u32", 14, s(10), s(10))
    a.sop1("s_bcnt1_i32_b64", 15, EXEC)
    a.sop1("s_brev_b32", 16, i(1))
    a.sopk("s_movk_i32", 13, -5)
    a.sopc("s_cmp_lt_i32", s(13), i(0))
    a.sop2("s_cselect_b32", 17, i(7), i(9))
    a.sop1("s_mov_b32", 18, i(0)).sop1("s_mov_b32", 19, i(5))
    a.label("loop").sop2("s_add_i32", 18, s(18), i(3)).sop2("s_sub_i32", 19, s(19), i(1))
    a.sopc("s_cmp_lg_u32", s(19), i(0)).branch("s_cbranch_scc1", "loop")
    a.vopc("v_cmp_gt_u32", i(10), v(0))  # lanes 0..9
    a.sop1("s_and_saveexec_b64", 22, VCC)
    a.sop1("s_bcnt1_i32_b64", 24, EXEC)
    a.sop1("s_mov_b64", EXEC, s(22))
    store_sgprs(a, [11, 12, 14, 15, 16, 17, 18, 24, 13, 22, 23])
    out, _ = run(a)
    got = out[:44].view(np.uint32).tolist()
    assert got == [1, 1, 0xFFFFFFFE, 64, 0x80000000, 7, 15, 10, 0xFFFFFFFB, 0xFFFFFFFF, 0xFFFFFFFF]


def test_vector_operands_sdwa_vop3_vopc_carry_pk_mov_mbcnt():
    a = prologue(Asm())
    a.vop1("v_mov_b32", 6, LIT, lit=0xFF).vop1("v_mov_b32", 7, LIT, lit=0x10000)
    a.vop1("v_mov_b32", 5, LIT, lit=0x1234ABCD)
    # (sext BYTE_0 of 0xff = -1) + (WORD_1 of 0x10000 = 1) = 0 into WORD_1, preserving WORD_0
    a.sdwa("v_add_u32", 5, 6, 7, src0_sel=0, sext0=1, src1_sel=5, dst_sel=5, dst_unused=2)
    a.vop1("v_mov_b32", 9, 244)  # 2.0 (inline constant 244)
    a.vop1("v_mov_b32", 10, LIT, lit=0x40400000)  # 3.0
    a.vop3("v_mul_f32", 8, v(9), v(10), neg=1)  # -2.0 * 3.0
    a.vop2("v_add_co_u32", 11, LIT, v(0), lit=0xFFFFFFFF)  # carry for v0 >= 1
    a.vop3("v_addc_co_u32", 12, i(0), i(0), VCC, sdst=VCC)
    a.vop1("v_mov_b32", 16, i(1)).vop1("v_mov_b32", 17, i(2)).vop1("v_mov_b32", 18, i(3))
    a.vop1("v_mov_b32", 19, i(4))
    a.vop3p("v_pk_mov_b32", 14, v(16), v(18), opsel=0b01)  # {v17, v18}
    a.vop3("v_mbcnt_lo_u32_b32", 13, i(-1), i(0)).vop3("v_mbcnt_hi_u32_b32", 13, i(-1), v(13))
    a.sop1("s_mov_b32", EXEC, LIT, lit=0xFFFF).sop1("s_mov_b32", EXEC + 1, i(0))
    a.vop3("v_cmp_gt_u32", 30, i(50), v(0))  # VOP3 compare into s[30:31], 16 lanes active
    a.sop1("s_mov_b64", EXEC, LIT, lit=0xF0)
    a.vop1("v_readfirstlane_b32", 32, v(0))
    a.sop1("s_mov_b64", EXEC, i(-1))
    for k, r in enumerate((5, 8, 12, 14, 15, 13)):
        a.glob("global_store_dword", addr=1, data=r, saddr=4, offset=256 * k)
    store_sgprs(a, [30, 31, 32], base=2048)
    out, _ = run(a, out_bytes=8192)
    lanes = [out[256 * k : 256 * k + 256].view(np.uint32) for k in range(6)]
    assert (lanes[0] == 0x0000ABCD).all()
    assert (lanes[1].view(np.float32) == -6.0).all()
    assert lanes[2].tolist() == [0] + [1] * 63
    assert (lanes[3] == 2).all() and (lanes[4] == 3).all()
    assert lanes[5].tolist() == list(range(64))
    assert out[2048:2060].view(np.uint32).tolist() == [0xFFFF, 0, 4]


def test_out_of_bounds_store_names_lane_and_address():
    a = prologue(Asm()).glob("global_store_dword", addr=1, data=0, saddr=4).endpgm()
    with pytest.raises(EmulatorError) as e:
        run(a, out_bytes=128)
    msg = str(e.value)
    assert e.value.lane == 32 and e.value.address == OUT + 128
    for part in ("k_0 on device 0, workgroup 0, wave 0", "global_store_dword v1, v0, s[4:5]",
                 "lane 32", f"0x{OUT + 128:x}", "outside every allocation"):  # fmt: skip
        assert part in msg, msg


def test_overlapping_map_names_both():
    mem = Memory()
    mem.map(0x1000, np.zeros(256, np.uint8), "a", 0)
    with pytest.raises(MemoryFault, match=r"'b'.*overlaps the mapped 'a'"):
        mem.map(0x10F0, np.zeros(64, np.uint8), "b", 1)
    mem.map(0x1100, np.zeros(64, np.uint8), "c", 1)  # adjacent is fine
    mem.write(0x1100, b"\x01\x02")
    assert mem.read(0x1100, 2) == b"\x01\x02"
    with pytest.raises(MemoryFault):
        mem.read(0x10FF, 2)  # straddles two allocations


def test_read_before_waitcnt_is_reported():
    a = prologue(Asm())
    a.glob("global_load_dword", addr=1, vdst=2, saddr=4)
    a.vop2("v_add_u32", 3, v(2), v(2))  # no s_waitcnt vmcnt(0) before the use
    a.endpgm()
    with pytest.raises(
        EmulatorError, match=r"read of v2 before s_waitcnt retired the load at 0x10"
    ):
        run(a)


def test_waitcnt_retires_and_load_sees_memory():
    a = prologue(Asm())
    a.glob("global_load_dword", addr=1, vdst=2, saddr=4).waitcnt(vm=0)
    a.vop2("v_add_u32", 3, v(2), v(2)).glob("global_store_dword", addr=1, data=3, saddr=4,
                                            offset=256).endpgm()  # fmt: skip
    m = machine()
    out = buffer(m, OUT, 512)
    out[:256] = np.arange(64, dtype=np.uint32).view(np.uint8)
    m.launch(0, m.load(kernel_object(a)), 1, 64, kernargs(OUT))
    m.run()
    assert out[256:].view(np.uint32).tolist() == [2 * x for x in range(64)]


def _barrier_program(with_barrier: bool) -> Asm:
    a = prologue(Asm())
    a.vop1("v_readfirstlane_b32", 6, v(0)).sopc("s_cmp_lt_u32", s(6), i(64))
    a.branch("s_cbranch_scc1", "wait")
    a.sopp("s_sleep", 20)  # wave 1 writes late
    a.sopk("s_movk_i32", 7, -256).vop2("v_add_u32", 4, s(7), v(1))
    a.ds("ds_write_b32", addr=4, data0=0).waitcnt(lgkm=0)
    a.label("wait")
    if with_barrier:
        a.sopp("s_barrier")
    a.sopc("s_cmp_lt_u32", s(6), i(64)).branch("s_cbranch_scc0", "end")
    a.ds("ds_read_b32", addr=1, vdst=5).waitcnt(lgkm=0)
    a.glob("global_store_dword", addr=1, data=5, saddr=4)
    return a.label("end").endpgm()


def test_barrier_waits_for_every_wave_of_the_workgroup():
    out, _ = run(_barrier_program(True), block=128, lds=256)
    assert out[:256].view(np.uint32).tolist() == list(range(64, 128))
    out, _ = run(_barrier_program(False), block=128, lds=256)
    assert not out[:256].any()  # without it wave 0 reads before wave 1 wrote


def test_lds_out_of_range_names_lane():
    a = prologue(Asm()).ds("ds_read_b32", addr=1, vdst=5).waitcnt(lgkm=0).endpgm()
    with pytest.raises(EmulatorError, match=r"lane 32: LDS address 0x80 \(\+4 bytes\) is outside"):
        run(a, lds=128)


def test_lds_address_is_a_32_bit_sum_of_base_and_offset():
    """CDNA3 "LDS instructions": the address is ADDR + OFFSET in 32 bits, so a base below zero
    plus a larger offset is in range (LLVM folds constants into the offset this way)."""
    a = prologue(Asm())
    a.sopk("s_movk_i32", 7, -256).vop2("v_add_u32", 4, s(7), v(1))
    a.ds("ds_write_b32", addr=4, data0=0, offset=256).waitcnt(lgkm=0)
    a.ds("ds_read_b32", addr=1, vdst=5).waitcnt(lgkm=0)
    a.glob("global_store_dword", addr=1, data=5, saddr=4)
    out, _ = run(a.endpgm(), lds=256)
    assert out[:256].view(np.uint32).tolist() == list(range(64))


@pytest.mark.parametrize("lds", [512, 510])  # a row of whole dwords, and one that is not
@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_lds_reads_gather_the_bytes_each_lane_addresses(n: int, lds: int):
    """``_lds_gather`` reads aligned dwords a dword at a time, and anything else byte by
    byte: both give each active lane its bytes, inactive lanes 0, from its own workgroup's
    LDS (three workgroups' rows of one array, as a gang reads them)."""
    from mono_aot.emulator.program import _lds_gather

    rng = np.random.default_rng(n + lds)
    rows = rng.integers(0, 256, (3, -(-lds // 4) * 4), dtype=np.uint8)
    flat = rows.reshape(-1)
    lanes = 3 * 64
    first = np.repeat(np.arange(3, dtype=np.int64) * rows.shape[1], 64)
    act = rng.random(lanes) < 0.8
    for align in (16, 4, 1):
        addr = rng.integers(0, (lds - n) // align + 1, lanes).astype(np.int64) * align
        got = _lds_gather(flat, lds, first, addr, act, n)
        want = np.zeros((lanes, n), dtype=np.uint8)
        for lane in np.flatnonzero(act):
            row, at = divmod(int(first[lane]) + int(addr[lane]), rows.shape[1])
            want[lane] = rows[row, at : at + n]
        assert got.tobytes() == want.tobytes(), (n, lds, align)


def test_ds_swizzle_bpermute_read2():
    a = prologue(Asm())
    a.vop2("v_add_u32", 4, i(4), v(1)).vop2("v_and_b32", 4, LIT, v(4), lit=0xFF)
    a.ds("ds_bpermute_b32", addr=4, data0=0, vdst=5)
    a.ds("ds_swizzle_b32", addr=0, vdst=6, offset=0x1F | 1 << 10)  # SWAP,1: lane ^ 1
    a.ds("ds_write_b32", addr=1, data0=0)
    a.ds("ds_read2_b32", addr=1, vdst=8, offset0=0, offset1=1)
    a.waitcnt(lgkm=0)
    for k, r in enumerate((5, 6, 8, 9)):
        a.glob("global_store_dword", addr=1, data=r, saddr=4, offset=256 * k)
    out, _ = run(a.endpgm(), lds=260)
    got = [out[256 * k : 256 * k + 256].view(np.uint32).tolist() for k in range(4)]
    assert got[0] == [(x + 1) % 64 for x in range(64)]
    assert got[1] == [x ^ 1 for x in range(64)]
    assert got[2] == list(range(64))
    assert got[3] == list(range(1, 64)) + [0]


def test_sleep_and_memrealtime_on_the_virtual_clock():
    a = prologue(Asm())
    a.smem("s_memrealtime", 10, 0).waitcnt(lgkm=0)
    a.sopp("s_sleep", 100)
    a.smem("s_memrealtime", 12, 0).waitcnt(lgkm=0)
    a.sop2("s_sub_u32", 14, s(12), s(10))
    out, st = run(store_sgprs(a, [14]))
    ticks = int(out[:4].view(np.uint32)[0])
    assert 6400 // 21 <= ticks <= (6400 + 400) // 21  # 64 * 100 cycles at 2.1 GHz, 100 MHz
    assert st.virtual_seconds >= 6400 / CLOCK_HZ


def _ticket_program() -> Asm:
    """Lane 0 of every wave takes a ticket (atomic add with return) and stores it by wave."""
    a = prologue(Asm())
    a.vop1("v_readfirstlane_b32", 9, v(0)).sop2("s_lshr_b32", 9, s(9), i(6))
    a.sop2("s_lshl_b32", 10, s(2), i(1)).sop2("s_add_u32", 10, s(10), s(9))  # global wave id
    a.sop1("s_mov_b64", EXEC, i(1))
    a.vop1("v_mov_b32", 3, i(0)).vop1("v_mov_b32", 6, i(1))
    a.glob("global_atomic_add", addr=3, data=6, vdst=7, saddr=4, sc0=1).waitcnt(vm=0)
    a.vop1("v_mov_b32", 8, s(10)).vop2("v_lshlrev_b32", 8, i(2), v(8))
    a.glob("global_store_dword", addr=8, data=7, saddr=4, offset=64)
    return a.endpgm()


def _tickets(seed: int, shuffle: bool) -> list[int]:
    out, _ = run(_ticket_program(), grid=8, block=128, seed=seed, shuffle=shuffle)
    assert out[:4].view(np.uint32)[0] == 16
    t = out[64 : 64 + 64].view(np.uint32).tolist()
    assert sorted(t) == list(range(16))
    return t


def test_scheduler_is_deterministic_by_seed_and_shuffle_changes_interleavings():
    assert _tickets(3, False) == _tickets(3, False)
    assert _tickets(5, True) == _tickets(5, True)
    assert len({tuple(_tickets(sd, True)) for sd in range(6)}) > 1
    assert len({tuple(_tickets(sd, False)) for sd in range(6)}) > 1  # ties broken by the seed


def test_atomics_across_workgroups():
    a = prologue(Asm())
    a.vop1("v_mov_b32", 3, i(0)).vop1("v_mov_b32", 6, i(1)).vop1("v_mov_b32", 7, 240)  # 0.5
    a.glob("global_atomic_add", addr=3, data=6, saddr=4)
    a.glob("global_atomic_add_f32", addr=3, data=7, saddr=4, offset=4)
    a.vop1("v_mov_b32", 10, i(1)).vop1("v_mov_b32", 11, i(0))
    a.glob("global_atomic_add_x2", addr=3, data=10, saddr=4, offset=8)
    a.sop1("s_mov_b64", EXEC, i(1))
    a.vop1("v_mov_b32", 12, s(2)).vop2("v_add_u32", 12, i(1), v(12)).vop1("v_mov_b32", 13, i(0))
    a.glob("global_atomic_cmpswap", addr=3, data=12, vdst=14, saddr=4, offset=16, sc0=1)
    # each wave stores the old value it saw at word 16 + 2 * workgroup + wave (v0 = 64 * wave)
    a.waitcnt(vm=0).vop1("v_mov_b32", 16, s(2)).vop2("v_lshlrev_b32", 16, i(1), v(16))
    a.vop2("v_lshrrev_b32", 15, i(6), v(0)).vop2("v_add_u32", 15, v(15), v(16))
    a.vop2("v_lshlrev_b32", 15, i(2), v(15))
    a.glob("global_store_dword", addr=15, data=14, saddr=4, offset=64)
    out, _ = run(a.endpgm(), grid=4, block=128)
    w = out[:96].view(np.uint32)
    assert w[0] == 512 and out[4:8].view(np.float32)[0] == 256.0
    assert int(w[2]) | int(w[3]) << 32 == 512
    winners = [int(x) for x in w[16:24]]  # the old values the 8 waves saw
    assert w[4] in (1, 2, 3, 4) and winners.count(0) == 1 and winners.count(int(w[4])) == 7


def _flag_programs() -> tuple[Asm, Asm]:
    writer = Asm()  # device 0: data into device 1's buffer, then the flag
    writer.smem("s_load_dwordx2", 4, 0, 0).waitcnt(lgkm=0).sop1("s_mov_b64", EXEC, i(1))
    writer.vop1("v_mov_b32", 3, i(0)).vop1("v_mov_b32", 2, i(42)).vop1("v_mov_b32", 6, i(1))
    writer.glob("global_store_dword", addr=3, data=2, saddr=4, offset=4).waitcnt(vm=0)
    writer.glob("global_atomic_swap", addr=3, data=6, saddr=4).endpgm()
    reader = Asm()  # device 1: spin on the flag, then copy the data to out
    reader.smem("s_load_dwordx4", 4, 0, 0).waitcnt(lgkm=0).sop1("s_mov_b64", EXEC, i(1))
    reader.vop1("v_mov_b32", 3, i(0))
    reader.label("spin").glob("global_load_dword", addr=3, vdst=2, saddr=4).waitcnt(vm=0)
    reader.vop1("v_readfirstlane_b32", 8, v(2)).sopc("s_cmp_eq_u32", s(8), i(0))
    reader.branch("s_cbranch_scc0", "done").sopp("s_sleep", 1).branch("s_branch", "spin")
    reader.label("done").glob("global_load_dword", addr=3, vdst=2, saddr=4, offset=4)
    reader.waitcnt(vm=0).glob("global_store_dword", addr=3, data=2, saddr=6).endpgm()
    return writer, reader


@pytest.mark.parametrize("late", [0.0, 2e-6])
def test_two_devices_exchange_a_flag_through_peer_memory(late):
    m = machine(devices=2)
    peer = buffer(m, 0x6000_0000_0000, 64, "mailbox of device 1", device=1)
    out = buffer(m, OUT, 64)
    writer, reader = _flag_programs()
    m.launch(1, m.load(kernel_object(reader)), 1, 64, kernargs(0x6000_0000_0000, OUT))
    m.launch(0, m.load(kernel_object(writer)), 1, 64, kernargs(0x6000_0000_0000),
             hold={0: late})  # fmt: skip
    st = m.run()
    assert out[:4].view(np.uint32)[0] == 42 and peer[:4].view(np.uint32)[0] == 1
    assert st.virtual_seconds >= late
    reader_stats = next(x for x in st.launches if x.device == 1)
    assert reader_stats.virtual_seconds >= late  # it spun until the held writer ran


def test_launches_on_one_device_run_in_order():
    first = prologue(Asm()).glob("global_store_dword", addr=1, data=0, saddr=4).endpgm()
    second = prologue(Asm())
    second.glob("global_load_dword", addr=1, vdst=2, saddr=4).waitcnt(vm=0)
    second.vop2("v_add_u32", 2, i(1), v(2))
    second.glob("global_store_dword", addr=1, data=2, saddr=4, offset=256).endpgm()
    m = machine()
    out = buffer(m, OUT, 512)
    m.launch(0, m.load(kernel_object(first)), 1, 64, kernargs(OUT))
    m.launch(0, m.load(kernel_object(second)), 1, 64, kernargs(OUT))
    st = m.run()
    assert out[256:].view(np.uint32).tolist() == list(range(1, 65))
    assert st.launches[0].end_cycles <= st.launches[1].start_cycles


def test_a_kernel_loads_once_a_machine_and_runs_on_every_device():
    """Every rank loads the same kernels: the second load is the first's kernel (decoding and
    compiling takes seconds), launched on another device with its own registers and memory;
    other lane operations (a test's table) compile it again."""
    prog = prologue(Asm()).vop2("v_add_u32", 2, s(2), v(0))
    prog.glob("global_store_dword", addr=1, data=2, saddr=4).endpgm()
    blob = kernel_object(prog)
    m = machine(devices=2)
    outs = [buffer(m, OUT + (d << 24), 256, f"out {d}", device=d) for d in range(2)]
    k0, k1 = m.load(blob), m.load(bytearray(blob))
    assert k0 is k1
    for d in range(2):
        m.launch(d, k0, 1, 64, kernargs(OUT + (d << 24)))
    m.run()
    for out in outs:  # thread id + workgroup id (0)
        assert out.view(np.uint32).tolist() == list(range(64))
    m.ops = {**m.ops}
    assert m.load(blob) is not k0


def test_a_device_idle_in_one_run_starts_the_next_with_the_others():
    """The host queues a run's launches after the previous run returned: a device that sat
    out a run (a rank that skipped a step) must not start in the emulated past, or it would
    wait for peers that have not started and time out at once."""
    busy = prologue(Asm()).sopp("s_sleep", 100).endpgm()
    m = machine(devices=2)
    buffer(m, OUT, 64)
    k = m.load(kernel_object(busy))
    m.launch(0, k, 1, 64, kernargs(OUT))
    first = m.run()
    m.launch(0, k, 1, 64, kernargs(OUT))
    m.launch(1, k, 1, 64, kernargs(OUT))
    second = m.run()
    ends = first.launches[0].end_cycles
    assert ends >= 6400
    assert sorted(x.start_cycles for x in second.launches) == [ends, ends]
    assert second.virtual_seconds == pytest.approx(first.virtual_seconds, rel=0.1)


def test_instruction_limit_names_the_spinning_wave():
    a = Asm().label("l").branch("s_branch", "l")
    with pytest.raises(EmulatorError, match=r"instruction limit 1000 reached.*workgroup 0 wave 0"):
        m = machine()
        m.launch(0, m.load(kernel_object(a)), 1, 64, kernargs(OUT))
        m.run(max_instructions=1000)


def test_a_faulted_run_leaves_nothing_queued():
    """A fault stops the whole run: the next run does not resume its launches."""
    spin = Asm().label("l").branch("s_branch", "l")
    m = machine(devices=2)
    k = m.load(kernel_object(spin))
    m.launch(0, k, 1, 64, kernargs(OUT))
    m.launch(0, k, 1, 64, kernargs(OUT))  # queued behind the first
    m.launch(1, k, 1, 64, kernargs(OUT))
    with pytest.raises(EmulatorError, match="instruction limit"):
        m.run(max_instructions=1000)
    st = m.run(max_instructions=1000)  # resuming the spinning launches would hit the limit
    assert st.instructions == 0 and st.launches == []


def test_progress_is_reported_every_so_many_wave_instructions():
    """A long run reports (wave-instructions so far, seconds) through ``Machine.progress`` every
    ``progress_every`` wave-instructions or so (at the first step that reaches it), in order,
    and never past the run's total."""
    a = prologue(Asm())
    a.sop1("s_mov_b32", 19, LIT, lit=400)
    a.label("loop").sop2("s_sub_i32", 19, s(19), i(1))
    a.sopc("s_cmp_lg_u32", s(19), i(0)).branch("s_cbranch_scc1", "loop")
    a.endpgm()
    m = machine()
    seen: list[tuple[int, float]] = []
    m.progress, m.progress_every = (lambda n, t: seen.append((n, t))), 50
    _, stats = run(a, grid=4, block=128, m=m)
    assert len(seen) >= 5, (seen, stats.instructions)  # a gang's step may run past a mark
    counts = [n for n, _ in seen]
    assert counts == sorted(counts) and counts[-1] <= stats.instructions
    assert all(b - a >= 50 for a, b in itertools.pairwise(counts)) and counts[0] >= 50
    assert all(t >= 0 for _, t in seen)


def test_a_long_branch_jumps_to_its_static_target_and_agpr_moves_round_trip():
    # LLVM's relaxed branch (code over 128 KB: the wide kernels with mxfp8 on gfx942) and its
    # AGPR spill moves (workgroups whose register budget exceeds 256 VGPRs)
    a = prologue(Asm())
    a.sop1("s_mov_b32", 30, i(7))
    a.sop1("s_getpc_b64", 20)  # s[20:21] = the address of the next instruction
    a.sop2("s_add_u32", 20, s(20), LIT, lit=24)  # 6 words on: past the poisoned move
    a.sop2("s_addc_u32", 21, s(21), LIT, lit=0)
    a.sop1("s_setpc_b64", 0, s(20))
    a.sop1("s_mov_b32", 30, i(1))  # skipped
    a.sop1("s_mov_b32", 31, i(2))  # the target
    a.vop3p("v_accvgpr_write_b32", 5, v(1), 0, 0)  # a5 = 4 * lane
    a.vop1("v_mov_b32", 1, i(0))
    a.vop3p("v_accvgpr_read_b32", 6, v(5), 0, 0)  # v6 = a5
    a.glob("global_store_dword", addr=6, data=6, saddr=4, offset=256)
    store_sgprs(a, [30, 31])
    dk = decode_kernel(kernel_object(a))
    jump = next(x for x in dk.instructions if x.base == "s_setpc_b64")
    assert jump.fields["target"] == jump.offset + 8  # the move after the poisoned one
    out, _ = run(a)
    assert out[:8].view(np.uint32).tolist() == [7, 2]
    assert out[256 : 256 + 256].view(np.uint32).tolist() == [4 * t for t in range(64)]


def test_a_computed_jump_is_refused():
    a = prologue(Asm())
    a.sop1("s_getpc_b64", 20).sop1("s_setpc_b64", 0, s(20)).endpgm()
    with pytest.raises(EmulatorError, match="s_setpc_b64 at 0x14 is a computed jump"):
        run(a)
