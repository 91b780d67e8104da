"""The flow graph (``mono_aot.emulator.flow``) and the sync checks (``mono_aot.emulator.syncscan``)
on small kernels assembled by hand (``tests/emulator/flow_asm.py``). Fast: no compile. The shipped
kernels and their mutants are checked in ``tests/kernels/test_sync_isa.py``."""

from __future__ import annotations

import pytest

from mono_aot.emulator.decode import decode_kernel
from mono_aot.emulator.flow import FlowError, build, reads, writes
from mono_aot.emulator.syncscan import scan
from tests.emulator.elfbuild import code_object, words
from tests.emulator.flow_asm import Asm


def test_the_hand_encodings_decode_as_llvm_prints_them():
    a = (
        Asm()
        .label("top")
        .memrealtime(10)
        .sopp("s_sleep", 1)
        .flat("global_load_dword", addr=2, vdst=1, sc0=True, sc1=True)
        .flat("global_store_dword", addr=2, data=5)
        .flat("global_atomic_swap", addr=2, data=4, sc1=True)
        .cache("buffer_wbl2", sc0=True, sc1=True)
        .cache("buffer_inv", sc1=True)
        .waitcnt_vm0()
        .readfirstlane(4, 1)
        .sopc("s_cmp_eq_u32", 4, 5)
        .sop2("s_sub_u32", 14, 12, 10)
        .sop2("s_cselect_b32", 7, 1, 0, consts=True)
        .sop2("s_and_b32", 9, 7, 8)
        .s_load_dword(3, 0)
        .sopp("s_barrier")
        .branch("s_cbranch_scc1", "top")
        .sopp("s_endpgm")
    )
    assert a.kernel().text() == [
        "s_memrealtime s[10:11]",
        "s_sleep 1",
        "global_load_dword v1, v[2:3], off sc0 sc1",
        "global_store_dword v[2:3], v5, off",
        "global_atomic_swap v[2:3], v4, off sc1",
        "buffer_wbl2 sc0 sc1",
        "buffer_inv sc1",
        "s_waitcnt vmcnt(0)",
        "v_readfirstlane_b32 s4, v1",
        "s_cmp_eq_u32 s4, s5",
        "s_sub_u32 s14, s12, s10",
        "s_cselect_b32 s7, 1, 0",
        "s_and_b32 s9, s7, s8",
        "s_load_dword s3, s[0:1], 0x0",
        "s_barrier",
        "s_cbranch_scc1 0x0",
        "s_endpgm",
    ]


def _two_loops() -> Asm:
    """entry; outer: inner: ... cbranch inner; cbranch outer; endpgm"""
    return (
        Asm()
        .sopp("s_nop")  # 0x0 entry
        .label("outer")
        .sopp("s_nop")  # 0x4
        .label("inner")
        .sopp("s_nop")  # 0x8
        .branch("s_cbranch_scc1", "inner")  # 0xc
        .branch("s_cbranch_vccnz", "outer")  # 0x10
        .branch("s_branch", "end")  # 0x14
        .sopp("s_nop")  # 0x18: unreachable
        .label("end")
        .sopp("s_endpgm")  # 0x1c
    )


def test_blocks_successors_and_natural_loops():
    g = build(_two_loops().kernel())
    starts = [b.start for b in g.blocks]
    assert starts == [0x0, 0x4, 0x8, 0x10, 0x14, 0x18, 0x1C]
    by = {b.start: b for b in g.blocks}

    def succ(off):
        return sorted(g.blocks[s].start for s in by[off].succs)

    assert succ(0x0) == [0x4]  # falls through into the next leader
    assert succ(0x8) == [0x8, 0x10]  # taken and fall-through
    assert succ(0x10) == [0x4, 0x14]
    assert succ(0x14) == [0x1C]  # s_branch: no fall-through
    assert succ(0x1C) == []  # s_endpgm
    assert g.idom()[by[0x18].index] == -1  # unreachable
    inner, outer = g.loops()  # innermost first
    assert [g.blocks[b].start for b in sorted(inner.blocks)] == [0x8]
    assert [g.blocks[b].start for b in sorted(outer.blocks)] == [0x4, 0x8, 0x10]
    assert [(g.blocks[a].start, g.blocks[b].start) for a, b in outer.exits] == [(0x10, 0x14)]
    assert g.innermost_loop(g.index_of(0xC)) == inner
    assert g.innermost_loop(g.index_of(0x4)) == outer
    assert g.innermost_loop(g.index_of(0x14)) is None
    assert g.dominates(by[0x4].index, by[0x10].index)
    assert not g.dominates(by[0x10].index, by[0x8].index)


