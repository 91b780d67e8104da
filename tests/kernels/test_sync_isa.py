"""The sync protocol in the shipped code objects, checked where it matters, not only that the
instructions occur somewhere: ``mono_aot.emulator.syncscan`` on the decoded kernels.

Memory model: LLVM's AMDGPUUsage, section "Memory Model GFX942" (table "AMDHSA Memory Model
Code Sequences GFX942"; gfx950 uses the same sequences): an acquire at agent / system scope is
``s_waitcnt vmcnt(0)`` + ``buffer_inv sc1`` / ``buffer_inv sc0 sc1``, a release is
``buffer_wbl2 sc1`` / ``buffer_wbl2 sc0 sc1`` + ``s_waitcnt vmcnt(0)``, a relaxed atomic load is
``global_load`` with ``sc1`` (agent) or ``sc0 sc1`` (system), a system-scope atomic has ``sc1``.
The rules (which loop is a poll, which store is a peer flag, which waves need which fence) are
in ``mono_aot/emulator/syncscan.py``; the protocol is ``mono_aot/kernels/sync.py`` and
``mono_aot/kernels/allreduce.py``.

* The four shipped kernels (the session's ``shipped_compiles``) pass: every sleeping poll loop
  is followed by the acquire its scope needs before any plain load, in the polling wave and
  after the workgroup barrier in every wave; every peer flag store is preceded by every wave's
  system-scope release and its wait before the workgroup barrier.
* Textual mutations: the acquire after one poll loop, the release before one flag store, or
  that release's wait, replaced by ``s_nop`` in the code object's bytes (offsets kept); the
  check then reports exactly the loops / flag stores that relied on it, by offset.
* Source mutations: narrow for gfx942 compiled (two compiles, one arch: the sequences are the
  same on gfx950, as the shipped kernels show) with the sync helpers' acquire fences dropped,
  or the push's system-scope release fence dropped, through the build's provider mechanism
  (``tests/kernels/fixtures/sync_mutants``); each fails the check where it should, and only
  there.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from mono_aot.emulator import CodeObject, decode_kernel
from mono_aot.emulator.syncscan import Report, scan

LAYOUT = "minimax-m3.1-dspark-tp4"
CASES = [(v, a) for a in ("gfx942", "gfx950") for v in ("narrow", "wide")]
S_NOP = 0xBF800000
MUTANTS = Path(__file__).parent / "fixtures" / "sync_mutants"
KINDS = 2  # all-reduce kinds, attn and mlp: mono_aot/kernels/allreduce.py KINDS

pytestmark = pytest.mark.slow


def _tp() -> int:
    from mono_aot.spec.layouts import resolve_layout

    return resolve_layout(LAYOUT).parallel.tp


def nop_out(code_object: bytes, offsets: set[int]) -> bytes:
    """The code object with the instructions at these kernel byte offsets replaced by
    ``s_nop 0`` words (one per dword, so every other offset stays)."""
    co = CodeObject(code_object)
    [name] = co.kernel_names()
    k = co.kernel(name)
    text = co.section(".text")
    insts = {i.offset: i for i in decode_kernel(co, name).instructions}
    out = bytearray(code_object)
    for off in offsets:
        base = text.offset + (k.address - text.addr) + off
        for w in range(len(insts[off].words)):
            struct.pack_into("<I", out, base + 4 * w, S_NOP)
    return bytes(out)


def check(code_object: bytes) -> Report:
    return scan(decode_kernel(code_object))


@pytest.fixture(scope="module")
def shipped_reports(shipped_compiles) -> dict[tuple[str, str], Report]:
    return {case: check(shipped_compiles[case].code_object) for case in CASES}


@pytest.mark.parametrize(("variant", "arch"), CASES)
def test_shipped_kernels_acquire_after_every_poll_and_release_before_every_flag(
    shipped_reports, shipped_compiles, variant, arch
):
    r = shipped_reports[(variant, arch)]
    assert not r.findings, "\n".join(map(str, r.findings))
    tp = _tp()
    system = [pl for pl in r.loops if pl.scope == "system"]
    agent = [pl for pl in r.loops if pl.scope == "agent"]
    # receive waits for each of the tp ranks in turn, once per all-reduce kind; the grid
    # barrier's waits are agent scope
    assert len(system) >= KINDS * tp and len(system) % tp == 0, [hex(p.header) for p in system]
    assert agent, "no grid barrier wait found"
    assert all(pl.bounded for pl in r.loops)
    # every s_sleep of the kernel sits in one of the poll loops: no wait escapes the check
    k = decode_kernel(shipped_compiles[(variant, arch)].code_object)
    sleeps = {i.offset for i in k.instructions if i.name == "s_sleep"}
    assert sleeps == {pl.sleep for pl in r.loops}
    # every wave acquires after the barrier that follows the poll
    for pl in r.loops:
        assert any(phase == 2 for phase, _ in r.acquires[pl.header]), hex(pl.header)
    # one flag store per all-reduce kind, each after every wave's release and its wait
    assert len(r.flags) >= KINDS
    for fs in r.flags:
        names = {k.at(off).name for phase, off in r.releases[fs.offset] if phase == 2}
        assert names == {"buffer_wbl2", "s_waitcnt"}, (hex(fs.offset), names)


def _pick_loops(r: Report) -> list:
    return [next(pl for pl in r.loops if pl.scope == s) for s in ("agent", "system")]


@pytest.mark.parametrize(("variant", "arch"), CASES)
def test_removing_the_acquire_after_one_poll_loop_is_reported_for_that_loop(
    shipped_reports, shipped_compiles, variant, arch
):
    r0 = shipped_reports[(variant, arch)]
    code = shipped_compiles[(variant, arch)].code_object
    for pl in _pick_loops(r0):
        gone = {off for phase, off in r0.acquires[pl.header] if phase == 2}
        r = check(nop_out(code, gone))
        hit = {f.subject for f in r.findings}
        assert pl.header in hit, f"0x{pl.header:x}: {[str(f) for f in r.findings]}"
        assert {f.rule for f in r.findings} == {"acquire"}
        # only loops that relied on the removed instruction are reported
        relied = {h for h, used in r0.acquires.items() if any(o in gone for _, o in used)}
        assert hit <= relied, (sorted(map(hex, hit)), sorted(map(hex, relied)))
        f = r.findings_for(pl.header)[0]
        assert f"poll loop at 0x{pl.header:x} ({pl.scope} scope" in f.message
        assert ("buffer_inv sc0 sc1" if pl.scope == "system" else "buffer_inv sc1") in f.message


@pytest.mark.parametrize(("variant", "arch"), CASES)
@pytest.mark.parametrize("part", ["buffer_wbl2", "s_waitcnt"])
def test_removing_the_release_or_its_wait_before_one_flag_store_is_reported_for_that_store(
    shipped_reports, shipped_compiles, variant, arch, part
):
    r0 = shipped_reports[(variant, arch)]
    code = shipped_compiles[(variant, arch)].code_object
    k = decode_kernel(code)
    fs = r0.flags[0]
    gone = {off for phase, off in r0.releases[fs.offset] if phase == 2 and k.at(off).name == part}
    assert gone
    r = check(nop_out(code, gone))
    hit = {f.subject for f in r.findings}
    assert fs.offset in hit, [str(f) for f in r.findings]
    assert {f.rule for f in r.findings} == {"release"}
    relied = {s for s, used in r0.releases.items() if any(o in gone for _, o in used)}
    assert hit <= relied
    first = r.findings_for(fs.offset)[0]
    assert f"flag store at 0x{fs.offset:x}" in first.message
    assert "buffer_wbl2 sc0 sc1 + s_waitcnt vmcnt(0)" in first.message
    # the writes it reports are the mailbox data: 16-byte stores (allreduce.push)
    assert {k.at(f.at).name for f in r.findings_for(fs.offset)} == {"global_store_dwordx4"}


def test_the_nop_patch_keeps_every_other_instruction(shipped_compiles):
    code = shipped_compiles[("narrow", "gfx942")].code_object
    k0 = decode_kernel(code)
    r0 = check(code)
    off = next(o for p, o in r0.acquires[r0.loops[0].header] if p == 2)
    assert k0.at(off).text() == "buffer_inv sc1" and len(k0.at(off).words) == 2
    expected = []
    for i in k0.instructions:
        expected += ["s_nop 0", "s_nop 0"] if i.offset == off else [i.text()]
    assert decode_kernel(nop_out(code, {off})).text() == expected


# ------------------------------------------------------------------------------ source mutants
@pytest.fixture(scope="module")
def mutants(tmp_path_factory) -> dict[str, bytes]:
    """narrow for gfx942 compiled from the fence mutants (two compiles)."""
    from mono_aot.compiler.compile import compile_kernel
    from mono_aot.compiler.inputs import directory_provider
    from mono_aot.spec.layouts import resolve_layout

    lay = resolve_layout(LAYOUT)
    root = tmp_path_factory.mktemp("sync-mutants")

    def one(module: str) -> tuple[str, bytes]:
        prov = directory_provider(MUTANTS, module)
        return module, compile_kernel(prov, "narrow", lay, "gfx942", root / module).code_object

    # one after the other: building two providers' keys in threads at once trips CPython 3.11's
    # "AST constructor recursion depth mismatch" (the source digests parse in each thread)
    return dict(map(one, ["no_acquire_kernels", "no_release_kernels"]))


def test_a_kernel_compiled_without_the_acquire_fences_fails_at_every_poll_loop(mutants):
    r = check(mutants["no_acquire_kernels"])
    assert r.loops and r.flags
    assert {f.rule for f in r.findings} == {"acquire"}
    assert {f.subject for f in r.findings} == {pl.header for pl in r.loops}
    # the releases are untouched: every flag store still relies on every wave's release
    for fs in r.flags:
        assert 2 in {phase for phase, _ in r.releases[fs.offset]}


def test_a_kernel_compiled_without_the_push_release_fence_fails_at_every_flag_store(mutants):
    r = check(mutants["no_release_kernels"])
    assert r.loops and r.flags
    assert {f.rule for f in r.findings} == {"release"}
    assert {f.subject for f in r.findings} == {fs.offset for fs in r.flags}
    # the flag's own release ordering is still there, executed by the flag's wave after the
    # barrier: it does not publish the other waves' mailbox stores
    for fs in r.flags:
        assert {phase for phase, _ in r.releases[fs.offset]} == {1}
