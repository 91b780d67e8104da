"""The 64-byte kernel descriptor of code object v6 and the registers a dispatch initialises.

Layout and bit fields: LLVM's "AMDGPUUsage" document, "Kernel Descriptor" (tables "Kernel
Descriptor for GFX6-GFX12", "compute_pgm_rsrc1/2/3 for GFX6-GFX12" and "Kernel Code
Properties"), and its "Initial Kernel Execution State" section for the order of the SGPRs a
dispatch sets up: the user SGPRs enabled by the kernel code properties, in the order private
segment buffer (4), dispatch ptr (2), queue ptr (2), kernarg segment ptr (2), dispatch id (2),
flat scratch init (2), private segment size (1), then the system SGPRs enabled by
compute_pgm_rsrc2: workgroup id X, Y, Z, workgroup info, private segment wave offset.
On gfx90a and later (gfx942, gfx950) the work-item IDs arrive packed in v0 (X bits 9:0, Y 19:10,
Z 29:20).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass


def _f(v: int, lo: int, n: int) -> int:
    return (v >> lo) & ((1 << n) - 1)


@dataclass(frozen=True)
class KernelDescriptor:
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    entry_offset: int
    rsrc1: int
    rsrc2: int
    rsrc3: int
    code_properties: int
    kernarg_preload: int

    @classmethod
    def parse(cls, desc: bytes) -> KernelDescriptor:
        if len(desc) != 64:
            raise ValueError(f"a kernel descriptor is 64 bytes, not {len(desc)}")
        gs, ps, ka = struct.unpack_from("<III", desc, 0)
        (entry,) = struct.unpack_from("<q", desc, 16)
        r3, r1, r2 = struct.unpack_from("<III", desc, 44)
        props, preload = struct.unpack_from("<HH", desc, 56)
        return cls(gs, ps, ka, entry, r1, r2, r3, props, preload)

    # compute_pgm_rsrc1
    @property
    def float_round_mode_32(self) -> int:
        return _f(self.rsrc1, 12, 2)

    @property
    def float_round_mode_16_64(self) -> int:
        return _f(self.rsrc1, 14, 2)

    @property
    def float_denorm_mode_32(self) -> int:
        return _f(self.rsrc1, 16, 2)

    @property
    def float_denorm_mode_16_64(self) -> int:
        return _f(self.rsrc1, 18, 2)

    @property
    def dx10_clamp(self) -> int:
        return _f(self.rsrc1, 21, 1)

    @property
    def ieee_mode(self) -> int:
        return _f(self.rsrc1, 23, 1)

    @property
    def fp16_overflow(self) -> int:
        return _f(self.rsrc1, 26, 1)

    # compute_pgm_rsrc2
    @property
    def enable_private_segment(self) -> int:
        return _f(self.rsrc2, 0, 1)

    @property
    def user_sgpr_count(self) -> int:
        return _f(self.rsrc2, 1, 5)

    @property
    def workgroup_id(self) -> tuple[int, int, int]:
        return (_f(self.rsrc2, 7, 1), _f(self.rsrc2, 8, 1), _f(self.rsrc2, 9, 1))

    @property
    def workgroup_info(self) -> int:
        return _f(self.rsrc2, 10, 1)

    @property
    def vgpr_workitem_id(self) -> int:
        return _f(self.rsrc2, 11, 2)

    # compute_pgm_rsrc3 (gfx90a and later)
    @property
    def accum_offset(self) -> int:
        return (_f(self.rsrc3, 0, 6) + 1) * 4

    @property
    def tg_split(self) -> int:
        return _f(self.rsrc3, 16, 1)

    # kernel code properties
    _USER = (("private_segment_buffer", 0, 4), ("dispatch_ptr", 1, 2), ("queue_ptr", 2, 2),
             ("kernarg_segment_ptr", 3, 2), ("dispatch_id", 4, 2), ("flat_scratch_init", 5, 2),
             ("private_segment_size", 6, 1))  # fmt: skip

    def user_sgpr(self, name: str) -> int:
        bit = next(b for n, b, _ in self._USER if n == name)
        return _f(self.code_properties, bit, 1)

    @property
    def uses_dynamic_stack(self) -> int:
        return _f(self.code_properties, 11, 1)

    @property
    def wavefront_size32(self) -> int:
        return _f(self.code_properties, 10, 1)

    @property
    def kernarg_preload_length(self) -> int:
        return _f(self.kernarg_preload, 0, 7)

    @property
    def kernarg_preload_offset(self) -> int:
        return _f(self.kernarg_preload, 7, 9)

    def initial_sgprs(self) -> list[tuple[str, int, int]]:
        """(name, first SGPR, count) of every SGPR a dispatch initialises, in order."""
        out: list[tuple[str, int, int]] = []
        s = 0
        for name, bit, n in self._USER:
            if _f(self.code_properties, bit, 1):
                out.append((name, s, n))
                s += n
        if s != self.user_sgpr_count:
            raise ValueError(
                f"kernel code properties enable {s} user SGPRs, compute_pgm_rsrc2 says "
                f"{self.user_sgpr_count} (kernarg preload is not supported)"
            )
        for axis, on in zip("xyz", self.workgroup_id, strict=True):
            if on:
                out.append((f"workgroup_id_{axis}", s, 1))
                s += 1
        if self.workgroup_info:
            out.append(("workgroup_info", s, 1))
            s += 1
        if self.enable_private_segment:
            out.append(("private_segment_wave_offset", s, 1))
            s += 1
        return out
