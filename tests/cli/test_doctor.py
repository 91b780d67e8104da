"""``mono-aot doctor`` on this machine: finds the ziglang linker, names stores and gaps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version


def doctor(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-m", "mono_aot", "doctor", *args],
        capture_output=True, text=True, timeout=120, env=full,
    )  # fmt: skip


def test_doctor_finds_the_ziglang_linker_and_prints_its_version(tmp_path):
    r = doctor(MONO_AOT_CACHE_DIR=str(tmp_path / "cache"))
    assert r.returncode == 0, r.stderr
    assert "linker  LLD " in r.stdout and "(ziglang:" in r.stdout
    assert f"store   user cache: {tmp_path / 'cache'}  writable (not created yet)" in r.stdout
    assert f"flydsl  {version('flydsl')}" in r.stdout


def test_doctor_json_lists_store_layers_in_order(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    r = doctor("--json", MONO_AOT_PATH=f"{a}:{b}", MONO_AOT_CACHE_DIR=str(tmp_path / "c"))
    doc = json.loads(r.stdout)
    assert [s["layer"] for s in doc["stores"]] == ["MONO_AOT_PATH", "MONO_AOT_PATH", "user cache"]
    assert [s["root"] for s in doc["stores"]] == [str(a), str(b), str(tmp_path / "c")]
    assert doc["stores"][0]["exists"] and not doc["stores"][1]["exists"]
    assert doc["linker"]["source"] == "ziglang" and len(doc["linker"]["sha256"]) == 64
    assert doc["env"]["MONO_AOT_PATH"] == f"{a}:{b}"


def test_doctor_build_check_fails_when_the_explicit_linker_is_broken(tmp_path):
    old = tmp_path / "ld.lld"
    old.write_text('#!/bin/sh\necho "LLD 16.0.6"\n')
    old.chmod(0o755)
    r = doctor("--build", MONO_AOT_LLD=str(old), MONO_AOT_CACHE_DIR=str(tmp_path / "c"))
    assert r.returncode == 1
    assert "linker  missing" in r.stdout and "LLD 16" in r.stdout
    assert "missing ld.lld >= 19 (needed to build): install the build extra" in r.stdout


def test_doctor_names_a_file_where_a_store_root_should_be(tmp_path):
    f = tmp_path / "afile"
    f.write_text("not a store")
    r = doctor(MONO_AOT_PATH=f"{f}::", MONO_AOT_CACHE_DIR=str(f / "cache"))
    assert r.returncode == 0, r.stderr
    assert f"store   MONO_AOT_PATH: {f}  unusable ({f} is not a directory)" in r.stdout
    assert f"store   user cache: {f / 'cache'}  unusable ({f} is not a directory)" in r.stdout
    assert f"missing a writable user cache ({f / 'cache'}: {f} is not a directory)" in r.stdout
    assert "not created yet" not in r.stdout  # empty MONO_AOT_PATH parts are no layers
    doc = json.loads(
        doctor("--json", MONO_AOT_PATH=str(f), MONO_AOT_CACHE_DIR=str(tmp_path)).stdout
    )
    assert doc["stores"][0]["not_a_directory"] == str(f) and not doc["stores"][0]["writable"]
