"""The drafter megakernels (FlyDSL) and the kernel provider protocol of the build.

Importing this package imports nothing heavy; FlyDSL is imported when a launcher is built
(``launcher_for``), which must happen in a process whose
compile environment was set before FlyDSL's import (see ``mono_aot.compiler``).

Provider protocol: ``KERNEL_NAMES`` (variant -> kernel function name; the code object symbol
is the name plus ``_0``), ``launcher_for(variant, layout, arch)`` and ``trace_args(variant,
layout)`` (placeholder values of the contract's argument list, for COMPILE_ONLY tracing).
"""

from __future__ import annotations

from typing import Any

from mono_aot.kernels.names import KERNEL_NAMES
from mono_aot.spec import abi
from mono_aot.spec.layouts import Layout


def _spec(layout: Layout, arch: str, variant: str, wait_ticks: int, gemm: str | None):
    from mono_aot.kernels.drafter import KernelSpec, default_gemm

    layout.ctas(arch)  # LayoutError when the layout does not target arch
    return KernelSpec(layout, arch, variant, wait_ticks, gemm or default_gemm(variant))


def launcher_for(variant: str, layout: Layout, arch: str, *, gemm: str | None = None) -> Any:
    """The ``@flyc.jit`` launcher of ``variant`` (wait bound: the layout's ``peer_wait_s``)."""
    from mono_aot.kernels.drafter import make_launcher

    return make_launcher(_spec(layout, arch, variant, layout.wait_ticks, gemm))


def trace_args(variant: str, layout: Layout) -> tuple[int, ...]:
    """Placeholder values for tracing: every address 0, rank 0, bt_stride 1, n = the variant's
    most tokens (the order of ``abi.kernel_args``)."""
    vals = []
    for a in abi.kernel_args(layout.parallel.tp):
        if a.kind == "i64":
            vals.append(0)
        elif a.name == "n":
            vals.append(layout.variant_tokens(variant))  # type: ignore[arg-type]
        elif a.name == "bt_stride":
            vals.append(1)
        else:
            vals.append(0)
    return tuple(vals)


__all__ = ["KERNEL_NAMES", "launcher_for", "trace_args"]
