"""Global memory of the emulator: a map of allocations over host memory.

Each allocation is a writable 1-D ``uint8`` numpy array mapped at a 64-bit device address (for
a torch CPU tensor, its real host address, so the pointers the host writes into kernel
arguments are the ones the kernel dereferences). Every access of every active lane must fall
entirely inside one allocation; anything else is a fault naming the lane and the address.
Accesses are vectorised: lanes are located with one ``searchsorted`` over the sorted bases.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np


class MemoryFault(Exception):
    """An access outside every allocation (or a bad map). ``lane`` is None for scalar/host
    accesses."""

    def __init__(self, message: str, *, lane: int | None = None, address: int | None = None):
        super().__init__(message)
        self.lane, self.address = lane, address


@dataclass(frozen=True)
class Allocation:
    base: int
    buf: np.ndarray  # uint8, 1-D, writable
    name: str
    device: int

    @property
    def end(self) -> int:
        return self.base + self.buf.size

    def describe(self) -> str:
        return f"{self.name!r} (device {self.device}, 0x{self.base:x}..0x{self.end:x})"


class Memory:
    """Global memory shared by every emulated device (peer buffers are just allocations)."""

    def __init__(self) -> None:
        self._allocs: list[Allocation] = []  # sorted by base
        self._bases: list[int] = []
        self._np_bases = np.zeros(0, dtype=np.uint64)
        self._np_ends = np.zeros(0, dtype=np.uint64)

    # -------------------------------------------------------------------- the map
    def map(self, base: int, buf: np.ndarray, name: str, device: int) -> None:
        """Map ``buf`` (writable 1-D uint8) at device address ``base``."""
        if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
            raise MemoryFault(f"map {name!r}: the buffer must be a 1-D uint8 numpy array")
        if not buf.flags.writeable or not buf.flags.c_contiguous:
            raise MemoryFault(f"map {name!r}: the buffer must be writable and contiguous")
        if buf.size == 0:
            raise MemoryFault(f"map {name!r}: the buffer is empty")
        if base <= 0 or base + buf.size > 1 << 64:
            raise MemoryFault(f"map {name!r}: base 0x{base:x} is not a valid device address")
        new = Allocation(int(base), buf, name, int(device))
        i = bisect.bisect_left(self._bases, new.base)
        for j in (i - 1, i):
            if 0 <= j < len(self._allocs):
                old = self._allocs[j]
                if old.base < new.end and new.base < old.end:
                    raise MemoryFault(f"map {new.describe()} overlaps the mapped {old.describe()}")
        self._allocs.insert(i, new)
        self._bases.insert(i, new.base)
        self._refresh()

    def unmap(self, base: int) -> None:
        i = bisect.bisect_left(self._bases, base)
        if i == len(self._bases) or self._bases[i] != base:
            raise MemoryFault(f"unmap: nothing is mapped at 0x{base:x}")
        del self._allocs[i], self._bases[i]
        self._refresh()

    def _refresh(self) -> None:
        self._np_bases = np.array(self._bases, dtype=np.uint64)
        self._np_ends = np.array([a.end for a in self._allocs], dtype=np.uint64)

    def allocations(self) -> list[Allocation]:
        return list(self._allocs)

    def find(self, addr: int, n: int) -> tuple[Allocation, int]:
        """The allocation holding ``[addr, addr + n)`` and the offset of ``addr`` in it."""
        i = bisect.bisect_right(self._bases, addr) - 1
        if i >= 0:
            a = self._allocs[i]
            if addr + n <= a.end:
                return a, addr - a.base
        raise MemoryFault(f"address 0x{addr:x} (+{n} bytes) is outside every allocation",
                          address=addr)  # fmt: skip

    # -------------------------------------------------------------------- host side
    def read(self, addr: int, n: int) -> bytes:
        a, off = self.find(addr, n)
        return a.buf[off : off + n].tobytes()

    def write(self, addr: int, data: bytes) -> None:
        a, off = self.find(addr, len(data))
        a.buf[off : off + len(data)] = np.frombuffer(data, dtype=np.uint8)

    # -------------------------------------------------------------------- lanes
    def locate(self, addrs: np.ndarray, active: np.ndarray, size: int) -> list[tuple]:
        """Group the active lanes' accesses by allocation: ``[(alloc, lanes, offsets)]``
        (``lanes`` an index array, ``offsets`` uint64 byte offsets in the allocation).
        Raises ``MemoryFault`` for the first active lane whose ``size`` bytes are not inside
        one allocation."""
        lanes = np.flatnonzero(active)
        if lanes.size == 0:
            return []
        a = addrs[lanes]
        idx = np.searchsorted(self._np_bases, a, side="right") - 1
        ok = idx >= 0
        safe = np.where(ok, idx, 0)
        if self._np_ends.size:
            ok &= a + np.uint64(size) <= self._np_ends[safe]
        else:
            ok[:] = False
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            lane, addr = int(lanes[bad]), int(a[bad])
            raise MemoryFault(
                f"lane {lane}: address 0x{addr:x} (+{size} bytes) is outside every allocation"
                + self._near(addr),
                lane=lane,
                address=addr,
            )
        first = safe[0]
        if (safe == first).all():
            al = self._allocs[int(first)]
            return [(al, lanes, a - np.uint64(al.base))]
        out = []
        for k in np.unique(safe):
            sel = safe == k
            al = self._allocs[int(k)]
            out.append((al, lanes[sel], a[sel] - np.uint64(al.base)))
        return out

    def _near(self, addr: int) -> str:
        i = bisect.bisect_right(self._bases, addr) - 1
        if i >= 0:
            a = self._allocs[i]
            return f" (it is {addr - a.end} bytes past the end of {a.describe()})"
        return ""

    def gather(self, addrs: np.ndarray, active: np.ndarray, size: int) -> np.ndarray:
        """``size`` bytes at each active lane's address: uint8 (64, size), zero for inactive
        lanes."""
        out = np.zeros((addrs.shape[0], size), dtype=np.uint8)
        span = np.arange(size, dtype=np.uint64)
        for al, lanes, offs in self.locate(addrs, active, size):
            out[lanes] = al.buf[offs[:, None] + span]
        return out

    def scatter(self, addrs: np.ndarray, active: np.ndarray, data: np.ndarray) -> None:
        """Write ``data`` (uint8 (64, size)) at each active lane's address; lanes are applied
        in increasing order (a later lane wins an overlap)."""
        size = data.shape[1]
        span = np.arange(size, dtype=np.uint64)
        for al, lanes, offs in self.locate(addrs, active, size):
            al.buf[offs[:, None] + span] = data[lanes]
