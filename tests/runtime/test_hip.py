"""The HIP bindings: finding torch's copy, proving it, and errors that name the HIP error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mono_aot.runtime import hip as hipmod
from mono_aot.runtime.device import TorchHipDevice, prove_torch_copy
from mono_aot.spec.errors import MonoUnsupported


def test_import_runtime_needs_no_gpu_flydsl_or_compiler():
    code = (
        "import sys; sys.modules['flydsl'] = None\n"
        "import mono_aot.runtime\n"
        "heavy = [m for m in ('torch', 'pydantic') if m in sys.modules]\n"
        "from mono_aot.runtime import DrafterRunner, PeerBuffer, load_launcher, TorchHipDevice\n"
        "bad = [m for m, v in sys.modules.items() if v is not None and (m.split('.')[0] == 'flydsl' or m == 'click')\n"
        "       or v is not None and m.startswith(('mono_aot.compiler', 'mono_aot.kernels'))]\n"
        "print(heavy, bad)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[] []"


def test_stand_in_is_proven_and_reports_the_device(hip_env, monkeypatch):
    monkeypatch.setenv("MONO_AOT_STANDIN_ARCH", "gfx950:sramecc+:xnack-")
    monkeypatch.setenv("MONO_AOT_STANDIN_CUS", "256")
    monkeypatch.setenv("MONO_AOT_STANDIN_DEVICE", "3")
    dev = TorchHipDevice()
    f = dev.facts()
    assert (f.index, f.arch_name, f.cus) == (3, "gfx950:sramecc+:xnack-", 256)
    assert dev.stream_handle(None) == 0 and dev.stream_handle(1234) == 1234
    with pytest.raises(TypeError, match="torch stream or a raw handle"):
        dev.stream_handle("s")


@pytest.mark.parametrize(
    ("fail", "step"),
    [
        ("hipPointerGetAttribute", "hipPointerGetAttribute on a torch tensor's pointer"),
        ("hipStreamQuery", "hipStreamQuery on torch's current stream"),
        ("hipGetDevice", "hipGetDevice"),
    ],
)
def test_a_copy_that_rejects_torch_state_is_unsupported(hip_env, monkeypatch, fail, step):
    monkeypatch.setenv("MONO_AOT_STANDIN_FAIL", fail)
    with pytest.raises(MonoUnsupported, match="is not torch's") as e:
        prove_torch_copy(hipmod.hip_library())
    assert step in str(e.value)
    # the HIP error's name and string are in the message
    assert "hipError" in str(e.value) and "(stand-in)" in str(e.value)


def test_without_a_rocm_torch_only_an_explicit_library_is_accepted(hip_env, monkeypatch):
    lib = hipmod.hip_library()
    monkeypatch.delenv("MONO_AOT_HIP_LIBRARY")
    with pytest.raises(MonoUnsupported, match="torch has no ROCm device"):
        prove_torch_copy(lib)
    # a fresh process (CPU torch loaded, no HIP mapped) finds nothing and opens nothing by name
    code = (
        "import torch\n"
        "from mono_aot.runtime.hip import find_library\n"
        "from mono_aot.spec.errors import MonoUnsupported\n"
        "try:\n    find_library({})\nexcept MonoUnsupported as e:\n    print(e)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "no libamdhip64.so is loaded in this process" in p.stdout, p.stderr


def test_override_must_exist(tmp_path):
    with pytest.raises(MonoUnsupported, match="no such file"):
        hipmod.find_library({"MONO_AOT_HIP_LIBRARY": str(tmp_path / "nope.so")})


def test_two_mapped_copies_are_refused(tmp_path, monkeypatch, stand_in_lib):
    other = tmp_path / "libamdhip64.so.6"
    other.write_bytes(stand_in_lib.read_bytes())
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f00-7f01 r-xp 00000000 08:01 1 {stand_in_lib}\n"
        f"7f01-7f02 r--p 00001000 08:01 1 {stand_in_lib}\n"
        f"7f02-7f03 r-xp 00000000 08:01 2 {other}\n"
        "7f03-7f04 rw-p 00000000 00:00 0 \n"
    )
    assert hipmod.mapped_hip_libraries(str(maps)) == [str(stand_in_lib), str(other)]
    real = hipmod.mapped_hip_libraries
    monkeypatch.setattr(hipmod, "mapped_hip_libraries", lambda: real(str(maps)))
    with pytest.raises(MonoUnsupported, match="2 copies of the HIP runtime are loaded"):
        hipmod.find_library({})


def test_hip_errors_carry_name_and_string(hip_env, monkeypatch):
    lib = hipmod.hip_library()
    monkeypatch.setenv("MONO_AOT_STANDIN_FAIL", "hipExtMallocWithFlags")
    with pytest.raises(hipmod.HipError) as e:
        lib.malloc_uncached(4096)
    assert str(e.value) == (
        "hipExtMallocWithFlags (4096 bytes, uncached) failed: hipErrorOutOfMemory (2): "
        "out of memory (stand-in)"
    )


def test_a_cu_masked_stream_reaches_hip_with_its_words(hip_env):
    lib = hipmod.hip_library()
    s = lib.stream_create_with_cu_mask([0xFF, 0, 0x1])
    assert s != 0
    (made,) = hip_env.of("hipExtStreamCreateWithCUMask")
    assert made["mask"] == [0xFF, 0, 1] and made["stream"] == s
    lib.stream_destroy(s)
    assert [c["stream"] for c in hip_env.of("hipStreamDestroy")] == [s]
    with pytest.raises(hipmod.HipError, match="hipStreamDestroy.*hipErrorInvalidHandle"):
        lib.stream_destroy(s)  # destroyed twice: HIP's error, named
    for bad in ([], [0, 0], [1 << 32], [-1]):
        with pytest.raises(ValueError, match="CU mask"):
            lib.stream_create_with_cu_mask(bad)
    assert len(hip_env.of("hipExtStreamCreateWithCUMask")) == 1  # refused before HIP


def test_a_library_without_the_cu_mask_entry_point_still_serves(hip_env):
    lib = hipmod.hip_library()

    class Without:  # the library as one that lacks hipExtStreamCreateWithCUMask
        def __getattr__(self, name):
            if name == "hipExtStreamCreateWithCUMask":
                raise AttributeError(name)
            return getattr(lib.lib, name)

    stripped = object.__new__(hipmod.Hip)
    stripped.path, stripped.lib = "libstripped.so", Without()
    assert stripped.stream_query(0) is True  # the runtime's own calls still work
    with pytest.raises(
        MonoUnsupported, match="libstripped.so lacks .*hipExtStreamCreateWithCUMask"
    ):
        stripped.stream_create_with_cu_mask([1])
