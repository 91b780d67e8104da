"""Fused runs of plain VALU instructions (``mono_aot/emulator/fuse.py``) compute exactly what
stepping them one by one computes: on a hand-assembled program whose packed-f32 instructions
depend on each other and on the instructions between them in every way the planner must
respect (read after write, write after write, write after read, another operation, partial
EXEC, a branch into the middle of a run), and on the small layout's real narrow kernel."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from mono_aot.emulator.machine import EmulatorError, Machine
from mono_aot.emulator.wave import LANES
from mono_aot.spec.layouts import resolve_layout
from tests.emulator.asm import EXEC, LIT, Asm, i, kernel_object, v
from tests.emulator.conftest import stored_kernels
from tests.emulator.emu import OUT, buffer, kernargs, prologue

NREGS = 24  # v8..v31 are stored
THREADS = 128


def fused_program() -> Asm:
    a = prologue(Asm())
    a.vop1("v_cvt_f32_u32", 2, v(0))  # x = lane id
    # sixteen distinct float registers v8..v23 from x, in (0.2, 0.9): the loop stays finite
    for r in range(8, 24):
        a.vop2("v_mul_f32", r, LIT, v(2), lit=int(np.float32(0.0013 + 0.0001 * r).view(np.uint32)))
        a.vop2("v_add_f32", r, LIT, v(r), lit=int(np.float32(0.03 * r - 0.04).view(np.uint32)))
    a.vop1("v_mov_b32", 24, i(0)).vop1("v_mov_b32", 25, i(0))
    a.label("run")
    # one batch of independent accumulators, op_sel variants
    a.vop3p("v_pk_fma_f32", 8, v(10), v(12), v(8))
    a.vop3p("v_pk_fma_f32", 14, v(16), v(12), v(14), opsel=0b001)
    a.vop3p("v_pk_fma_f32", 18, v(20), v(12), v(18), opsel_hi=0b110)
    a.vop2("v_add_f32", 12, v(22), v(23))  # writes a row the batch reads (only WAR)
    a.vop3p("v_pk_fma_f32", 22, v(24), v(26), v(22))
    a.vop3p("v_pk_fma_f32", 28, v(22), v(26), v(28))  # reads the pending destination (RAW)
    a.vop3p("v_pk_fma_f32", 28, v(10), v(16), v(28))  # and again (RAW and WAW)
    a.vop3p("v_pk_mul_f32", 10, v(14), v(18))  # another operation (reads nothing pending)
    a.vop2("v_add_f32", 20, v(11), v(30))  # reads the pending destination (only RAW)
    a.vop3p("v_pk_fma_f32", 16, v(18), v(12), v(26))
    a.vop1("v_mov_b32", 17, v(8))  # writes a row the batch writes (only WAW)
    a.vop3p("v_pk_add_f32", 24, v(24), v(8))
    a.vop3p("v_pk_add_f32", 26, v(22), v(16))
    a.vop3p("v_pk_fma_f32", 30, v(12), v(14), v(24))
    # a second pass with half the lanes, then again with all of them from the middle of the run
    a.sop1("s_mov_b32", EXEC, LIT, lit=0x5A5A5A5A)
    a.vop2("v_add_u32", 5, i(1), v(5))
    a.vopc("v_cmp_gt_u32", i(2), v(5))
    a.branch("s_cbranch_vccnz", "run")
    a.sop1("s_mov_b64", EXEC, i(-1))
    a.vopc("v_cmp_gt_u32", i(3), v(5))
    a.vop2("v_add_u32", 5, i(1), v(5))
    a.branch("s_cbranch_vccz", "done")
    a.vop3p("v_pk_fma_f32", 8, v(10), v(12), v(8))
    a.vop3p("v_pk_fma_f32", 14, v(16), v(12), v(14))
    a.branch("s_branch", "run")
    a.label("done")
    for k in range(NREGS):  # row k of the output: register v(8 + k) of every thread
        a.glob("global_store_dword", addr=1, data=8 + k, saddr=4)
        a.sop2("s_add_u32", 4, 4, LIT, lit=4 * THREADS).sop2("s_addc_u32", 5, 5, i(0))
    return a.endpgm()


def _run(fused: bool) -> tuple[np.ndarray, Machine, object]:
    m = Machine("gfx942", 1)
    out = buffer(m, OUT, 4 * THREADS * NREGS)
    k = m.load(kernel_object(fused_program()))
    if not fused:
        k.program.blocks = [None] * len(k.program.blocks)
    m.launch(0, k, 2, THREADS, kernargs(OUT))  # 2 workgroups of 2 waves (same output)
    st = m.run()
    return out, m, (k, st)


def test_fused_runs_compute_what_single_steps_compute():
    got, _, (k, st) = _run(True)
    want, _, (_, st0) = _run(False)
    blocks = [b for b in k.program.blocks if b is not None]
    assert blocks, "the planner found no run to fuse in a program made of them"
    assert st.instructions == st0.instructions
    assert got.tobytes() == want.tobytes()
    f = got.view(np.float32).reshape(NREGS, THREADS)
    # not a degenerate program: mostly finite, distinct values (the lanes the masked passes
    # repeat grow fastest)
    assert np.isfinite(f).mean() > 0.5 and len(np.unique(f)) > 10 * THREADS


def test_fused_block_keeps_clocks_and_counts():
    """The same virtual time and instruction counts (blocks charge every instruction)."""
    _, _, (_, st) = _run(True)
    _, _, (_, st0) = _run(False)
    assert st.virtual_seconds == st0.virtual_seconds
    assert [ls.instructions for ls in st.launches] == [ls.instructions for ls in st0.launches]


def test_a_load_in_flight_stops_the_block_and_the_hazard_is_named():
    """A load whose destination the run reads: the scheduler steps one by one and the hazard
    names the instruction, as without fusion."""
    a = prologue(Asm())
    a.glob("global_load_dwordx2", addr=1, vdst=12, saddr=4)
    a.vop3p("v_pk_fma_f32", 8, v(10), v(14), v(8))
    a.vop3p("v_pk_fma_f32", 16, v(10), v(12), v(16))  # reads v[12:13] before the wait
    a.endpgm()
    m = Machine("gfx942", 1)
    buffer(m, OUT, 4096)
    k = m.load(kernel_object(a))
    assert any(b is not None for b in k.program.blocks)
    m.launch(0, k, 1, LANES, kernargs(OUT))
    with pytest.raises(EmulatorError, match=r"v_pk_fma_f32 v\[16:17\].*read of v12 before"):
        m.run()


# ------------------------------------------------------------------------------ real kernel
LAYOUT = "emulator-tiny-tp4"
QPR = resolve_layout(LAYOUT).serving.qpr  # one request: n = QPR (any other n fails at entry)


@pytest.fixture(scope="module")
def tiny_narrow(tmp_path_factory: pytest.TempPathFactory):
    hit = stored_kernels(tmp_path_factory, LAYOUT, "gfx942", ("narrow",))[1]["narrow"]
    return hit.entry, hit.data


# the arguments that hold activations and weights (random floats); the rest start zero
FLOATS = {"x", "qkv_w", "qkv_s", "o_w", "o_s", "gu_w", "gu_s", "d_w", "d_s", "final_norm",
          "cos_sin"}  # fmt: skip


def _narrow_state(entry, blob, fused: bool, limit: int) -> tuple[bytes, list]:
    """Launch the narrow kernel on 4 devices with random weights and activations in mapped
    buffers (the pointer table filled as ``mono_aot/runtime/runner.py`` fills it), run ``limit``
    wave-instructions, and return every buffer's bytes and every wave's state."""
    from mono_aot.spec import abi

    # one wave at a time: fusion's own check (gangs run blocks once for several waves, and
    # tests/emulator/test_gang.py checks them block by block)
    m = Machine("gfx942", devices=4, seed=1, gangs=False)
    k = m.load(blob, entry.symbol)
    ran = [0]
    if not fused:
        k.program.blocks = [None] * len(k.program.blocks)
    for b in k.program.blocks:
        if b is not None:
            b.run = _counted(b.run, ran)
    rng = np.random.default_rng(5)
    bufs: list[np.ndarray] = []
    base = 0x5000_0000_0000

    def new(n: int, name: str, dev: int, floats: bool = False) -> int:
        nonlocal base
        b = np.zeros(n, np.uint8)
        if floats:
            b[:] = rng.standard_normal(n // 4).astype(np.float32).view(np.uint8)
        m.memory.map(base, b, name, dev)
        bufs.append(b)
        base += 1 << 24
        return base - (1 << 24)

    peers = [new(1 << 20, f"peer {r}", r) for r in range(4)]
    off = {s.name: s.offset for s in entry.kernargs}
    for r in range(4):
        args = bytearray(entry.kernarg_segment_size)
        for s in entry.kernargs:
            if s.size != 8:
                continue
            if s.name == "peer_local":
                ptr = peers[r]
            elif s.name.startswith("pe") and s.name[2:].isdigit():
                ptr = peers[int(s.name[2:])]
            else:
                ptr = new(1 << 22, f"{s.name} {r}", r, floats=s.name in FLOATS)
            struct.pack_into("<Q", args, s.offset, ptr)
        tab = m.memory.find(struct.unpack_from("<Q", args, off["tab"])[0], 8)[0].buf
        t = tab[: 2 * abi.TABLE_SLOTS * 8].view(np.int64)
        for layer in range(2):
            for slot in range(abi.T_CACHE + 1):
                t[layer * abi.TABLE_SLOTS + slot] = new(1 << 20, f"tab {slot}", r,
                                                        floats=slot != abi.T_CACHE)  # fmt: skip
            t[layer * abi.TABLE_SLOTS + abi.T_NBLK] = 8
        seq = m.memory.find(struct.unpack_from("<Q", args, off["seq_lens"])[0], 4)[0].buf
        seq[:64].view(np.int32)[:] = 8
        pos = m.memory.find(struct.unpack_from("<Q", args, off["pos"])[0], 4)[0].buf
        pos[:256].view(np.int32)[:] = np.arange(64) % 8
        bt = m.memory.find(struct.unpack_from("<Q", args, off["bt"])[0], 4)[0].buf
        bt[:] = 0
        struct.pack_into("<III", args, off["rank"], r, 4, QPR)  # rank, bt_stride, n
        m.launch(r, k, entry.launch.grid, entry.launch.block, bytes(args))
    launches = [ln for q in m.queues for ln in q]
    with pytest.raises(EmulatorError, match="instruction limit"):
        m.run(max_instructions=limit)
    waves = []
    for ln in launches:
        for wg in ln.workgroups:
            waves.append(wg.lds.tobytes())
            for w in wg.waves:
                waves.append((w.v.tobytes(), list(w.s), w.scc, w.pc, w.time, w.icount,
                              sorted(w.mc.pend_v), sorted(w.mc.pend_s)))  # fmt: skip
    return b"".join(b.tobytes() for b in bufs), waves, ran[0]


def _counted(run, ran: list[int]):
    def counted(w):
        ran[0] += 1
        return run(w)

    return counted


@pytest.mark.slow
def test_real_narrow_kernel_same_state_fused_and_stepped(tiny_narrow):
    """The first 700k wave-instructions (prologue, norms, the qkv GEMV's packed FMAs) of the
    small layout's narrow kernel on 4 devices leave identical memory and wave state."""
    entry, blob = tiny_narrow
    assert ("rank", "bt_stride", "n") == tuple(s.name for s in entry.kernargs[-3:])
    mem, waves, blocks = _narrow_state(entry, blob, True, 700_000)
    mem0, waves0, none = _narrow_state(entry, blob, False, 700_000)
    assert blocks > 1_000 and none == 0  # the fused run did fuse
    assert mem == mem0
    assert waves == waves0


def test_an_operation_failing_inside_a_block_is_named():
    """A lane operation that raises in the middle of a fused block: the error names that
    instruction (not the block's first)."""

    def broken(ctx, a, b):
        raise ValueError("broken on purpose")

    a = prologue(Asm())
    a.vop3p("v_pk_fma_f32", 8, v(10), v(12), v(8))
    a.vop3p("v_pk_fma_f32", 14, v(16), v(12), v(14))
    a.vop2("v_add_f32", 20, v(21), v(22))
    a.vop3p("v_pk_fma_f32", 24, v(10), v(12), v(24))
    a.endpgm()
    m = Machine("gfx942", 1)
    m.ops = {**m.ops, "v_add_f32": broken}
    buffer(m, OUT, 4096)
    k = m.load(kernel_object(a))
    assert any(b is not None for b in k.program.blocks)
    m.launch(0, k, 1, LANES, kernargs(OUT))
    with pytest.raises(EmulatorError, match=r"\(v_add_f32_e32 v20, v21, v22\): ValueError"):
        m.run()