def test_irreducible_control_flow_is_refused():
    a = (
        Asm()
        .branch("s_cbranch_scc0", "b")  # entry -> a (fall through) or b
        .label("a")
        .sopp("s_nop")
        .label("b")
        .branch("s_cbranch_scc1", "a")  # b -> a: a cycle entered at a and at b
        .sopp("s_endpgm")
    )
    with pytest.raises(FlowError, match=r"irreducible control flow: the edge 0x8 -> 0x4"):
        build(a.kernel()).loops()


def test_bad_targets_and_running_off_the_end_are_errors():
    from mono_aot.emulator.decode import decode_kernel

    # a branch into the second dword of a 64-bit instruction
    a = Asm().branch("s_branch", "x").memrealtime(4).sopp("s_endpgm")
    a.labels["x"] = 8
    with pytest.raises(FlowError, match=r"offset 0x0: s_branch targets 0x8, which is not"):
        build(a.kernel())
    k = decode_kernel(code_object(words(0xBF800000)))  # s_nop and nothing after it
    with pytest.raises(FlowError, match=r"offset 0x0: s_nop runs off the end"):
        build(k)


def test_register_reads_and_writes():
    a = Asm().sopc("s_cmp_eq_u32", 4, 5).sop2("s_cselect_b32", 7, 1, 0, consts=True)
    a.branch("s_cbranch_vccnz", "x").label("x").flat("global_load_dword", addr=2, vdst=6)
    a.sopp("s_endpgm")
    cmp, csel, br, load, _ = a.kernel().instructions
    assert writes(cmp) == {"scc"} and reads(cmp) == {"s4", "s5"}
    assert writes(csel) == {"s7"} and reads(csel) == {"scc"}
    assert reads(br) == {"vcc_lo", "vcc_hi"} and writes(br) == set()
    assert writes(load) == {"v6"} and reads(load) == {"v2", "v3"}


def _poll(a: Asm, *, sc0: bool = False, sc1: bool = True, bounded: bool = True) -> Asm:
    """One thread's bounded poll of the word at v[2:3] (into v1) until it equals s5."""
    a.memrealtime(10).label("poll").sopp("s_sleep", 1)
    a.flat("global_load_dword", addr=2, vdst=1, sc0=sc0, sc1=sc1).memrealtime(12)
    a.waitcnt_vm0().readfirstlane(4, 1)
    a.sopc("s_cmp_eq_u32", 4, 5).sop2("s_cselect_b32", 7, 1, 0, consts=True)
    if bounded:
        a.sop2("s_sub_u32", 14, 12, 10).sopc("s_cmp_lt_u32", 14, 15)
        a.sop2("s_cselect_b32", 8, 1, 0, consts=True)
    a.sop2("s_and_b32", 9, 7, 8)
    return a.branch("s_cbranch_scc1", "poll")


def _after(a: Asm, *, inv1: dict | None, barrier: bool, inv2: dict | None) -> Asm:
    """What follows the poll: an acquire, the workgroup barrier, every wave's acquire, then a
    plain load of the guarded data."""
    if inv1 is not None:
        a.cache("buffer_inv", **inv1)
    if barrier:
        a.sopp("s_barrier")
    if inv2 is not None:
        a.cache("buffer_inv", **inv2)
    a.label("use").flat("global_load_dword", addr=6, vdst=7)
    return a.sopp("s_endpgm")


