"""The HIP binding against a real ROCm torch (marked ``rocm``: skipped without a ROCm device):
the library found is torch's own ``libamdhip64`` (mapped in ``/proc/self/maps``), and it
shares torch's device state on every GPU: current device, tensor pointers, streams, arch and
CU count. The stand-in counterpart is ``test_hip.py``."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.rocm


@pytest.fixture
def torch_hip(monkeypatch):
    monkeypatch.delenv("MONO_AOT_HIP_LIBRARY", raising=False)
    torch.empty(1, device="cuda")  # HIP is initialised and its library mapped
    from mono_aot.runtime.hip import hip_library

    return hip_library({})


def test_the_library_is_the_copy_torch_mapped(torch_hip):
    from mono_aot.runtime.hip import find_library, mapped_hip_libraries

    mapped = mapped_hip_libraries()
    assert mapped, "torch's ROCm build maps a libamdhip64"
    assert {os.path.realpath(p) for p in mapped} == {os.path.realpath(find_library({}))}
    assert os.path.realpath(torch_hip.path) == os.path.realpath(find_library({}))


def test_the_proof_passes_and_device_state_is_shared_on_every_gpu(torch_hip):
    from mono_aot.runtime.device import TorchHipDevice, prove_torch_copy

    for i in range(torch.cuda.device_count()):
        with torch.cuda.device(i):
            prove_torch_copy(torch_hip, {})
            assert torch_hip.get_device() == i  # torch's set device is HIP's current device
            t = torch.empty(1024, device=torch.device("cuda", i))
            assert torch_hip.pointer_device(t.data_ptr()) == i
            props = torch.cuda.get_device_properties(i)
            assert torch_hip.cu_count(i) == props.multi_processor_count
            assert torch_hip.gcn_arch_name(i) == props.gcnArchName
            s = torch.cuda.Stream(device=i)
            with torch.cuda.stream(s):
                a = torch.randn(2048, 2048, device=torch.device("cuda", i))
                for _ in range(8):
                    a = a @ a / 2048
            s.synchronize()
            assert torch_hip.stream_query(int(s.cuda_stream)) is True  # idle after a sync
            facts = TorchHipDevice(torch_hip, {}).facts()
            assert (facts.index, facts.arch_name, facts.cus) == (
                i,
                props.gcnArchName,
                props.multi_processor_count,
            )
