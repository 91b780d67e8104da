"""Decode -> execute on shipped bytes: the narrow gfx942 kernel of the shipped layout, launched
with a real argument buffer (every pointer argument a mapped buffer) and a bad ``n``, runs its
prologue and launch check end to end and records STATUS_BAD_N / PH_LAUNCH / n / step in its
health words and writes nothing else (``mono_aot/kernels/sync.py``, ``launch_start``; the codes
are ``mono_aot/spec/abi.py``'s). Slow only when the store must be built (``MONO_AOT_TEST_STORE``
names a store to reuse, as the runtime tests do)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mono_aot.emulator.machine import Machine
from mono_aot.keys import served_key
from mono_aot.spec import abi
from mono_aot.spec.layouts import resolve_layout
from mono_aot.store.layer import Layer
from tests.emulator.lane_ops import TEST_OPS

LAYOUT = "minimax-m3-dspark-tp4"


@pytest.fixture(scope="module")
def narrow_gfx942(tmp_path_factory: pytest.TempPathFactory):
    root = Path(os.environ.get("MONO_AOT_TEST_STORE") or tmp_path_factory.mktemp("store"))
    cmd = [sys.executable, "-m", "mono_aot", "build", "--layout", LAYOUT, "--arch", "gfx942",
           "--variant", "narrow", "--store", str(root)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    key = served_key("narrow", resolve_layout(LAYOUT), "gfx942")
    layer = Layer(root, "store", True, "store")
    entry, _, problem = layer.read_entry(key)
    assert entry is not None, problem
    blob, _, problem = layer.read_blob(entry.blob.sha256, entry.blob.size, key)
    assert blob is not None, problem
    return entry, blob


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 0])
def test_shipped_narrow_records_bad_n(narrow_gfx942, n):
    entry, blob = narrow_gfx942
    m = Machine("gfx942", devices=1)
    m.ops = {**TEST_OPS, **m.ops}  # the installed tables win over the test-only operations
    k = m.load(blob, entry.symbol)
    args = bytearray(entry.kernarg_segment_size)
    bufs: dict[str, np.ndarray] = {}
    base = 0x5000_0000_0000
    for slot in entry.kernargs:
        if slot.size == 8:  # a pointer: its own mapped buffer
            bufs[slot.name] = b = np.zeros(4096, np.uint8)
            m.memory.map(base, b, slot.name, 0)
            struct.pack_into("<Q", args, slot.offset, base)
            base += 0x10000
    offsets = {s.name: s.offset for s in entry.kernargs}
    struct.pack_into("<I", args, offsets["n"], n)
    bufs["step"][:4] = np.array([7], np.uint32).view(np.uint8)
    # two workgroups: with a bad n no grid barrier runs, so each finishes on its own
    m.launch(0, k, 2, entry.launch.block, bytes(args))
    st = m.run(max_instructions=1_000_000)
    health = bufs["health"][:16].view(np.int32).tolist()
    assert health == [abi.STATUS_BAD_N, abi.PH_LAUNCH, n, 7]
    written = sorted(name for name, b in bufs.items() if b.any())
    assert written == ["health", "step"]
    assert st.instructions > 1000 and st.launches[0].waves == 2 * entry.launch.block // 64
    print(
        f"{st.instructions} wave-instructions in {st.seconds:.2f} s: "
        f"{st.instructions_per_second:,.0f} per second"
    )
