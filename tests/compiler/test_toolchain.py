"""Linker discovery order, version gate, fingerprint and the ROCM_PATH folder for FlyDSL."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from mono_aot.compiler import toolchain
from mono_aot.spec.errors import ToolchainError


def fake_lld(folder: Path, version: str, name: str = "ld.lld") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(f'#!/bin/sh\necho "LLD {version} (compatible with GNU linkers)"\n')
    p.chmod(0o755)
    return p


def env_with(**kw: str) -> dict[str, str]:
    env = {"PATH": os.defpath}
    env.update(kw)
    return env


def test_explicit_mono_aot_lld_wins(tmp_path):
    explicit = fake_lld(tmp_path / "explicit", "21.1.0")
    rocm = tmp_path / "rocm"
    fake_lld(rocm / "llvm" / "bin", "20.0.0")
    onpath = fake_lld(tmp_path / "bin", "22.0.0")
    linker = toolchain.find_linker(
        env_with(MONO_AOT_LLD=str(explicit), ROCM_PATH=str(rocm), PATH=str(onpath.parent))
    )
    assert linker.source == "MONO_AOT_LLD" and linker.major == 21


def test_broken_explicit_linker_is_an_error_not_a_fallback(tmp_path):
    old = fake_lld(tmp_path / "old", "16.0.6")
    with pytest.raises(ToolchainError, match="LLD 16; code object v6 needs LLD 19"):
        toolchain.find_linker(env_with(MONO_AOT_LLD=str(old)))
    with pytest.raises(ToolchainError, match="no such file"):
        toolchain.find_linker(env_with(MONO_AOT_LLD=str(tmp_path / "absent")))


def test_rocm_path_comes_before_path(tmp_path):
    rocm = tmp_path / "rocm"
    fake_lld(rocm / "llvm" / "bin", "20.0.0")
    onpath = fake_lld(tmp_path / "bin", "22.0.0")
    linker = toolchain.find_linker(env_with(ROCM_PATH=str(rocm), PATH=str(onpath.parent)))
    assert linker.source == "ROCM_PATH" and linker.major == 20


def test_too_old_ld_lld_on_path_is_skipped_for_ziglang(tmp_path):
    old = fake_lld(tmp_path / "bin", "16.0.6")
    found = toolchain.discover(env_with(PATH=str(old.parent)))
    assert found.linker is not None and found.linker.source == "ziglang"
    assert found.linker.major >= toolchain.MIN_LLD_MAJOR
    assert any("LLD 16" in s for s in found.skipped)


def test_new_enough_ld_lld_on_path_is_used(tmp_path):
    onpath = fake_lld(tmp_path / "bin", "19.1.7")
    linker = toolchain.find_linker(env_with(PATH=str(onpath.parent)))
    assert linker.source == "PATH" and linker.version.startswith("LLD 19.1.7")


def test_missing_rocm_linker_is_skipped_with_a_reason(tmp_path):
    found = toolchain.discover(env_with(ROCM_PATH=str(tmp_path / "nothing")))
    assert any("ROCM_PATH" in s and "does not exist" in s for s in found.skipped)
    assert found.linker is not None


def test_nothing_found_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchain, "_ziglang_zig", lambda: None)
    old = fake_lld(tmp_path / "bin", "16.0.6")
    with pytest.raises(ToolchainError) as e:
        toolchain.find_linker(env_with(PATH=str(old.parent)))
    msg = str(e.value)
    assert "LLD 16" in msg and "ziglang" in msg and "MONO_AOT_LLD" in msg


def test_not_a_linker_is_rejected(tmp_path):
    p = tmp_path / "ld.lld"
    p.write_text("#!/bin/sh\necho hello\n")
    p.chmod(0o755)
    with pytest.raises(ToolchainError, match="is not ld.lld"):
        toolchain.find_linker(env_with(MONO_AOT_LLD=str(p)))


def test_fingerprint_is_the_sha256_of_the_binary_that_runs(tmp_path):
    a = fake_lld(tmp_path / "a", "21.0.0")
    b = fake_lld(tmp_path / "b", "21.0.0")
    b.write_text(b.read_text() + "# another build\n")
    la = toolchain.find_linker(env_with(MONO_AOT_LLD=str(a)))
    lb = toolchain.find_linker(env_with(MONO_AOT_LLD=str(b)))
    assert la.sha256 == hashlib.sha256(a.read_bytes()).hexdigest()
    assert la.version == lb.version and la.identity() != lb.identity()


def test_ziglang_linker_really_links_code_object_v6_and_is_fingerprinted():
    found = toolchain.discover(env_with())
    linker = found.linker
    assert linker is not None and linker.source == "ziglang"
    assert linker.sha256 == hashlib.sha256(linker.binary.read_bytes()).hexdigest()


def test_prepared_rocm_dir_runs_the_linker(tmp_path):
    linker = toolchain.find_linker(env_with())
    root = toolchain.prepare_rocm_dir(linker, tmp_path / "tc")
    lld = root / "llvm" / "bin" / "ld.lld"
    out = subprocess.run([str(lld), "--version"], capture_output=True, text=True, check=True)
    assert linker.version in out.stdout
    # idempotent, and what it found through ROCM_PATH is the same linker
    toolchain.prepare_rocm_dir(linker, root)
    again = toolchain.find_linker(env_with(ROCM_PATH=str(root)))
    assert again.version == linker.version
