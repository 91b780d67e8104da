"""A draft step through the vLLM hook on 4 real GPUs against the float64 reference (marked
``rocm``: skipped without 4 MI300X or MI355X, and without vLLM). The selftest's session
provides the model, the problem, the rank processes and the verdict; each rank then runs the
step through ``accelerate`` inside vLLM's forward context (``rocm_rank.py``)."""

from __future__ import annotations

import pytest

from mono_aot.selftest import NoDevice, Session, find_devices
from mono_aot.selftest.cases import request_specs
from mono_aot.spec.layouts import resolve_layout

pytestmark = [pytest.mark.rocm, pytest.mark.slow]
LAY = resolve_layout("minimax-m3.1-dspark-tp4")


@pytest.mark.parametrize("requests", [2, 11])  # one narrow launch; a wide and a narrow one
def test_a_draft_step_through_the_hook_matches_the_float64_reference(requests):
    from tests.vllm.rocm_rank import hook_step

    try:
        arch, devices = find_devices(LAY)
    except NoDevice as e:
        pytest.skip(str(e))
    with Session(LAY, arch, devices, seed=5, max_requests=requests, log=print) as s:
        prob = s.problem(request_specs(LAY, requests, salt=requests))
        common, caches = s.save_case(prob)
        tp = LAY.parallel.tp
        msgs = [
            {
                "weights": str(s.weight_files[r]), "caches": str(caches[r]), "case": str(common),
                "rope": str(s.dir / "rope.pt"), "qpr": LAY.serving.qpr,
            }
            for r in range(tp)
        ]  # fmt: skip
        answers = s.cluster.run(hook_step, msgs, timeout=1800)
        assert [a["decision"] for a in answers] == ["kernels"] * tp, [a["off"] for a in answers]
        verdict = s.judge(prob, answers)
    assert verdict["ok"], verdict
