"""The runtime on 4 real GPUs (marked ``rocm``: skipped without a usable set of 4 MI300X or
MI355X): the stored code objects loaded through ``load_launcher`` and run through the
``DrafterRunner`` in 4 rank processes (the selftest's session: one GPU each, a gloo group,
``PeerBuffer`` over HIP IPC), judged against the float64 reference.

- a 1-request step (one narrow launch): the loader's counterpart of ``test_loader.py``;
- every request count of a step up to 3 chunks (1..24 requests on the shipped layout: one
  to three launches, narrow and wide mixed): the counterpart of ``test_runner.py``'s chunking
  test, now with values.

A kernel missing from the store is built once first (needs FlyDSL), or is an error under
``MONO_AOT_STRICT=1``.
"""

from __future__ import annotations

import pytest

from mono_aot.selftest import (
    TOLERANCE,
    NoDevice,
    Session,
    find_devices,
    step_counts,
)
from mono_aot.selftest.cases import describe_launches
from mono_aot.spec.layouts import resolve_layout

pytestmark = [pytest.mark.rocm, pytest.mark.slow]

LAY = resolve_layout("minimax-m3.1-dspark-tp4")
COUNTS = step_counts(LAY, chunks=3)


def _devices():
    try:
        return find_devices(LAY)
    except NoDevice as e:
        pytest.skip(str(e))


def test_a_stored_narrow_kernel_loads_and_runs_a_one_request_step():
    from mono_aot.keys import served_key
    from mono_aot.runtime.device import TorchHipDevice
    from mono_aot.runtime.loader import load_launcher, unload_all

    arch, devices = _devices()
    with Session(LAY, arch, devices, seed=3, max_requests=1, log=print) as s:
        for k in s.kernels:
            assert k["kernels"]["normal/narrow"] == served_key("narrow", LAY, arch)
            assert k["kernels"]["normal/wide"] == served_key("wide", LAY, arch)
        (res,) = s.run_counts([1], "narrow")
    assert res["launches"] == "narrow 1"
    assert res["ok"], res
    # and in this process: the same key, loaded and checked against the device
    import torch

    torch.cuda.set_device(devices[0])
    try:
        fn = load_launcher("narrow", LAY, TorchHipDevice(), env={"MONO_AOT_STRICT": "1"})
        props = torch.cuda.get_device_properties(devices[0])
        assert fn.grid == props.multi_processor_count == LAY.ctas(arch)
        assert fn.block == LAY.kernel.threads and fn.function != 0
        assert fn.entry.key == served_key("narrow", LAY, arch)
    finally:
        unload_all()


@pytest.fixture(scope="module")
def verdicts():
    arch, devices = _devices()
    with Session(LAY, arch, devices, seed=11, max_requests=max(COUNTS), log=print) as s:
        return {c["requests"]: c for c in s.run_counts(COUNTS, "runner")}


@pytest.mark.parametrize("count", COUNTS)
def test_the_runner_matches_the_float64_reference(verdicts, count):
    res = verdicts[count]
    assert res["launches"] == describe_launches(LAY, count)
    assert "launch_mismatch" not in res, res
    assert res["max_rel_error"] <= TOLERANCE, res
    assert res["kv_bad_bytes"] == 0, res
    assert all(h == "ok" for h in res["health"]), res
    assert res["ok"], res
