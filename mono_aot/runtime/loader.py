"""Verified code objects into the device's HIP runtime, and launchers with the runner's calling
convention ``fn(*ints, stream=...)``.

Everything that can be checked without the driver is checked before the bytes reach it: the
store verified digest and size; here the ELF header (AMDGPU, the entry's e_flags), the target
(machine and xnack/sramecc features) against the device's ``gcnArchName``, and the launch grid
against the device's CUs. Each module is loaded once per device and process.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mono_aot.runtime.device import Device, DeviceFacts
from mono_aot.spec import abi
from mono_aot.spec.arch import ARCHS, EF_AMDGPU_MACH, EM_AMDGPU, base_arch
from mono_aot.spec.errors import BadInput, MonoError, MonoUnsupported

if TYPE_CHECKING:
    from mono_aot.spec.layouts import Layout
    from mono_aot.store import Entry, Hit, Store

# code object v4+ target features in e_flags: (mask, {value: setting})
EF_FEATURES = {
    "xnack": (0x300, {0x000: "unsupported", 0x100: "any", 0x200: "off", 0x300: "on"}),
    "sramecc": (0xC00, {0x000: "unsupported", 0x400: "any", 0x800: "off", 0xC00: "on"}),
}


def device_features(arch_name: str) -> dict[str, str]:
    """``gfx942:sramecc+:xnack-`` -> ``{"sramecc": "on", "xnack": "off"}`` (absent: unknown)."""
    out = {}
    for part in arch_name.split(":")[1:]:
        part = part.strip()
        if part[:-1] in EF_FEATURES and part[-1:] in "+-":
            out[part[:-1]] = "on" if part.endswith("+") else "off"
    return out


def check_target(data: bytes, entry: Entry, facts: DeviceFacts) -> None:
    """Raise ``MonoUnsupported`` unless the code object runs on this device (before any load)."""
    what = f"{entry.variant} kernel {entry.key[:12]}"
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2:
        raise MonoError(f"{what}: the stored bytes are not an ELF64 code object")
    (machine,) = struct.unpack_from("<H", data, 18)
    (e_flags,) = struct.unpack_from("<I", data, 48)
    if machine != EM_AMDGPU:
        raise MonoError(f"{what}: ELF machine {machine}, not AMDGPU ({EM_AMDGPU})")
    if e_flags != entry.elf.e_flags:
        raise MonoError(
            f"{what}: e_flags {e_flags:#x} in the bytes, {entry.elf.e_flags:#x} in the entry"
        )
    dev_arch = base_arch(facts.arch_name)
    info = ARCHS.get(entry.arch)
    if (
        info is None
        or entry.arch != dev_arch
        or (e_flags & EF_AMDGPU_MACH) != (info.e_flags & EF_AMDGPU_MACH)
    ):
        raise MonoUnsupported(
            f"{what} targets {entry.arch} (e_flags {e_flags:#x}); device {facts.index} is "
            f"{facts.arch_name}"
        )
    have = device_features(facts.arch_name)
    for feat, (mask, names) in EF_FEATURES.items():
        setting = names[e_flags & mask]
        dev = have.get(feat)
        if setting in ("on", "off") and dev is not None and dev != setting:
            raise MonoUnsupported(
                f"{what} was built with {feat} {setting}; device {facts.index} "
                f"({facts.arch_name}) runs with {feat} {dev}"
            )


@dataclass(frozen=True)
class _Slot:
    name: str
    offset: int
    size: int
    lo: int
    hi: int  # exclusive


class Launcher:
    """One kernel on one device: ``fn(*ints, stream=...)`` packs the kernarg buffer from the
    entry's recorded offsets and sizes and launches with the entry's grid, block and LDS."""

    def __init__(self, device: Device, function: int, entry: Entry, device_index: int) -> None:
        self.device = device
        self.function = function
        self.entry = entry
        self.device_index = device_index
        self.grid = entry.launch.grid
        self.block = entry.launch.block
        self.dynamic_lds = entry.launch.dynamic_lds
        self.segment_size = entry.kernarg_segment_size
        self.slots = tuple(
            _Slot(
                k.name,
                k.offset,
                k.size,
                -(1 << 31) if k.size == 4 else -(1 << 63),
                (1 << 31) if k.size == 4 else (1 << 64),
            )
            for k in entry.kernargs
        )
        self._what = f"{entry.variant} kernel {entry.symbol} ({entry.arch})"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slots)

    def pack(self, args: tuple[Any, ...]) -> ctypes.Array[ctypes.c_char]:
        """The kernarg buffer for ``args``; ``BadInput`` names a wrong count, type or range."""
        if len(args) != len(self.slots):
            raise BadInput(
                f"{self._what} takes {len(self.slots)} arguments ({', '.join(self.names)}), "
                f"got {len(args)}"
            )
        buf = ctypes.create_string_buffer(self.segment_size)
        for s, v in zip(self.slots, args, strict=True):
            if isinstance(v, bool) or not isinstance(v, int):
                raise BadInput(f"{self._what}: argument {s.name} must be an int, got {v!r}")
            if not s.lo <= v < s.hi:
                raise BadInput(
                    f"{self._what}: argument {s.name} = {v} does not fit its {s.size} bytes"
                )
            struct.pack_into("<Q" if s.size == 8 else "<I", buf, s.offset, v % (1 << (8 * s.size)))
        return buf

    def __call__(self, *args: int, stream: Any = None) -> None:
        buf = self.pack(args)
        handle = self.device.stream_handle(stream)
        self.device.hip.launch(
            self.function, self.grid, self.block, self.dynamic_lds, handle, buf, self._what
        )


def check_kernargs(entry: Entry, tp: int) -> None:
    """The entry's kernarg layout is the kernel contract's (names, offsets, sizes, in order)."""
    want = abi.kernarg_layout(tp)
    have = [(k.name, k.offset, k.size) for k in entry.kernargs]
    if have != want:
        raise MonoError(
            f"{entry.variant} kernel {entry.key[:12]}: its kernarg layout {have} is not the "
            f"kernel contract's {want} (built by another mono-aot?)"
        )
    if entry.kernarg_segment_size < max(o + s for _, o, s in want):
        raise MonoError(
            f"{entry.variant} kernel {entry.key[:12]}: kernarg segment of "
            f"{entry.kernarg_segment_size} bytes is smaller than its arguments"
        )


_lock = threading.Lock()
_loaded: dict[
    tuple[str, int, str], tuple[Any, int, int]
] = {}  # (hip, device, key) -> hip, module, fn


def load_launcher(
    variant: str,
    layout: Layout,
    device: Device,
    *,
    store: Store | None = None,
    env: dict[str, str] | None = None,
) -> Launcher:
    """The launcher of ``variant`` for this device: look up (or build, see
    ``mono_aot.runtime.miss``), check, load once per device, check occupancy."""
    from mono_aot.keys import served_key
    from mono_aot.runtime.miss import find_or_build

    facts = device.facts()
    arch = base_arch(facts.arch_name)
    if arch not in layout.targets:
        raise MonoUnsupported(
            f"device {facts.index} is {facts.arch_name}; layout {layout.name} targets "
            f"{', '.join(layout.archs)}"
        )
    if facts.cus != layout.ctas(arch):
        raise MonoUnsupported(
            f"device {facts.index} ({arch}) has {facts.cus} CUs: the kernels of layout "
            f"{layout.name} need all {layout.ctas(arch)} workgroups co-resident"
        )
    key = served_key(variant, layout, arch)
    hit = find_or_build(key, variant, layout, arch, store=store, env=env)
    return launcher_for(hit, device, facts, layout.parallel.tp)


def launcher_for(hit: Hit, device: Device, facts: DeviceFacts, tp: int) -> Launcher:
    """Check a verified hit against the device and load it (once per device)."""
    entry = hit.entry
    check_target(hit.data, entry, facts)
    if entry.launch.grid != facts.cus:
        raise MonoUnsupported(
            f"{entry.variant} kernel {entry.key[:12]} launches {entry.launch.grid} workgroups; "
            f"device {facts.index} has {facts.cus} CUs (one resident workgroup each is needed)"
        )
    check_kernargs(entry, tp)
    hip = device.hip
    cache_key = (hip.path, facts.index, entry.key)
    with _lock:
        if cache_key not in _loaded:
            if device.capturing():
                raise MonoError(
                    f"cannot load {entry.variant} kernel {entry.key[:12]} during graph capture: "
                    "build the runner before capturing"
                )
            if hip.get_device() != facts.index:
                hip.set_device(facts.index)
            what = f"{entry.variant} kernel {entry.key[:12]} ({entry.arch})"
            module = hip.module_load_data(hit.data, what)
            try:
                function = hip.module_get_function(module, entry.symbol)
                resident = hip.occupancy(
                    function, entry.launch.block, entry.launch.dynamic_lds, what
                )
                if resident < 1:
                    raise MonoUnsupported(
                        f"{what}: HIP reports {resident} resident workgroups per CU for "
                        f"{entry.launch.block} threads; the persistent kernel needs 1"
                    )
            except BaseException:
                hip.module_unload(module)
                raise
            _loaded[cache_key] = (hip, module, function)
        _, _, function = _loaded[cache_key]
    return Launcher(device, function, entry, facts.index)


def unload_all() -> None:
    """Unload every module this process loaded (tests; a server keeps them for its lifetime)."""
    with _lock:
        for hip, module, _ in _loaded.values():
            hip.module_unload(module)
        _loaded.clear()
