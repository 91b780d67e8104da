"""The kernel descriptors of the shipped kernels and the small layout's, read from the bytes,
against the ``.amdhsa_kernel`` block of the same compile's listing and the code object's
metadata note."""

from __future__ import annotations

import re

import pytest

from mono_aot.emulator.descriptor import KernelDescriptor
from mono_aot.emulator.elf import CodeObject
from tests.emulator.conftest import LAYOUT_CASES, compiled

pytestmark = pytest.mark.slow


def _directives(isa: str) -> dict[str, int]:
    block = isa.split("\t.amdhsa_kernel ", 1)[1].split(".end_amdhsa_kernel", 1)[0]
    return {m[0]: int(m[1]) for m in re.findall(r"\.amdhsa_(\w+) (\d+)", block)}


@pytest.mark.parametrize(("layout", "variant", "arch"), LAYOUT_CASES)
def test_descriptor_fields_equal_the_listing(request, layout, variant, arch):
    b = compiled(request, layout)[(variant, arch)]
    co = CodeObject(b.code_object)
    kd = KernelDescriptor.parse(co.kernel(f"mono_drafter_{variant}_0").descriptor)
    d = _directives(b.isa)
    got = {
        "group_segment_fixed_size": kd.group_segment_fixed_size,
        "private_segment_fixed_size": kd.private_segment_fixed_size,
        "kernarg_size": kd.kernarg_size,
        "user_sgpr_count": kd.user_sgpr_count,
        "user_sgpr_dispatch_ptr": kd.user_sgpr("dispatch_ptr"),
        "user_sgpr_queue_ptr": kd.user_sgpr("queue_ptr"),
        "user_sgpr_kernarg_segment_ptr": kd.user_sgpr("kernarg_segment_ptr"),
        "user_sgpr_dispatch_id": kd.user_sgpr("dispatch_id"),
        "user_sgpr_private_segment_size": kd.user_sgpr("private_segment_size"),
        "user_sgpr_kernarg_preload_length": kd.kernarg_preload_length,
        "user_sgpr_kernarg_preload_offset": kd.kernarg_preload_offset,
        "uses_dynamic_stack": kd.uses_dynamic_stack,
        "enable_private_segment": kd.enable_private_segment,
        "system_sgpr_workgroup_id_x": kd.workgroup_id[0],
        "system_sgpr_workgroup_id_y": kd.workgroup_id[1],
        "system_sgpr_workgroup_id_z": kd.workgroup_id[2],
        "system_sgpr_workgroup_info": kd.workgroup_info,
        "system_vgpr_workitem_id": kd.vgpr_workitem_id,
        "accum_offset": kd.accum_offset,
        "float_round_mode_32": kd.float_round_mode_32,
        "float_round_mode_16_64": kd.float_round_mode_16_64,
        "float_denorm_mode_32": kd.float_denorm_mode_32,
        "float_denorm_mode_16_64": kd.float_denorm_mode_16_64,
        "dx10_clamp": kd.dx10_clamp,
        "ieee_mode": kd.ieee_mode,
        "fp16_overflow": kd.fp16_overflow,
        "tg_split": kd.tg_split,
    }
    assert got == {k: d[k] for k in got}
    meta = b.metadata.kernel(f"mono_drafter_{variant}_0")
    assert kd.group_segment_fixed_size == meta.lds
    assert kd.kernarg_size == meta.kernarg_segment_size
    # the kernarg pointer in s[0:1], the workgroup id in s2: what the code reads first
    assert kd.initial_sgprs() == [("kernarg_segment_ptr", 0, 2), ("workgroup_id_x", 2, 1)]
