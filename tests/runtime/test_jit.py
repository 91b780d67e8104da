"""Just-in-time builds on a miss: 4 rank processes starting together compile the kernel once."""

from __future__ import annotations

import pytest

from tests.runtime.conftest import stand_in_env
from tests.runtime.ranks import WORLD, run_ranks

pytestmark = pytest.mark.slow


def _load(rank, world, group, arg):
    import io
    import logging
    import warnings

    from mono_aot.runtime.device import TorchHipDevice
    from mono_aot.runtime.loader import load_launcher
    from mono_aot.runtime.miss import JitBuildWarning
    from mono_aot.spec.layouts import resolve_layout

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logging.getLogger("mono_aot.runtime").addHandler(handler)
    logging.getLogger("mono_aot.runtime").setLevel(logging.INFO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = load_launcher("narrow", resolve_layout("minimax-m3.1-dspark-tp4"), TorchHipDevice())
    jit = [str(w.message) for w in caught if issubclass(w.category, JitBuildWarning)]
    return {"jit": jit, "log": out.getvalue(), "symbol": fn.entry.symbol}


def test_four_ranks_missing_a_kernel_compile_it_once(stand_in_lib, tmp_path):
    cache = tmp_path / "user-cache"
    envs = [
        stand_in_env(stand_in_lib, tmp_path / f"calls-{r}.jsonl", MONO_AOT_CACHE_DIR=str(cache))
        for r in range(WORLD)
    ]
    res = run_ranks(_load, tmp_path, envs, timeout=1500)
    assert all(ok for ok, _ in res), res
    logs = [info["log"] for _, info in res]
    assert (
        sum(line.startswith("just-in-time build: built") for x in logs for line in x.splitlines())
        == 1
    ), logs
    for _, info in res:
        (w,) = info["jit"]
        assert "no prebuilt narrow kernel for layout minimax-m3.1-dspark-tp4 on gfx942" in w
        assert "mono-aot build --layout minimax-m3.1-dspark-tp4 --arch gfx942 --variant narrow" in w
    assert len({info["symbol"] for _, info in res}) == 1
