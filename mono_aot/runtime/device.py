"""Device facts (arch, CUs, current device and stream) through the HIP copy torch uses.

One small interface, so the loader and the runner run unchanged on a ROCm GPU and in tests on
CPU torch over the test suite's stand-in HIP library (``MONO_AOT_HIP_LIBRARY``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from mono_aot.runtime.hip import HIP_LIBRARY_ENV, Hip, HipError, hip_library
from mono_aot.spec.errors import MonoUnsupported


@dataclass(frozen=True)
class DeviceFacts:
    index: int
    arch_name: str  # HIP's gcnArchName, e.g. gfx942:sramecc+:xnack-
    cus: int


class Device(Protocol):
    hip: Hip

    def facts(self) -> DeviceFacts: ...

    def stream_handle(self, stream: Any = None) -> int: ...

    def capturing(self) -> bool: ...


def _torch_gpu() -> bool:
    import torch

    return bool(getattr(torch.version, "hip", None)) and torch.cuda.is_available()


def prove_torch_copy(hip: Hip, env: dict[str, str] | None = None) -> None:
    """Raise ``MonoUnsupported`` unless ``hip`` shares torch's device state.

    On a ROCm torch: ``hipGetDevice`` equals torch's current device, ``hipPointerGetAttribute``
    accepts a torch tensor's pointer (on that device) and ``hipStreamQuery`` accepts torch's
    current stream. On CPU torch no HIP device state exists to compare with, so only a library
    named explicitly by ``MONO_AOT_HIP_LIBRARY`` is accepted (the test suite's stand-in), and
    the same three calls must accept the current device, a host tensor and the null stream.
    """
    import os

    import torch

    env = dict(os.environ if env is None else env)
    gpu = _torch_gpu()
    if not gpu and not env.get(HIP_LIBRARY_ENV):
        raise MonoUnsupported(
            "torch has no ROCm device (torch.version.hip="
            f"{getattr(torch.version, 'hip', None)}); the drafter kernels need one"
        )
    step = "hipGetDevice"
    try:
        dev = hip.get_device()
        if gpu:
            want = torch.cuda.current_device()
            if dev != want:
                raise MonoUnsupported(
                    f"the HIP runtime at {hip.path} is not torch's: hipGetDevice says device "
                    f"{dev}, torch's current device is {want}"
                )
            probe = torch.empty(1, device=torch.device("cuda", want))
            stream = int(torch.cuda.current_stream(want).cuda_stream)
        else:
            want = dev
            probe = torch.empty(1)
            stream = 0
        step = "hipPointerGetAttribute on a torch tensor's pointer"
        owner = hip.pointer_device(probe.data_ptr())
        if owner != want:
            raise MonoUnsupported(
                f"the HIP runtime at {hip.path} is not torch's: it places a torch tensor on "
                f"device {owner}, torch on device {want}"
            )
        step = "hipStreamQuery on torch's current stream"
        hip.stream_query(stream)
    except HipError as e:
        raise MonoUnsupported(
            f"the HIP runtime at {hip.path} is not torch's ({step} failed: {e})"
        ) from None


class TorchHipDevice:
    """torch's current device, seen through the HIP runtime torch loaded (proven first)."""

    def __init__(self, hip: Hip | None = None, env: dict[str, str] | None = None) -> None:
        self.hip = hip if hip is not None else hip_library(env)
        prove_torch_copy(self.hip, env)
        self._gpu = _torch_gpu()

    def facts(self) -> DeviceFacts:
        import torch

        index = torch.cuda.current_device() if self._gpu else self.hip.get_device()
        arch, cus = self.hip.gcn_arch_name(index), self.hip.cu_count(index)
        if self._gpu:
            props = torch.cuda.get_device_properties(index)
            theirs = (getattr(props, "gcnArchName", arch), props.multi_processor_count)
            if theirs != (arch, cus):
                raise MonoUnsupported(
                    f"device {index}: HIP reports {arch} with {cus} CUs, torch {theirs[0]} with "
                    f"{theirs[1]} CUs"
                )
        return DeviceFacts(index, arch, cus)

    def stream_handle(self, stream: Any = None) -> int:
        """A raw ``hipStream_t``: from a torch stream, an int, or None (torch's current one)."""
        if stream is None:
            if not self._gpu:
                return 0
            import torch

            stream = torch.cuda.current_stream()
        if isinstance(stream, int) and not isinstance(stream, bool):
            return stream
        handle = getattr(stream, "cuda_stream", None)
        if handle is None:
            raise TypeError(f"stream must be a torch stream or a raw handle, got {stream!r}")
        return int(handle)

    def capturing(self) -> bool:
        if not self._gpu:
            return False
        import torch

        return bool(torch.cuda.is_current_stream_capturing())
