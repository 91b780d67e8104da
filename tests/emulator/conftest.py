"""The kernels the emulator tests decode, each from the session's one compile of its layout
(``shipped_compiles`` and ``tiny_compiles`` in ``tests/conftest.py``): the code object and
FlyDSL's ISA listing of the same compile; and the wrong-index build of the small layout
(``wrong_index_build``, ``tests/emulator/wrong_index.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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


def stored_kernels(
    tmp_path_factory: pytest.TempPathFactory,
    layout: str,
    arch: str,
    variants: Sequence[str] = (),
) -> tuple[Path, dict]:
    """``layout``'s kernels for ``arch`` built by ``mono-aot build`` into a store
    (``MONO_AOT_TEST_STORE`` when set: the build is then a no-op for keys already there): the
    store root and each variant's verified hit, by variant."""
    from mono_aot.keys import served_key
    from mono_aot.spec.layouts import resolve_layout
    from mono_aot.store import Store

    root = Path(os.environ.get("MONO_AOT_TEST_STORE") or tmp_path_factory.mktemp("store"))
    cmd = [sys.executable, "-m", "mono_aot", "build", "--layout", layout, "--arch", arch,
           "--store", str(root)]  # fmt: skip
    for v in variants:
        cmd += ["--variant", v]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    lay = resolve_layout(layout)
    hits = {v: Store.at(root).lookup(served_key(v, lay, arch)) for v in variants or lay.variants()}
    assert all(h is not None for h in hits.values()), hits
    return root, hits


def emulate_env(tmp_path: Path, stores: Sequence[Path]) -> dict[str, str]:
    """The environment of a ``mono-aot emulate`` run on prebuilt kernels: ``stores`` served,
    a cache of its own under ``tmp_path`` (nothing is built: all prebuilt) and strict mode."""
    return {
        **os.environ,
        "MONO_AOT_PATH": os.pathsep.join(map(str, stores)),
        "MONO_AOT_CACHE_DIR": str(tmp_path / "cache"),
        "MONO_AOT_STRICT": "1",
    }


@dataclass(frozen=True)
class Result:
    """A finished ``mono-aot emulate --json``: exit code, the document, stderr."""

    code: int
    doc: dict
    err: str

    @classmethod
    def of(cls, code: int, out: str, err: str) -> Result:
        return cls(code, json.loads(out) if out.strip() else {}, err)

    def why(self) -> str:
        return self.err + json.dumps(self.doc, indent=1)

    def only_case(self, check: str) -> dict:
        """The one check's one case, after asserting it is the check asked for."""
        (c,) = self.doc["checks"]
        assert c["check"] == check, self.why()
        (case,) = c["cases"]
        return case