AGENT = {"sc1": True}
SYSTEM = {"sc0": True, "sc1": True}


def test_a_poll_loop_with_both_acquires_passes():
    a = _after(_poll(Asm()), inv1=AGENT, barrier=True, inv2=AGENT)
    r = scan(a.kernel())
    [pl] = r.loops
    assert (pl.header, pl.sleep, pl.scope, pl.bounded) == (0x8, 0x8, "agent", True)
    assert pl.loads == (0xC,)
    assert r.findings == []
    used = sorted(r.acquires[pl.header])
    assert [p for p, _ in used] == [1, 2]


@pytest.mark.parametrize(
    ("inv1", "barrier", "inv2", "where"),
    [
        (AGENT, True, None, "after the workgroup barrier at 0x"),  # the other waves' acquire
        (None, False, None, "on the polling wave's path"),
        (None, True, None, "after the workgroup barrier at 0x"),
    ],
)
def test_a_missing_acquire_is_reported_with_the_loop_and_the_load(inv1, barrier, inv2, where):
    a = _after(_poll(Asm()), inv1=inv1, barrier=barrier, inv2=inv2)
    r = scan(a.kernel())
    [f] = r.findings
    assert (f.rule, f.subject, f.at) == ("acquire", 0x8, a.labels["use"])
    assert "poll loop at 0x8 (agent scope" in f.message and where in f.message
    assert "buffer_inv sc1" in f.message


def test_a_system_poll_needs_a_system_acquire():
    a = _after(_poll(Asm(), sc0=True), inv1=SYSTEM, barrier=True, inv2=AGENT)
    r = scan(a.kernel())
    assert r.loops[0].scope == "system"
    [f] = r.findings
    assert (f.rule, f.at) == ("acquire", a.labels["use"]) and "buffer_inv sc0 sc1" in f.message
    ok = _after(_poll(Asm(), sc0=True), inv1=None, barrier=True, inv2=SYSTEM)
    assert scan(ok.kernel()).findings == []


def test_a_scalar_load_after_a_poll_is_reported_even_after_the_acquire():
    a = _poll(Asm()).cache("buffer_inv", sc1=True).s_load_dword(20, 0).sopp("s_endpgm")
    [f] = scan(a.kernel()).findings
    assert f.rule == "acquire" and "scalar load" in f.message


def test_polls_that_are_not_coherent_or_not_bounded_are_reported():
    a = _after(_poll(Asm(), sc1=False), inv1=AGENT, barrier=True, inv2=AGENT)
    [f] = scan(a.kernel()).findings
    assert (f.rule, f.at) == ("poll", 0xC) and "not coherent at agent scope" in f.message
    b = _after(_poll(Asm(), bounded=False), inv1=AGENT, barrier=True, inv2=AGENT)
    r = scan(b.kernel())
    [f] = r.findings
    assert f.rule == "poll" and "unbounded" in f.message and not r.loops[0].bounded


def test_a_sleeping_loop_whose_exit_reads_no_memory_is_not_a_poll():
    a = Asm().memrealtime(10).label("l").sopp("s_sleep", 1).memrealtime(12)
    a.sop2("s_sub_u32", 14, 12, 10).sopc("s_cmp_lt_u32", 14, 15)
    a.flat("global_load_dword", addr=2, vdst=1)  # in the loop, but the exit ignores it
    a.branch("s_cbranch_scc1", "l").sopp("s_endpgm")
    assert scan(a.kernel()).loops == []


