"""Running hand-assembled programs on the emulator (shared by the executor's tests)."""

from __future__ import annotations

import struct

import numpy as np

from mono_aot.emulator.machine import Machine
from tests.emulator.asm import Asm, kernel_object
from tests.emulator.lane_ops import TEST_OPS

OUT = 0x7000_0000_0000  # device addresses of the test buffers (no real host memory there)


def machine(arch: str = "gfx942", devices: int = 1, **kw) -> Machine:
    m = Machine(arch, devices, **kw)
    m.ops = dict(TEST_OPS)
    return m


def buffer(m: Machine, base: int, nbytes: int, name: str = "out", device: int = 0) -> np.ndarray:
    buf = np.zeros(nbytes, dtype=np.uint8)
    m.memory.map(base, buf, name, device)
    return buf


def kernargs(*ptrs: int) -> bytes:
    return struct.pack(f"<{len(ptrs)}Q", *ptrs).ljust(64, b"\0")


def run(asm: Asm, *, grid: int = 1, block: int = 64, args: tuple[int, ...] = (OUT,),
        out_bytes: int = 4096, lds: int = 0, m: Machine | None = None, **kw):  # fmt: skip
    """Load and launch ``asm`` once on device 0 with ``out`` mapped at ``OUT``: (out, stats)."""
    m = m or machine(**kw)
    out = buffer(m, OUT, out_bytes)
    k = m.load(kernel_object(asm, lds=lds))
    m.launch(0, k, grid, block, kernargs(*args))
    return out, m.run()


def prologue(asm: Asm) -> Asm:
    """s[4:5] = the first kernel argument (the out pointer); v1 = 4 * thread id."""
    asm.smem("s_load_dwordx2", 4, 0, 0).waitcnt(lgkm=0)
    return asm.vop2("v_lshlrev_b32", 1, 128 + 2, 256)
