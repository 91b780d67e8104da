"""``mono-aot emulate`` end to end: the small layout's stored code objects on 4 emulated ranks,
bound by the runtime's own runner, judged by the selftest's verdicts against the float64
reference (``mono_aot/selftest/emulated.py``); and the wrong-index provider's build of the same
kernels (``tests/emulator/wrong_index.py``) fails the same check.

Slow: a narrow step is about 20 million wave-instructions, a wide step of 2 requests about 7
million. CI takes a sample of the whole matrix (``make test-emulator`` runs every check on both
archs): the narrow step, the multi-launch check's cheapest step (wide 5 + wide 2, both judged
against the reference) and the dead-rank check (its next step is the wide step of 2 requests,
judged too), each on both archs: every check kind and both variants on both archs. The module
starts the emulations its selected tests judge, two at a time (one per core), as soon as its
first test runs; each test then waits for its own (``-k`` selects fewer).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from mono_aot.selftest.cases import TOLERANCE
from mono_aot.spec import abi
from tests.conftest import TINY_LAYOUT, sigint_to_threads, threads_of
from tests.emulator.conftest import Result, emulate_env, stored_kernels
from tests.emulator.wrong_index import PROVIDER_DIR, PROVIDER_MODULE

# a test may wait for the emulations queued before its own (the module's whole run, at most)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
PROVIDER = f"{PROVIDER_DIR}:{PROVIDER_MODULE}"
PARALLEL = 2  # emulations at once: CI's cores


@dataclass(frozen=True)
class Emulation:
    arch: str
    args: tuple[str, ...]
    wrong_index: bool = False  # the wrong-index provider's kernels in place of the real ones


# every emulate run a test below judges, the longest first (they share PARALLEL workers)
EMULATIONS = {
    # wide 5 + wide 2: the cheapest step of several launches on the small layout
    "multi-launch-gfx950": Emulation("gfx950", ("--check", "multi-launch", "--requests", "7")),
    "multi-launch-gfx942": Emulation("gfx942", ("--check", "multi-launch", "--requests", "7")),
    "dead-rank-gfx942": Emulation("gfx942", ("--check", "dead-rank")),
    "dead-rank-gfx950": Emulation("gfx950", ("--check", "dead-rank")),
    "narrow-gfx950": Emulation("gfx950", ("--check", "narrow")),
    "narrow-gfx942": Emulation("gfx942", ("--check", "narrow")),
    "wrong-index-gfx942": Emulation("gfx942", ("--check", "narrow"), wrong_index=True),
    # contexts 255 and 256: the chunk is full, so only peaked attention shows the shifted rows
    "wrong-index-wide-gfx942": Emulation(
        "gfx942", ("--check", "wide", "--requests", "2"), wrong_index=True
    ),
}


def emulate(tmp_path: Path, stores: list[Path], arch: str, *args: str) -> Result:
    p = subprocess.run(
        [sys.executable, "-m", "mono_aot", "emulate", "--json", "--arch", arch, *args],
        capture_output=True, text=True, timeout=3600, env=emulate_env(tmp_path, stores),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return Result.of(p.returncode, p.stdout, p.stderr)


@pytest.fixture(scope="module")
def tiny_stores(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The stores holding the small layout's real kernels for both archs (one, the test store,
    when ``MONO_AOT_TEST_STORE`` is set; one per arch otherwise)."""
    roots = [stored_kernels(tmp_path_factory, TINY_LAYOUT, a)[0] for a in ("gfx942", "gfx950")]
    return list(dict.fromkeys(roots))


@pytest.fixture(scope="module")
def emulations(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_stores: list[Path],
) -> Iterator[dict[str, Future[Result]]]:
    """The emulations the selected tests of this module judge, started at once."""
    wanted = {
        item.callspec.params["emulation"]
        for item in request.session.items
        if item.module is request.module
        and "emulation" in getattr(getattr(item, "callspec", None), "params", {})
    }
    wrong = None
    if any(EMULATIONS[n].wrong_index for n in wanted):
        wrong = request.getfixturevalue("wrong_index_build").store  # conftest.py, once a session
    pool = ThreadPoolExecutor(PARALLEL, thread_name_prefix="emulate")
    futures = {}
    for name, e in EMULATIONS.items():
        if name in wanted:
            stores = tiny_stores + ([wrong] if e.wrong_index else [])
            args = (*e.args, "--provider", PROVIDER) if e.wrong_index else e.args
            tmp = tmp_path_factory.mktemp(name)
            futures[name] = pool.submit(emulate, tmp, stores, e.arch, *args)  # type: ignore[arg-type]
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("emulation", ["narrow-gfx942", "narrow-gfx950"])
def test_the_narrow_step_passes_against_the_reference(emulations, emulation):
    """The narrow kernel's one-request step (its VALU GEMV, the attention, the all-reduces)."""
    r = emulations[emulation].result()
    assert r.code == 0 and r.doc["ok"], r.why()
    case = r.only_case("narrow")
    assert case["launches"] == "narrow 1"
    assert case["max_rel_error"] <= TOLERANCE and case["kv_bad_bytes"] == 0
    assert case["health"] == ["ok"] * 4
    assert r.doc["instructions"] > 1_000_000  # the whole step ran, on every rank
    # one launch a rank, run side by side: its time and the process's peak memory reported
    assert r.doc["launches"] == 1 and r.doc["longest_launch_seconds"] > 0
    assert 1e8 < r.doc["peak_memory_bytes"] < 2e10


