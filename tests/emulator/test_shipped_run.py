"""Decode -> execute on shipped bytes: the narrow gfx942 kernel of the shipped layout, launched
with a real argument buffer (every pointer argument a mapped buffer) and a bad ``n``, runs its
prologue and launch check end to end and records STATUS_BAD_N / PH_LAUNCH / n / step in its
health words and writes nothing else (``mono_aot/kernels/sync.py``, ``launch_start``; the codes
are ``mono_aot/spec/abi.py``'s). Slow only when the store must be built (``MONO_AOT_TEST_STORE``
names a store to reuse, as the runtime tests do)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from mono_aot.emulator.machine import Machine
from mono_aot.spec import abi
from tests.emulator.conftest import stored_kernels
from tests.emulator.lane_ops import TEST_OPS

LAYOUT = "minimax-m3.1-dspark-tp4"


@pytest.fixture(scope="module")
def narrow_gfx942(tmp_path_factory: pytest.TempPathFactory):
    hit = stored_kernels(tmp_path_factory, LAYOUT, "gfx942", ("narrow",))[1]["narrow"]
    return hit.entry, hit.data


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
