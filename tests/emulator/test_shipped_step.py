"""The shipped layout's own bytes on every CI run: the gfx942 narrow kernel of
``minimax-m3.1-dspark-tp4`` (304 workgroups of 8 waves a rank, hidden 6144) runs one 1-request
step on 4 emulated ranks through the runtime's runner, judged against the float64 reference
(``mono_aot/selftest/emulated.py``). The emulation starts with the session
(``tests/emulator/shipped_step.py``); this test, sorted last, waits for it."""

from __future__ import annotations

import pytest

from mono_aot.selftest.cases import TOLERANCE

pytestmark = [pytest.mark.slow, pytest.mark.background, pytest.mark.timeout(4 * 3600)]


def test_the_shipped_narrow_step_passes_against_the_reference(shipped_step, record_property):
    r = shipped_step.future.result()
    doc, why = r.doc, r.why()
    assert r.code == 0 and doc["ok"], why
    case = r.only_case("narrow")
    assert case["launches"] == "narrow 1", why
    assert case["max_rel_error"] <= TOLERANCE and case["kv_bad_bytes"] == 0, why
    assert case["health"] == ["ok"] * 4, why
    # every rank ran the whole step: a shipped narrow step is about 440 million
    # wave-instructions, the small layout's about 20 million
    assert doc["instructions"] > 200_000_000, why
    assert doc["launches"] == 1 and doc["longest_launch_seconds"] > 0, why
    record_property(
        "cost",
        f"shipped gfx942 narrow 1 request: {doc['longest_launch_seconds']:.0f} s for the launch, "
        f"{doc['instructions'] / 1e6:.0f}M wave-instructions, "
        f"peak {doc['peak_memory_bytes'] / 1e9:.2f} GB, rel err {case['max_rel_error']:.2e}",
    )
