"""The hook's decisions, taken by every TP rank alike, in real rank processes joined by vLLM's
own TP group (gloo on the CPU), with vLLM's plugin loader, model registry, forward context and
cache binding (``scenarios.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.runtime.ranks import run_ranks
from tests.vllm.scenarios import run_rank

pytestmark = pytest.mark.slow
NO_METADATA = "stock: no attention metadata (profiling or a dummy run)"
OFF = "stock: mono-aot is off"


def _cluster(tmp_path: Path, world: int, mode: str, scenarios: list[str], envs=None) -> list:
    envs = envs or [{} for _ in range(world)]
    res = run_ranks(
        run_rank, tmp_path, envs, arg={"mode": mode, "scenarios": scenarios}, timeout=900
    )
    assert all(ok for ok, _ in res), [r for ok, r in res if not ok]
    outs = [r for _, r in res]
    for out in outs:
        assert out["class"] == ["DraftBackbone", True]  # resolved through vLLM's registry
    return outs


def _same_on_every_rank(outs: list, name: str) -> list:
    """The scenario's steps on rank 0, after checking every rank took exactly the same path."""
    paths = [[(s.get("decision"), s.get("off"), s.get("raised")) for s in o[name]] for o in outs]
    assert all(p == paths[0] for p in paths), paths
    return outs[0][name]


def test_without_a_gpu_every_rank_keeps_the_stock_forward_with_one_log_line(tmp_path):
    outs = _cluster(
        tmp_path, 4, "FULL",
        ["profiling", "unbound", "capture-before-build", "piecewise", "build", "strict"],
    )  # fmt: skip
    [s] = _same_on_every_rank(outs, "profiling")
    assert s["decision"] == NO_METADATA and s["equal"] is True
    [s] = _same_on_every_rank(outs, "unbound")
    assert s["decision"] == "stock: draft KV caches not bound on every rank yet" and s["equal"]
    [s] = _same_on_every_rank(outs, "capture-before-build")
    assert s["decision"] == "stock: graph capture before the runner exists" and s["equal"]
    steps = _same_on_every_rank(outs, "piecewise")
    assert [x["decision"] for x in steps] == [OFF, OFF] and all(x["equal"] for x in steps)
    assert steps[0]["off"].startswith("cudagraph_mode PIECEWISE")
    *steps, freed = _same_on_every_rank(outs, "build")
    assert all(x["decision"] == OFF and x["equal"] for x in steps) and steps[0]["builds"] == 0
    assert freed == {"freed_with_model": 0}  # nothing was allocated, nothing to release
    assert steps[0]["off"].startswith(
        "drafter runner failed on 4 rank(s): ranks 0, 1, 2, 3: no libamdhip64.so is loaded"
    ), steps[0]["off"]
    [s] = _same_on_every_rank(outs, "strict")
    assert s["raised"].startswith("MonoUnsupported: MONO_AOT_STRICT=1 and the drafter kernels")
    for out in outs:  # one line per hook that turned off (piecewise, build), none otherwise
        offs = [x for x in out["log"] if "drafter kernels off" in x]
        assert len(offs) == 2 and all(x.startswith("WARNING ") for x in offs), out["log"]


def test_tp_2_is_refused_on_every_rank(tmp_path):
    outs = _cluster(tmp_path, 2, "FULL", ["build"])
    *steps, freed = _same_on_every_rank(outs, "build")
    assert steps[0]["off"] == "TP 2: the kernels are built for TP 4"
    assert all(x["decision"] == OFF and x["equal"] for x in steps)
    assert freed == {"freed_with_model": 0}


@pytest.fixture(scope="module")
def prebuilt_store() -> Path:
    store = os.environ.get("MONO_AOT_TEST_STORE")
    if not store:
        if os.environ.get("MONO_AOT_REQUIRE_VLLM"):
            pytest.fail("MONO_AOT_TEST_STORE is not set (make test-vllm builds it)")
        pytest.skip("needs MONO_AOT_TEST_STORE: a store with the shipped gfx942 kernels")
    return Path(store)


def test_with_the_stand_in_hip_every_rank_runs_the_kernels_and_rebuilds_when_stale(
    tmp_path, stand_in_lib, prebuilt_store
):
    """With the stand-in HIP library (named so: the GPU is not here) the runner is built on
    every rank, steps launch through the custom op (9 requests: 2 launches, then 3 requests
    after vLLM re-binds the caches: a rebuilt runner, 1 more launch); a rank whose device has
    another CU count makes every rank fall back, naming it."""
    from tests.runtime.conftest import stand_in_env

    envs = [
        stand_in_env(stand_in_lib, tmp_path / f"calls-{r}.jsonl", MONO_AOT_PATH=str(prebuilt_store),
                     MONO_AOT_STRICT="0", MONO_AOT_CACHE_DIR=str(tmp_path / "cache"))
        for r in range(4)
    ]  # fmt: skip
    outs = _cluster(tmp_path, 4, "FULL", ["build", "bad-step", "rank-2-fails"], envs)
    steps = _same_on_every_rank(outs, "build")
    assert [x.get("decision") for x in steps] == [
        "kernels",
        "kernels",
        NO_METADATA,
        "kernels",
        None,
    ]
    assert [x.get("builds") for x in steps] == [1, 1, 1, 2, None]
    # the runner goes with the model: its peer buffer is freed (one hipFree per rank)
    assert steps[4] == {"freed_with_model": 1}
    # a later check failing at launch (18 tokens: not whole requests) turns every rank off
    steps = _same_on_every_rank(outs, "bad-step")
    assert [x["decision"] for x in steps] == ["kernels", OFF]
    assert steps[1]["off"].startswith("at launch: 18 tokens") and steps[1]["equal"] is True
    for out in outs:
        launches = [x.get("launches") for x in out["build"]]
        assert launches[1] == 1 + 2 and launches[3] == 1 + 2 + 1, launches
    [s] = _same_on_every_rank(outs, "rank-2-fails")
    assert s["decision"] == OFF
    assert s["off"].startswith("drafter runner failed on 1 rank(s): rank 2: 228 CUs"), s["off"]