def _push(*, release1: dict | None, wait1: bool, release2: dict | None, wait2: bool,
          flag: str = "atomic") -> Asm:  # fmt: skip
    """Data store; (release + wait); barrier; (release + wait); flag store."""
    a = Asm().label("data").flat("global_store_dword", addr=2, data=5)
    if release1 is not None:
        a.cache("buffer_wbl2", **release1)
    if wait1:
        a.waitcnt_vm0()
    a.sopp("s_barrier")
    if release2 is not None:
        a.cache("buffer_wbl2", **release2)
    if wait2:
        a.waitcnt_vm0()
    a.label("flag")
    if flag == "atomic":
        a.flat("global_atomic_swap", addr=8, data=4, sc1=True)
    else:
        a.flat("global_store_dword", addr=8, data=4, sc0=True, sc1=True)
    return a.sopp("s_endpgm")


@pytest.mark.parametrize("flag", ["atomic", "store"])
def test_a_flag_store_after_every_waves_release_passes(flag):
    a = _push(release1=SYSTEM, wait1=True, release2=None, wait2=False, flag=flag)
    r = scan(a.kernel())
    assert [f.offset for f in r.flags] == [a.labels["flag"]]
    assert r.findings == []
    assert {p for p, _ in r.releases[a.labels["flag"]]} == {2}


@pytest.mark.parametrize(
    ("release1", "wait1", "release2", "wait2"),
    [
        (None, False, SYSTEM, True),  # only the flag's wave releases, after the barrier
        (AGENT, True, SYSTEM, True),  # an agent-scope write-back does not reach a peer
        (SYSTEM, False, SYSTEM, True),  # the write-back is not waited for before the barrier
        (None, True, None, True),  # waits, but nothing is written back
    ],
)
def test_a_missing_system_release_is_reported_with_the_flag_and_the_write(
    release1, wait1, release2, wait2
):
    a = _push(release1=release1, wait1=wait1, release2=release2, wait2=wait2)
    r = scan(a.kernel())
    [f] = r.findings
    assert (f.rule, f.subject, f.at) == ("release", a.labels["flag"], a.labels["data"])
    assert "before the workgroup barrier" in f.message
    assert "buffer_wbl2 sc0 sc1 + s_waitcnt vmcnt(0)" in f.message


def test_agent_scope_writes_are_not_peer_flags():
    a = Asm().flat("global_store_dword", addr=2, data=5, sc1=True)  # agent store
    a.flat("global_atomic_swap", addr=2, data=5).sopp("s_endpgm")  # agent atomic
    assert scan(a.kernel()).flags == []


@pytest.mark.parametrize("released", [True, False])
def test_a_flag_publishes_its_own_barrier_interval_only(released):
    """Writes before the barrier that precedes the flag's interval are not the flag's data."""
    a = Asm().flat("global_store_dword", addr=2, data=9).sopp("s_barrier")  # an earlier phase
    a.label("data").flat("global_store_dword", addr=2, data=5)
    if released:
        a.cache("buffer_wbl2", sc0=True, sc1=True).waitcnt_vm0()
    a.sopp("s_barrier").flat("global_atomic_swap", addr=8, data=4, sc1=True).sopp("s_endpgm")
    r = scan(a.kernel())
    assert [f.at for f in r.findings] == ([] if released else [a.labels["data"]])


def test_a_long_branch_is_an_unconditional_edge_to_its_target():
    # s_getpc_b64 s[20:21]; s_add_u32 s20, s20, 20; s_addc_u32 s21, s21, 0;
    # s_setpc_b64 s[20:21]; s_nop 0 (skipped); s_endpgm (the target: 0x4 + 20)
    code = words(0xBE941C00, 0x8014FF14, 20, 0x82158015, 0xBE801D14, 0xBF800000, 0xBF810000)
    g = build(decode_kernel(code_object(code)))
    by = {b.start: b for b in g.blocks}
    assert sorted(by) == [0x0, 0x14, 0x18]
    assert [g.blocks[s].start for s in by[0x0].succs] == [0x18]  # no fall-through
    assert g.idom()[by[0x14].index] == -1  # the skipped instruction is unreachable
