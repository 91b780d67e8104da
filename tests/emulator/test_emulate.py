"""``mono-aot emulate`` end to end: the small layout's stored code objects on 4 emulated ranks,
bound by the runtime's runner, judged by the selftest's verdicts against the float64 reference
(``mono_aot/selftest/emulated.py``); and the wrong-index provider's build of the same kernels
(``tests/emulator/wrong_index.py``) fails the same check. Slow: the narrow step is about 20
million wave-instructions, a wide step of 2 requests about 7 million."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mono_aot.selftest.cases import TOLERANCE
from tests.conftest import TINY_LAYOUT
from tests.emulator.conftest import stored_kernels
from tests.emulator.wrong_index import PROVIDER_DIR, PROVIDER_MODULE

pytestmark = pytest.mark.slow
ARCH = "gfx942"


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small layout's real kernels for ``ARCH`` in a store."""
    return stored_kernels(tmp_path_factory, TINY_LAYOUT, ARCH)[0]


def emulate(tmp_path: Path, stores: list[Path], *args: str) -> tuple[int, dict, str]:
    env = {
        **os.environ,
        "MONO_AOT_PATH": os.pathsep.join(map(str, stores)),
        "MONO_AOT_CACHE_DIR": str(tmp_path / "cache"),  # nothing is built here: all prebuilt
        "MONO_AOT_STRICT": "1",
    }
    p = subprocess.run(
        [sys.executable, "-m", "mono_aot", "emulate", "--json", "--arch", ARCH, *args],
        capture_output=True, text=True, timeout=3600, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    doc = json.loads(p.stdout) if p.stdout.strip() else {}
    return p.returncode, doc, p.stderr


@pytest.mark.parametrize(
    ("variant", "requests"), [("narrow", "1"), ("wide", "2")], ids=["narrow", "wide"]
)
def test_a_step_passes_against_the_reference(tmp_path, tiny_store, variant, requests):
    """The narrow step (the VALU GEMV) and a wide step of 2 requests (the MFMA GEMM)."""
    code, doc, err = emulate(tmp_path, [tiny_store], "--check", variant, "--requests", requests)
    assert code == 0, err + json.dumps(doc, indent=1)
    (check,) = doc["checks"]
    assert check["check"] == variant and check["ok"]
    (case,) = check["cases"]
    assert case["max_rel_error"] <= TOLERANCE and case["kv_bad_bytes"] == 0
    assert case["health"] == ["ok"] * 4
    assert doc["instructions"] > 1_000_000  # the whole step ran, on every rank


def test_the_wrong_index_kernels_fail_the_same_check(tmp_path, tiny_store, wrong_index_build):
    # narrow: its request's short context (23 positions) leaves the chunk's tail zero, so the
    # shifted V rows change the output (0.24 here); the wide step's 255- and 256-position
    # contexts under the random model's near-uniform attention did not (see the README)
    code, doc, err = emulate(
        tmp_path, [tiny_store, wrong_index_build.store], "--check", "narrow",
        "--provider", f"{PROVIDER_DIR}:{PROVIDER_MODULE}",
    )  # fmt: skip
    assert code == 1, err + json.dumps(doc, indent=1)
    (check,) = doc["checks"]
    assert not check["ok"]
    (case,) = check["cases"]
    assert case["max_rel_error"] > TOLERANCE  # the output is judged, not only the cache
    assert case["health"] == ["ok"] * 4  # nothing faulted: only the index is wrong


def test_a_provider_without_a_build_is_refused(tmp_path, tiny_store):
    code, doc, err = emulate(
        tmp_path, [tiny_store], "--check", "narrow",
        "--provider", f"{PROVIDER_DIR}:{PROVIDER_MODULE}",
    )  # fmt: skip
    assert code == 2 and not doc
    assert f"--provider {PROVIDER_DIR}:{PROVIDER_MODULE}: no narrow kernel of this provider" in err
