"""Suite-wide: tests marked ``rocm`` need a ROCm device and are skipped without one."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def rocm_device_reason() -> str | None:
    """None when a ROCm GPU is usable, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not getattr(torch.version, "hip", None):
        return "torch is not a ROCm build (no AMD GPU on this machine)"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return "no ROCm device is visible"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = rocm_device_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs an AMD GPU: {reason}")
    for item in items:
        if "rocm" in item.keywords:
            item.add_marker(skip)
