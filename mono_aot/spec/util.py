"""Small facts every package spells the same way: digests, canonical JSON, integer rounding."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

HEX64 = re.compile(r"^[0-9a-f]{64}$")  # a sha256 in lower-case hex: blob digests and keys


def canonical_json(doc: Any) -> str:
    """The one JSON spelling that is hashed: sorted keys, no spaces, no NaN, ASCII."""
    return json.dumps(
        doc, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=True
    )


def sha256_hex(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes, read in chunks (linkers and wheels can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as fp:
        for block in iter(lambda: fp.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def align_up(n: int, a: int) -> int:
    return ceil_div(n, a) * a
