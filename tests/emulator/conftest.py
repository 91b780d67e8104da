"""The four shipped kernels, from the session's one compile of them (``shipped_compiles`` in
``tests/conftest.py``): the code object and FlyDSL's ISA listing of the same compile."""

from __future__ import annotations

import pytest

from mono_aot.compiler.compile import CompileResult

LAYOUT = "minimax-m3-dspark-tp4"
CASES = [(v, a) for a in ("gfx942", "gfx950") for v in ("narrow", "wide")]


@pytest.fixture(scope="session")
def shipped(shipped_compiles) -> dict[tuple[str, str], CompileResult]:
    return {case: shipped_compiles[case] for case in CASES}
