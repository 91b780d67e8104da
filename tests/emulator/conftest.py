"""The four shipped kernels (narrow and wide of the shipped layout, for gfx942 and gfx950), each
compiled once per test session, two at a time, in the build's own worker subprocess: one compile
gives the code object and FlyDSL's ISA listing of it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mono_aot.compiler.compile import CompileResult, compile_kernel
from mono_aot.keys import real_provider
from mono_aot.spec.layouts import resolve_layout

LAYOUT = "minimax-m3-dspark-tp4"
CASES = [(v, a) for a in ("gfx942", "gfx950") for v in ("narrow", "wide")]


@pytest.fixture(scope="session")
def shipped(tmp_path_factory) -> dict[tuple[str, str], CompileResult]:
    lay = resolve_layout(LAYOUT)
    prov = real_provider()
    root = tmp_path_factory.mktemp("emulator-shipped")

    def one(job: tuple[str, str]) -> tuple[tuple[str, str], CompileResult]:
        variant, arch = job
        return job, compile_kernel(prov, variant, lay, arch, Path(root / f"{variant}-{arch}"))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, CASES))
