"""Get the GPU binary out of a FlyDSL artifact's state without running anything from it.

The build worker takes the state from the in-memory artifact of its one compile
(``CompiledArtifact.__getstate__``: the same dict FlyDSL pickles into its disk cache, which the
build never reads: loading a pickle runs code).

The state holds the lowered MLIR (``ir_zlib``, or ``_ir_text``/``ir_text`` in older versions).
Its ``gpu.binary`` op carries the code object as an MLIR-escaped string (``\\\\`` a backslash,
``\\XX`` a hex byte, anything else a literal byte); the host function shows the launch geometry.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Any


class ExtractError(ValueError):
    """FlyDSL's output is not what the build expects (no binary, several, a foreign global...)."""


def artifact_ir_text(state: dict[str, Any]) -> str:
    if "ir_zlib" in state:
        return zlib.decompress(state["ir_zlib"]).decode("utf-8")
    for k in ("ir_text", "_ir_text"):
        if isinstance(state.get(k), str):
            return state[k]
    raise ExtractError("the cache entry holds no MLIR text (no ir_zlib or ir_text)")


def unescape_mlir_string(text: str, start: int) -> tuple[bytes, int]:
    """Decode the MLIR string literal whose first character is ``text[start]``; return bytes and
    the index of the closing quote."""
    out = bytearray()
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return bytes(out), i
        if c == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt in ("\\", '"'):
                out += nxt.encode()
                i += 2
                continue
            hx = text[i + 1 : i + 3]
            if len(hx) == 2 and all(ch in "0123456789abcdefABCDEF" for ch in hx):
                out.append(int(hx, 16))
                i += 3
                continue
            raise ExtractError(f"bad escape {text[i : i + 3]!r} in an MLIR string at {i}")
        out += c.encode("utf-8")
        i += 1
    raise ExtractError("unterminated MLIR string")


_OBJECT_RE = re.compile(r"#gpu\.object<#rocdl\.target<([^>]*)>")
_CHIP_RE = re.compile(r'chip\s*=\s*"([^"]+)"')
_BIN_RE = re.compile(r'\bbin\s*=\s*"')


@dataclass(frozen=True)
class GpuObject:
    chip: str
    target_attrs: str  # the #rocdl.target<...> parameters as written
    binary: bytes


def gpu_objects(ir_text: str) -> list[GpuObject]:
    """Every ``#gpu.object`` with its ``bin`` in the module text, in order."""
    found = []
    for m in _OBJECT_RE.finditer(ir_text):
        attrs = m.group(1)
        chip = _CHIP_RE.search(attrs)
        b = _BIN_RE.search(ir_text, m.end())
        if b is None:
            raise ExtractError('a #gpu.object has no bin = "..." payload')
        data, _ = unescape_mlir_string(ir_text, b.end())
        found.append(GpuObject(chip.group(1) if chip else "", attrs, data))
    return found


_CONST_RE = re.compile(r"(%[\w.$-]+)\s*=\s*llvm\.mlir\.constant\((-?\d+)\s*:\s*[\w]+\)")
_LAUNCH_RE = re.compile(
    r"gpu\.launch_func\s*(?:<[^>]*>\s*)?@[\w.$-]+::@([\w.$-]+)\s+"
    r"blocks in \(([^)]*)\)\s+threads in \(([^)]*)\)"
    r"(?:\s*:\s*\w+)?"
    r"(?:\s+dynamic_shared_memory_size\s+(%[\w.$-]+))?"
)


@dataclass(frozen=True)
class LaunchInfo:
    kernel: str
    grid: tuple[int | None, int | None, int | None]  # None: not a constant
    block: tuple[int | None, int | None, int | None]
    dynamic_lds: int | None  # 0 when the launch passes none


def launches(ir_text: str) -> list[LaunchInfo]:
    """The host side's ``gpu.launch_func`` ops, SSA operands resolved to their constants."""
    consts = {m.group(1): int(m.group(2)) for m in _CONST_RE.finditer(ir_text)}

    def dims(s: str) -> tuple:
        vals = [consts.get(v.strip()) for v in s.split(",")]
        return tuple(vals + [1] * (3 - len(vals)))[:3]

    out = []
    for m in _LAUNCH_RE.finditer(ir_text):
        dyn = m.group(4)
        out.append(
            LaunchInfo(
                kernel=m.group(1),
                grid=dims(m.group(2)),
                block=dims(m.group(3)),
                dynamic_lds=0 if dyn is None else consts.get(dyn),
            )
        )
    return out
