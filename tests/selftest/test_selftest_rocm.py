"""Every ``mono-aot selftest`` check on real GPUs (marked ``rocm``: skipped without one).

On an MI300X (gfx942, 304 CUs) or MI355X (gfx950, 256 CUs) box with at least 4 such GPUs::

    pytest -m rocm tests/selftest/test_selftest_rocm.py

runs every check once (one cluster of 4 rank processes; the stored kernels through the runtime,
built once first if the store lacks them, which needs FlyDSL) and asserts each verdict: both
variants at every request count and the multi-launch steps against the float64 reference (rel
err <= 2e-2, K/V bytes equal), a dead rank recorded in health without a hang, the step after a
dead rank's skipped step with no host reset (dead-rank-realign: expected to FAIL with the
kernels of this tree, see tests/selftest/test_realign_model.py), a late-dispatched launch
recorded as a barrier timeout and the next launch on its scratch clean, 100 graph replays with
no host reset.
"""

from __future__ import annotations

import pytest

from mono_aot import selftest as st
from mono_aot.spec.layouts import resolve_layout

pytestmark = [pytest.mark.rocm, pytest.mark.slow]


@pytest.fixture(scope="module")
def verdicts() -> dict[str, st.CheckResult]:
    lay = resolve_layout("minimax-m3.1-dspark-tp4")
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
    lay = resolve_layout("minimax-m3.1-dspark-tp4")
    for v in ("narrow", "wide"):
        got = [c["requests"] for c in verdicts[v].cases]
        assert got == st.request_counts(lay, v)
        assert all(c["max_rel_error"] <= st.TOLERANCE for c in verdicts[v].cases)
        assert all(c["kv_bad_bytes"] == 0 for c in verdicts[v].cases)


def test_multi_launch_steps_mix_variants(verdicts):
    lay = resolve_layout("minimax-m3.1-dspark-tp4")
    cases = verdicts["multi-launch"].cases
    assert [c["requests"] for c in cases] == st.multi_launch_counts(lay)
    assert any("narrow" in c["launches"] and "wide" in c["launches"] for c in cases)
    assert all(c["ok"] and c["max_rel_error"] <= st.TOLERANCE for c in cases)
