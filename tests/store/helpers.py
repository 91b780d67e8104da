"""Synthetic entries for store tests: the store does not care what the bytes are."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

from mono_aot.store import Entry
from mono_aot.store.entry import BlobRef, ElfInfo, KernargSlot, Launch, Provenance, Resources


def rand_key(rng: random.Random | None = None) -> str:
    return (rng or random.Random()).randbytes(32).hex()


def make_entry(
    data: bytes,
    key: str,
    *,
    variant: str = "narrow",
    arch: str = "gfx942",
    layout: str = "test-tp4",
    flydsl: str = "0.4.2",
    hidden: int = 3072,
    built_at: str = "2026-01-01T00:00:00Z",
) -> Entry:
    return Entry(
        key=key,
        variant=variant,
        arch=arch,
        layout=layout,
        lookup_inputs={
            "schema": 1,
            "variant": variant,
            "arch": arch,
            "ctas": 304,
            "sources": "ab" * 32,
            "layout": {"name": layout, "hidden": hidden, "eps": 1e-6, "heads": [16, 1, 1]},
        },
        build_inputs={
            "flydsl": flydsl,
            "linker": {"version": "LLD 19.1.7", "sha256": "cd" * 32},
            "options": ["-O3"],
        },
        blob=BlobRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data)),
        symbol=f"mono_{variant}",
        launch=Launch(grid=304, block=256, dynamic_lds=0),
        kernarg_segment_size=16,
        kernargs=[
            KernargSlot(name="tab", offset=0, size=8, value_kind="by_value"),
            KernargSlot(name="n", offset=8, size=4, value_kind="by_value"),
        ],
        resources=Resources(
            vgpr=128,
            agpr=0,
            sgpr=64,
            lds=65536,
            scratch=0,
            vgpr_spill=0,
            sgpr_spill=0,
            wavefront_size=64,
            max_flat_workgroup_size=256,
            code_bytes=len(data),
        ),
        elf=ElfInfo(machine=224, osabi=64, abi_version=4, e_flags=0x54C),
        provenance=Provenance(
            mono_aot_version="0.1.0",
            flydsl_version=flydsl,
            linker_version="LLD 19.1.7",
            built_at=built_at,
            build_seconds=1.5,
        ),
    )


def make_pair(
    rng: random.Random, size: int = 4096, key: str | None = None, **kw
) -> tuple[Entry, bytes]:
    data = rng.randbytes(size)
    return make_entry(data, key or rand_key(rng), **kw), data


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its type, mode, size, mtime and ctime (not atime)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            st = os.lstat(p)
            out[str(p.relative_to(root))] = (
                st.st_mode,
                st.st_size,
                st.st_mtime_ns,
                st.st_ctime_ns,
                st.st_ino,
            )
    st = os.lstat(root)
    out["."] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    return out


REPO = Path(__file__).resolve().parents[2]


def run_cli(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = ""
) -> subprocess.CompletedProcess[str]:
    """``mono-aot ARGS`` in a real process (stdin is a pipe, not a terminal)."""
    return subprocess.run(
        [sys.executable, "-c", "from mono_aot.cli import main; main()", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=REPO,
        timeout=120,
    )


def worker(*args: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen[str]:
    """``python -m tests.store.worker ARGS`` as a real process."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.store.worker", *args],
        cwd=REPO,
        text=True,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **popen,
    )
