"""A kernel's bytes do not depend on how or from where its build was started.

The same real kernel (the tiny test layout's gfx942 narrow one) is built into empty stores by
``mono-aot build`` started four ways: the venv's ``python`` by a relative path, its
``python3.11`` by an absolute path, the ``mono-aot`` console script, and the venv's ``python``
reached through a directory of another path length (a venv at a different location), each from
another working directory. Before the worker re-executed as a canonical process
(``mono_aot.compiler.worker.enter_canonical_process``), ``python`` and ``python3.11`` gave
different blobs for this kernel.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from .conftest import build_tiny_as_a_user, store_files

pytestmark = pytest.mark.slow


def test_blob_is_the_same_whichever_interpreter_path_and_venv_location(tmp_path):
    venv = Path(sys.prefix)
    if venv == Path(sys.base_prefix) or not (venv / "bin" / "mono-aot").exists():
        pytest.skip("needs the tests to run in the project's venv (make test)")
    elsewhere = tmp_path / "a-venv-at-another-location-with-a-longer-path"
    elsewhere.mkdir()
    (elsewhere / "venv").symlink_to(venv, target_is_directory=True)
    starts = {
        "relative python": ([os.path.relpath(venv / "bin" / "python", venv.parent)], venv.parent),
        "absolute python3.11": ([str(venv / "bin" / "python3.11")], tmp_path),
        "console script": ([str(venv / "bin" / "mono-aot")], Path("/")),
        "venv elsewhere": ([str(elsewhere / "venv" / "bin" / "python")], elsewhere),
    }
    blobs, inputs = {}, {}
    for name, (argv, cwd) in starts.items():
        if argv[0].endswith("python") or argv[0].endswith("python3.11"):
            argv = [*argv, "-m", "mono_aot"]
        store = tmp_path / name.replace(" ", "-") / "store"
        doc = build_tiny_as_a_user(argv, store, "--arch", "gfx942", "--variant", "narrow", cwd=cwd)
        assert doc["summary"]["failed"] == 0 and doc["summary"]["built"] == 1, (name, doc)
        found = {rel: d for rel, d in store_files(store).items() if "/blobs/" in rel}
        assert len(found) == 1, (name, sorted(found))
        blobs[name] = next(iter(found.values()))
        entries = [d for rel, d in store_files(store).items() if "/entries/" in rel]
        inputs[name] = json.loads(entries[0])["entry"]["build_inputs"]
        assert inputs[name]["options"]["address_space"] == "fixed"
    first = next(iter(starts))
    for name in starts:
        assert blobs[name] == blobs[first], f"{name} built other bytes than {first}"
        assert inputs[name] == inputs[first], f"{name} recorded other build inputs than {first}"
