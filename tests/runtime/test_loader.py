"""The loader on the real narrow and wide artifacts, through the stand-in HIP library."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys

import pytest

from mono_aot.compiler.codeobject import parse_code_object
from mono_aot.keys import served_key
from mono_aot.runtime.device import TorchHipDevice
from mono_aot.runtime.loader import load_launcher
from mono_aot.runtime.miss import KernelMissing
from mono_aot.spec.errors import BadInput, MonoUnsupported
from mono_aot.spec.layouts import resolve_layout
from mono_aot.store import Store

pytestmark = pytest.mark.slow
LAY = resolve_layout("minimax-m3.1-dspark-tp4")
DEVICES = {"gfx942": ("gfx942:sramecc+:xnack-", "304"), "gfx950": ("gfx950:sramecc+:xnack-", "256")}


def _device(monkeypatch, arch):
    name, cus = DEVICES[arch]
    monkeypatch.setenv("MONO_AOT_STANDIN_ARCH", name)
    monkeypatch.setenv("MONO_AOT_STANDIN_CUS", cus)
    return TorchHipDevice()


@pytest.mark.parametrize("arch", sorted(DEVICES))
@pytest.mark.parametrize("variant", ["narrow", "wide"])
def test_launch_hands_the_driver_the_code_objects_kernarg_layout(
    hip_env, artifacts, monkeypatch, arch, variant
):
    store = Store.at(artifacts, writable=False)
    dev = _device(monkeypatch, arch)
    fn = load_launcher(variant, LAY, dev, store=store)
    hit = store.lookup(served_key(variant, LAY, arch))
    meta = parse_code_object(hit.data).kernels[0]  # the bytes' own metadata, not the entry's
    args = [0x1000_0000_0000 + 0x100 * i for i in range(len(meta.args) - 3)] + [3, 17, 24]
    fn(*args, stream=0xBEEF)
    (call,) = hip_env.of("hipModuleLaunchKernel")
    blob = bytes.fromhex(call["kernargs"])
    assert call["kernarg_size"] == meta.kernarg_segment_size == len(blob)
    want = bytearray(meta.kernarg_segment_size)
    for a, v in zip(meta.args, args, strict=True):
        struct.pack_into("<q" if a.size == 8 else "<i", want, a.offset, v)
    assert blob == bytes(want)
    assert call["function"] == meta.name == hit.entry.symbol
    assert call["grid"] == [LAY.ctas(arch), 1, 1]
    assert call["block"] == [LAY.kernel.threads, 1, 1]
    assert call["lds"] == hit.entry.launch.dynamic_lds and call["stream"] == 0xBEEF
    (load,) = hip_env.of("hipModuleLoadData")
    assert load["size"] == len(hit.data) and load["e_flags"] == hit.entry.elf.e_flags
    # loaded once per device: a second launcher reuses the module
    load_launcher(variant, LAY, dev, store=store)
    assert len(hip_env.of("hipModuleLoadData")) == 1


def test_launcher_checks_argument_count_types_and_ranges(hip_env, artifacts, monkeypatch):
    fn = load_launcher("narrow", LAY, _device(monkeypatch, "gfx942"), store=Store.at(artifacts))
    good = [1] * 25 + [0, 1, 8]
    with pytest.raises(BadInput, match="takes 28 arguments .*got 27"):
        fn(*good[:-1])
    with pytest.raises(BadInput, match="argument n = 2147483648 does not fit its 4 bytes"):
        fn(*good[:-1], 1 << 31)
    with pytest.raises(BadInput, match="argument x must be an int"):
        fn(1.5, *good[1:])
    with pytest.raises(BadInput, match="argument x = -9223372036854775809"):
        fn(-(1 << 63) - 1, *good[1:])
    assert hip_env.of("hipModuleLaunchKernel") == []


def test_gfx950_artifact_is_refused_on_a_gfx942_device_before_load(hip_env, artifacts, monkeypatch):
    from mono_aot.runtime.device import DeviceFacts
    from mono_aot.runtime.loader import launcher_for

    hit = Store.at(artifacts).lookup(served_key("wide", LAY, "gfx950"))
    dev = _device(monkeypatch, "gfx942")
    with pytest.raises(MonoUnsupported, match="targets gfx950 .*device 0 is gfx942"):
        launcher_for(hit, dev, DeviceFacts(0, "gfx942:sramecc+:xnack-", 256), 4)
    assert hip_env.of("hipModuleLoadData") == []


def test_xnack_mismatch_is_refused(hip_env, artifacts, monkeypatch):
    from mono_aot.runtime.device import DeviceFacts
    from mono_aot.runtime.loader import check_target

    hit = Store.at(artifacts).lookup(served_key("wide", LAY, "gfx942"))
    data = bytearray(hit.data)
    struct.pack_into("<I", data, 48, (hit.entry.elf.e_flags & ~0x300) | 0x300)  # xnack on
    entry = hit.entry.model_copy(
        update={
            "elf": hit.entry.elf.model_copy(
                update={"e_flags": struct.unpack_from("<I", data, 48)[0]}
            )
        }
    )
    with pytest.raises(MonoUnsupported, match="built with xnack on.*runs with xnack off"):
        check_target(bytes(data), entry, DeviceFacts(0, "gfx942:sramecc+:xnack-", 304))


def test_cu_mismatch_is_unsupported(hip_env, artifacts, monkeypatch):
    dev = _device(monkeypatch, "gfx942")
    monkeypatch.setenv("MONO_AOT_STANDIN_CUS", "300")
    with pytest.raises(MonoUnsupported, match="has 300 CUs.*need all 304 workgroups"):
        load_launcher("wide", LAY, dev, store=Store.at(artifacts))
    assert hip_env.of("hipModuleLoadData") == []


def test_no_resident_workgroup_is_unsupported(hip_env, artifacts, monkeypatch):
    dev = _device(monkeypatch, "gfx942")
    monkeypatch.setenv("MONO_AOT_STANDIN_OCCUPANCY", "0")
    with pytest.raises(MonoUnsupported, match="0 resident workgroups per CU"):
        load_launcher("wide", LAY, dev, store=Store.at(artifacts))
    assert len(hip_env.of("hipModuleUnload")) == 1  # nothing left loaded


def test_corrupted_blob_never_reaches_module_load(hip_env, artifacts, tmp_path, monkeypatch):
    root = tmp_path / "store"
    shutil.copytree(artifacts, root)
    key = served_key("wide", LAY, "gfx942")
    hit = Store.at(root).lookup(key)
    blob = next(p for p in root.rglob("*") if p.is_file() and p.read_bytes() == hit.data)
    raw = bytearray(blob.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    blob.chmod(0o644)
    blob.write_bytes(bytes(raw))
    monkeypatch.setenv("MONO_AOT_STRICT", "1")
    with pytest.raises(KernelMissing):
        load_launcher("wide", LAY, _device(monkeypatch, "gfx942"), store=Store.at(root))
    assert hip_env.of("hipModuleLoadData") == []


def test_strict_mode_raises_on_a_miss(hip_env, tmp_path, monkeypatch):
    monkeypatch.setenv("MONO_AOT_STRICT", "1")
    key = served_key("narrow", LAY, "gfx942")
    with pytest.raises(KernelMissing) as e:
        load_launcher(
            "narrow", LAY, _device(monkeypatch, "gfx942"), store=Store.at(tmp_path / "empty")
        )
    msg = str(e.value)
    assert key in msg and "minimax-m3.1-dspark-tp4" in msg and "gfx942" in msg
    assert "mono-aot build --layout minimax-m3.1-dspark-tp4 --arch gfx942 --variant narrow" in msg


def test_a_miss_without_a_compiler_is_unsupported(stand_in_lib, tmp_path):
    from tests.runtime.conftest import stand_in_env

    code = (
        "import sys; sys.modules['flydsl'] = None\n"
        "from mono_aot.runtime import TorchHipDevice, load_launcher\n"
        "from mono_aot.spec.errors import MonoUnsupported\n"
        "from mono_aot.spec.layouts import resolve_layout\n"
        "try:\n"
        "    load_launcher('wide', resolve_layout('minimax-m3.1-dspark-tp4'), TorchHipDevice())\n"
        "except MonoUnsupported as e:\n"
        "    print(e)\n"
    )
    env = {
        **stand_in_env(stand_in_lib, tmp_path / "calls.jsonl"),
        "MONO_AOT_CACHE_DIR": str(tmp_path / "cache"),
        "PATH": "/usr/bin:/bin",
    }
    p = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert "no compiler here to build it just in time" in p.stdout, p.stderr
    assert (
        "mono-aot build --layout minimax-m3.1-dspark-tp4 --arch gfx942 --variant wide" in p.stdout
    )