@pytest.mark.parametrize("emulation", ["multi-launch-gfx950", "multi-launch-gfx942"])
def test_a_step_of_several_launches_passes(emulations, emulation):
    """Two launches in one step on one stream: the second's inputs start at request 5, its
    all-reduce tags follow the first's, the caches hold both launches' rows."""
    r = emulations[emulation].result()
    assert r.code == 0, r.why()
    case = r.only_case("multi-launch")
    assert case["ok"] and case["launches"] == "wide 5 + wide 2" and case["requests"] == 7
    # the wide kernel at 40 tokens (3 token tiles, the last partial) and at 16 (one tile)
    assert case["max_rel_error"] <= TOLERANCE and case["kv_bad_bytes"] == 0
    assert case["health"] == ["ok"] * 4


@pytest.mark.parametrize("emulation", ["dead-rank-gfx942", "dead-rank-gfx950"])
def test_a_dead_rank_is_named_within_the_wait_bound_and_the_next_step_passes(emulations, emulation):
    """Rank 3 never launches: ranks 0-2 record a peer timeout naming rank 3 in layer 0's
    attention all-reduce after the short-wait kernels' bound (the small layout's own 0.5 ms of
    emulated time) and before one more launch's worth; the next step passes on all four."""
    r = emulations[emulation].result()
    assert r.code == 0, r.why()
    case = r.only_case("dead-rank")
    assert case["ok"] and case["problems"] == []
    assert len(case["dead_health"]) == 3
    for h in case["dead_health"]:
        assert h.startswith(abi.STATUS_NAMES[abi.STATUS_PEER_TIMEOUT]), h
        assert "(layer 0, " in h and ", rank 3, step " in h
    assert all(0.0005 <= s <= 0.0015 for s in case["dead_seconds"]), case["dead_seconds"]
    # the next step: the wide kernel's 2 requests on every rank, against the reference
    assert case["launches"] == "wide 2" and case["kv_bad_bytes"] == 0
    assert case["max_rel_error"] <= TOLERANCE and case["health"] == ["ok"] * 4


@pytest.mark.parametrize("emulation", ["wrong-index-gfx942", "wrong-index-wide-gfx942"])
def test_the_wrong_index_kernels_fail_the_same_check(emulations, emulation):
    # narrow: a short context (23 positions); wide: 255 and 256 positions, which passed under
    # near-uniform attention before the problems' attention was made peaked (README, Emulator)
    r = emulations[emulation].result()
    assert r.code == 1, r.why()
    (check,) = r.doc["checks"]
    assert not check["ok"]
    (case,) = check["cases"]
    assert case["max_rel_error"] > TOLERANCE  # the output is judged, not only the cache
    assert case["health"] == ["ok"] * 4  # nothing faulted: only the index is wrong


def test_a_provider_without_a_build_is_refused(tmp_path, tiny_stores):
    r = emulate(tmp_path, tiny_stores, "gfx942", "--check", "narrow", "--provider", PROVIDER)
    assert r.code == 2 and not r.doc
    assert f"--provider {PROVIDER}: no narrow kernel of this provider" in r.err


def test_ctrl_c_stops_an_emulation_whichever_thread_gets_it(tmp_path, tiny_stores):
    """The ranks run in threads of their own: a Ctrl-C the kernel hands one of them still stops
    ``mono-aot emulate`` (exit 130) long before the check's minutes of emulation are over (the
    main thread used to wait for the ranks without waking, and exited only after them)."""
    import time

    env = emulate_env(tmp_path, tiny_stores)
    log = tmp_path / "stderr"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mono_aot", "emulate", "--arch", "gfx942", "--check",
             "multi-launch"],
            stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        try:
            for _ in range(1200):
                if "check multi-launch" in log.read_text() or proc.poll() is not None:
                    break
                time.sleep(0.1)
            before = threads_of(proc.pid)  # torch's; each step starts one thread per rank
            for _ in range(1200):
                ranks = threads_of(proc.pid) - before
                if len(ranks) >= 4 or proc.poll() is not None:
                    break
                time.sleep(0.05)
            time.sleep(1)  # the ranks are emulating; the main thread waits for them
            assert sigint_to_threads(proc.pid, ranks), log.read_text()
            code = proc.wait(timeout=120)
        finally:
            proc.kill()
            proc.wait()
    assert code == 130 and "mono-aot: interrupted" in log.read_text(), log.read_text()
