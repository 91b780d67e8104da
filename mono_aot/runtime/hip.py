"""ctypes bindings over the HIP runtime that torch loaded: exactly the calls the runtime uses.

Several copies of ``libamdhip64`` can be mapped into one process and they do not share device
state: a second copy opened by name may reject torch's pointers and streams. So the library is
the one already mapped into this process (``MONO_AOT_HIP_LIBRARY`` overrides the search), and
``prove_torch_copy`` checks it against torch before anything trusts it.

Enum values and struct layouts follow ROCm's ``hip_runtime_api.h`` and ``driver_types.h``.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from mono_aot.spec.errors import MonoError, MonoUnsupported

HIP_LIBRARY_ENV = "MONO_AOT_HIP_LIBRARY"
LIBRARY_STEM = "libamdhip64.so"

HIP_SUCCESS = 0
HIP_ERROR_NOT_READY = 600  # hipStreamQuery: work still pending (the stream is valid)
DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 63  # hipDeviceAttributeMultiprocessorCount
POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9  # HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL
DEVICE_MALLOC_UNCACHED = 0x3  # hipDeviceMallocUncached
IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1  # hipIpcMemLazyEnablePeerAccess
LAUNCH_PARAM_BUFFER_POINTER = 0x1  # HIP_LAUNCH_PARAM_BUFFER_POINTER
LAUNCH_PARAM_BUFFER_SIZE = 0x2
LAUNCH_PARAM_END = 0x3
IPC_HANDLE_SIZE = 64
# hipDeviceProp_tR0600: gcnArchName[256] sits at this byte offset (x86_64 layout); the struct is
# 1472 bytes today, the buffer below leaves room for growth at its end.
PROP_GCN_ARCH_NAME_OFFSET = 1160
PROP_BUFFER_BYTES = 4096


class HipError(MonoError):
    """A HIP call failed; the message names the call, its error name and string."""

    def __init__(self, call: str, code: int, name: str, text: str, what: str = "") -> None:
        self.call, self.code, self.name, self.text = call, code, name, text
        where = f" ({what})" if what else ""
        super().__init__(f"{call}{where} failed: {name} ({code}): {text}")


class IpcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_SIZE)]


_vp = ctypes.c_void_p
_SIGNATURES: dict[str, tuple[object, ...]] = {
    "hipGetDevice": (ctypes.POINTER(ctypes.c_int),),
    "hipSetDevice": (ctypes.c_int,),
    "hipDeviceGetAttribute": (ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int),
    "hipGetDevicePropertiesR0600": (_vp, ctypes.c_int),
    "hipPointerGetAttribute": (_vp, ctypes.c_int, _vp),
    "hipStreamQuery": (_vp,),
    "hipModuleLoadData": (ctypes.POINTER(_vp), _vp),
    "hipModuleGetFunction": (ctypes.POINTER(_vp), _vp, ctypes.c_char_p),
    "hipModuleUnload": (_vp,),
    "hipModuleLaunchKernel": (
        _vp,
        *([ctypes.c_uint] * 7),
        _vp,
        ctypes.POINTER(_vp),
        ctypes.POINTER(_vp),
    ),  # fmt: skip
    "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor": (
        ctypes.POINTER(ctypes.c_int),
        _vp,
        ctypes.c_int,
        ctypes.c_size_t,
    ),  # fmt: skip
    "hipExtMallocWithFlags": (ctypes.POINTER(_vp), ctypes.c_size_t, ctypes.c_uint),
    "hipMemset": (_vp, ctypes.c_int, ctypes.c_size_t),
    "hipFree": (_vp,),
    "hipIpcGetMemHandle": (ctypes.POINTER(IpcMemHandle), _vp),
    "hipIpcOpenMemHandle": (ctypes.POINTER(_vp), IpcMemHandle, ctypes.c_uint),
    "hipIpcCloseMemHandle": (_vp,),
}

# Entry points only the GPU selftest uses (its late-dispatch check): bound on first use, so a
# library without them still serves the runtime; using one it lacks is ``MonoUnsupported``.
_OPTIONAL_SIGNATURES: dict[str, tuple[object, ...]] = {
    "hipExtStreamCreateWithCUMask": (
        ctypes.POINTER(_vp),
        ctypes.c_uint32,
        ctypes.POINTER(ctypes.c_uint32),
    ),
    "hipStreamDestroy": (_vp,),
}


def mapped_hip_libraries(maps: str = "/proc/self/maps") -> list[str]:
    """Paths of every ``libamdhip64`` mapped into this process, in first-seen order."""
    out: list[str] = []
    try:
        with open(maps) as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and Path(parts[5].strip()).name.startswith(LIBRARY_STEM):
                    path = parts[5].strip()
                    if path not in out:
                        out.append(path)
    except OSError as e:
        raise MonoUnsupported(f"cannot read {maps} to find the loaded HIP runtime: {e}") from None
    return out


def find_library(env: dict[str, str] | None = None) -> str:
    """The HIP runtime to bind: ``MONO_AOT_HIP_LIBRARY``, else the one copy torch mapped."""
    env = dict(os.environ if env is None else env)
    override = env.get(HIP_LIBRARY_ENV)
    if override:
        if not Path(override).is_file():
            raise MonoUnsupported(f"{HIP_LIBRARY_ENV}={override}: no such file")
        return override
    found = mapped_hip_libraries()
    if not found:
        raise MonoUnsupported(
            f"no {LIBRARY_STEM} is loaded in this process: torch is not a ROCm build or has not "
            f"initialised HIP yet (set {HIP_LIBRARY_ENV} for an unusual install)"
        )
    real = {os.path.realpath(p) for p in found}
    if len(real) > 1:
        raise MonoUnsupported(
            f"{len(real)} copies of the HIP runtime are loaded ({', '.join(sorted(real))}); "
            f"cannot tell which one is torch's (set {HIP_LIBRARY_ENV})"
        )
    return found[0]


class Hip:
    """One HIP runtime library; every call is checked and raises ``HipError``."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise MonoUnsupported(f"cannot load the HIP runtime {path}: {e}") from None
        missing = []
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(self.lib, name, None)
            if fn is None:
                missing.append(name)
                continue
            fn.argtypes = list(argtypes)
            fn.restype = ctypes.c_int
        for name in ("hipGetErrorName", "hipGetErrorString"):
            fn = getattr(self.lib, name, None)
            if fn is None:
                missing.append(name)
                continue
            fn.argtypes = [ctypes.c_int]
            fn.restype = ctypes.c_char_p
        if missing:
            raise MonoUnsupported(f"{path} lacks HIP entry points: {', '.join(missing)}")

    def _optional(self, name: str) -> None:
        """Bind an entry point of ``_OPTIONAL_SIGNATURES`` or say that this library lacks it."""
        fn = getattr(self.lib, name, None)
        if fn is None:
            raise MonoUnsupported(f"{self.path} lacks the HIP entry point {name}")
        fn.argtypes = list(_OPTIONAL_SIGNATURES[name])
        fn.restype = ctypes.c_int

    def _call(self, name: str, *args: object, what: str = "", ok: Sequence[int] = ()) -> int:
        if name in _OPTIONAL_SIGNATURES:
            self._optional(name)
        rc = int(getattr(self.lib, name)(*args))
        if rc != HIP_SUCCESS and rc not in ok:
            err_name = (self.lib.hipGetErrorName(rc) or b"?").decode(errors="replace")
            text = (self.lib.hipGetErrorString(rc) or b"?").decode(errors="replace")
            raise HipError(name, rc, err_name, text, what)
        return rc

    # --- devices ---------------------------------------------------------------------------

    def get_device(self) -> int:
        d = ctypes.c_int()
        self._call("hipGetDevice", ctypes.byref(d))
        return d.value

    def set_device(self, device: int) -> None:
        self._call("hipSetDevice", device, what=f"device {device}")

    def cu_count(self, device: int) -> int:
        v = ctypes.c_int()
        self._call(
            "hipDeviceGetAttribute",
            ctypes.byref(v),
            DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            device,
            what="multiprocessor count",
        )
        return v.value

    def gcn_arch_name(self, device: int) -> str:
        buf = ctypes.create_string_buffer(PROP_BUFFER_BYTES)
        self._call("hipGetDevicePropertiesR0600", buf, device, what=f"device {device}")
        raw = buf.raw[PROP_GCN_ARCH_NAME_OFFSET : PROP_GCN_ARCH_NAME_OFFSET + 256]
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    def pointer_device(self, ptr: int) -> int:
        d = ctypes.c_int()
        self._call(
            "hipPointerGetAttribute",
            ctypes.byref(d),
            POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ctypes.c_void_p(ptr),
            what=f"pointer {ptr:#x}",
        )
        return d.value

    def stream_query(self, stream: int) -> bool:
        """True when the stream is idle, False when busy; raises when HIP rejects it."""
        rc = self._call(
            "hipStreamQuery",
            ctypes.c_void_p(stream),
            what=f"stream {stream:#x}",
            ok=(HIP_ERROR_NOT_READY,),
        )
        return rc == HIP_SUCCESS

    def stream_create_with_cu_mask(self, mask: Sequence[int]) -> int:
        """A new stream whose kernels run only on the CUs whose bits are set in ``mask``
        (``uint32`` words, bit ``i`` of word ``w`` is CU ``32 * w + i`` in HIP's numbering);
        ``stream_destroy`` releases it. The GPU selftest uses it to make a launch's workgroups
        wait for CUs (``mono_aot.selftest``, late-dispatch)."""
        words = [int(w) for w in mask]
        if not words or not any(words) or any(not 0 <= w < 1 << 32 for w in words):
            raise ValueError(f"a CU mask is non-empty uint32 words with a bit set, got {words}")
        s = ctypes.c_void_p()
        arr = (ctypes.c_uint32 * len(words))(*words)
        self._call(
            "hipExtStreamCreateWithCUMask",
            ctypes.byref(s),
            len(words),
            arr,
            what=f"CU mask {' '.join(f'{w:08x}' for w in words)}",
        )
        return int(s.value or 0)

    def stream_destroy(self, stream: int) -> None:
        self._call("hipStreamDestroy", ctypes.c_void_p(stream), what=f"stream {stream:#x}")

    # --- modules ---------------------------------------------------------------------------

    def module_load_data(self, image: bytes, what: str) -> int:
        m = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(image, len(image))
        self._call("hipModuleLoadData", ctypes.byref(m), buf, what=what)
        return int(m.value or 0)

    def module_get_function(self, module: int, symbol: str) -> int:
        f = ctypes.c_void_p()
        self._call(
            "hipModuleGetFunction",
            ctypes.byref(f),
            ctypes.c_void_p(module),
            symbol.encode(),
            what=symbol,
        )
        return int(f.value or 0)

    def module_unload(self, module: int) -> None:
        self._call("hipModuleUnload", ctypes.c_void_p(module))

    def occupancy(self, function: int, block: int, dynamic_lds: int, what: str) -> int:
        n = ctypes.c_int()
        self._call(
            "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor",
            ctypes.byref(n),
            ctypes.c_void_p(function),
            block,
            dynamic_lds,
            what=what,
        )
        return n.value

    def launch(
        self,
        function: int,
        grid: int,
        block: int,
        dynamic_lds: int,
        stream: int,
        kernargs: ctypes.Array[ctypes.c_char],
        what: str,
    ) -> None:
        """``hipModuleLaunchKernel`` with the kernarg buffer passed through ``extra``."""
        size = ctypes.c_size_t(len(kernargs))
        extra = (ctypes.c_void_p * 5)(
            LAUNCH_PARAM_BUFFER_POINTER,
            ctypes.cast(kernargs, ctypes.c_void_p),
            LAUNCH_PARAM_BUFFER_SIZE,
            ctypes.cast(ctypes.byref(size), ctypes.c_void_p),
            LAUNCH_PARAM_END,
        )
        self._call(
            "hipModuleLaunchKernel",
            ctypes.c_void_p(function),
            grid, 1, 1, block, 1, 1, dynamic_lds,
            ctypes.c_void_p(stream),
            None,
            extra,
            what=what,
        )  # fmt: skip

    # --- memory and IPC --------------------------------------------------------------------

    def malloc_uncached(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self._call(
            "hipExtMallocWithFlags",
            ctypes.byref(p),
            ctypes.c_size_t(nbytes),
            DEVICE_MALLOC_UNCACHED,
            what=f"{nbytes} bytes, uncached",
        )
        return int(p.value or 0)

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        self._call("hipMemset", ctypes.c_void_p(ptr), value, ctypes.c_size_t(nbytes))

    def free(self, ptr: int) -> None:
        self._call("hipFree", ctypes.c_void_p(ptr))

    def ipc_get_handle(self, ptr: int) -> bytes:
        h = IpcMemHandle()
        self._call("hipIpcGetMemHandle", ctypes.byref(h), ctypes.c_void_p(ptr))
        return ctypes.string_at(ctypes.addressof(h), IPC_HANDLE_SIZE)

    def ipc_open(self, handle: bytes, what: str) -> int:
        if len(handle) != IPC_HANDLE_SIZE:
            raise MonoError(f"an IPC handle is {IPC_HANDLE_SIZE} bytes, got {len(handle)} ({what})")
        h = IpcMemHandle.from_buffer_copy(handle)
        p = ctypes.c_void_p()
        self._call(
            "hipIpcOpenMemHandle",
            ctypes.byref(p),
            h,
            IPC_MEM_LAZY_ENABLE_PEER_ACCESS,
            what=what,
        )
        return int(p.value or 0)

    def ipc_close(self, ptr: int) -> None:
        self._call("hipIpcCloseMemHandle", ctypes.c_void_p(ptr))


_lock = threading.Lock()
_bound: dict[str, Hip] = {}


def hip_library(env: dict[str, str] | None = None) -> Hip:
    """The bound HIP runtime (one per path per process), not yet proven to be torch's."""
    path = find_library(env)
    with _lock:
        if path not in _bound:
            _bound[path] = Hip(path)
        return _bound[path]
