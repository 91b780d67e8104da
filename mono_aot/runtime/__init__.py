"""Serving runtime: verified code objects in the process's own HIP runtime, launchers, the
``DrafterRunner`` and its ``PeerBuffer``. Never imports FlyDSL, the compiler or the kernels;
importing this package is cheap (its parts load on first use).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Hip": "mono_aot.runtime.hip",
    "HipError": "mono_aot.runtime.hip",
    "hip_library": "mono_aot.runtime.hip",
    "Device": "mono_aot.runtime.device",
    "DeviceFacts": "mono_aot.runtime.device",
    "TorchHipDevice": "mono_aot.runtime.device",
    "Launcher": "mono_aot.runtime.loader",
    "load_launcher": "mono_aot.runtime.loader",
    "KernelMissing": "mono_aot.runtime.miss",
    "JitBuildWarning": "mono_aot.runtime.miss",
    "PeerBuffer": "mono_aot.runtime.peer",
    "AttentionContext": "mono_aot.runtime.runner",
    "DrafterRunner": "mono_aot.runtime.runner",
    "KernelFault": "mono_aot.runtime.runner",
    "TPGroup": "mono_aot.runtime.runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mono_aot.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
