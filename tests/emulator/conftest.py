"""The kernels the emulator tests decode, each from the session's one compile of its layout
(``shipped_compiles`` and ``tiny_compiles`` in ``tests/conftest.py``): the code object and
FlyDSL's ISA listing of the same compile; and the wrong-index build of the small layout
(``wrong_index_build``, ``tests/emulator/wrong_index.py``)."""

from __future__ import annotations

import pytest

from mono_aot.compiler.compile import CompileResult
from tests.conftest import SHIPPED_LAYOUT, TINY_LAYOUT
from tests.emulator.wrong_index import WrongIndexBuild, build_wrong_index

LAYOUT = SHIPPED_LAYOUT
CASES = [(v, a) for a in ("gfx942", "gfx950") for v in ("narrow", "wide")]
# (layout, variant, arch) of every kernel the decoder checks itself on: the shipped layout's
# four and the small layout's four
LAYOUT_CASES = [(lay, v, a) for lay in (SHIPPED_LAYOUT, TINY_LAYOUT) for v, a in CASES]


@pytest.fixture(scope="session")
def shipped(shipped_compiles) -> dict[tuple[str, str], CompileResult]:
    return {case: shipped_compiles[case] for case in CASES}


def compiled(request: pytest.FixtureRequest, layout: str) -> dict[tuple[str, str], CompileResult]:
    """The session's compiles of ``layout`` (a test of one layout compiles only that one)."""
    name = {SHIPPED_LAYOUT: "shipped_compiles", TINY_LAYOUT: "tiny_compiles"}[layout]
    return request.getfixturevalue(name)


@pytest.fixture(scope="session")
def wrong_index_build(tmp_path_factory: pytest.TempPathFactory) -> WrongIndexBuild:
    """The small layout's narrow and wide gfx942 kernels built by the wrong-index provider into
    a store of their own, once per session: ``.store`` (the root), ``.keys[(arch, variant)]``,
    ``.code_object(arch, variant)``. The emulator's check must fail on them."""
    return build_wrong_index(tmp_path_factory.mktemp("wrong-index-store"))
