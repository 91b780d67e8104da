"""The drafter kernels on real GPUs (marked ``rocm``: skipped without a ROCm device).

On an MI300X (gfx942, 304 CUs) or MI355X (gfx950, 256 CUs) box with at least 4 such GPUs and
FlyDSL installed::

    pytest -m rocm tests/kernels/test_drafter_rocm.py

runs every ``mono-aot selftest`` check once (one cluster of 4 rank processes, one JIT compile
per variant and rank) and asserts each verdict: both variants at every request count against
the float64 reference (rel err <= 2e-2, K/V bytes equal), a dead rank recorded in health
without a hang, 100 graph replays with no host reset.
"""

from __future__ import annotations

import pytest

from mono_aot import selftest as st
from mono_aot.spec.layouts import resolve_layout

pytestmark = [pytest.mark.rocm, pytest.mark.slow]


@pytest.fixture(scope="module")
def verdicts() -> dict[str, st.CheckResult]:
    lay = resolve_layout("minimax-m3-dspark-tp4")
    try:
        results = st.run_selftest(lay, st.CHECKS, seed=7, log=print)
    except st.NoDevice as e:
        pytest.skip(str(e))
    return {r.name: r for r in results}


@pytest.mark.parametrize("check", st.CHECKS)
def test_selftest_check(verdicts, check):
    r = verdicts[check]
    assert r.ok, r.detail


def test_variant_cases_cover_every_request_count(verdicts):
    lay = resolve_layout("minimax-m3-dspark-tp4")
    for v in ("narrow", "wide"):
        got = [c["requests"] for c in verdicts[v].cases]
        assert got == st.request_counts(lay, v)
        assert all(c["max_rel_error"] <= st.TOLERANCE for c in verdicts[v].cases)
        assert all(c["kv_bad_bytes"] == 0 for c in verdicts[v].cases)
