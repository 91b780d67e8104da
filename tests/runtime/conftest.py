"""Fixtures of the runtime tests: the stand-in HIP library and the real artifacts.

The stand-in (``mono_aot/bench/stand_in_hip.c``, shipped because ``mono-aot bench`` compiles it
too) replaces only what is not here, the AMD GPU's
HIP runtime; every test that relies on it has a ``rocm``-marked counterpart that runs the same
path on a real device.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mono_aot

HERE = Path(__file__).parent
STAND_IN_SOURCE = Path(mono_aot.__file__).resolve().parent / "bench" / "stand_in_hip.c"
ARCHS = ("gfx942", "gfx950")
LAYOUT = "minimax-m3.1-dspark-tp4"


@pytest.fixture(scope="session")
def stand_in_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in ``libamdhip64.so``, compiled from C with the system compiler."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("the runtime tests need a C compiler (cc) to build the stand-in HIP library")
    out = tmp_path_factory.mktemp("stand-in-hip") / "libamdhip64.so"
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Werror",
            "-o",
            str(out),
            str(STAND_IN_SOURCE),
            "-lrt",
        ],
        check=True,
        timeout=120,
    )
    return out


class Calls:
    """The stand-in's call log (one JSON object per line)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def all(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def of(self, call: str) -> list[dict]:
        return [c for c in self.all() if c["call"] == call]

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def stand_in_env(lib: Path, log: Path, **extra: str) -> dict[str, str]:
    """Environment variables selecting the stand-in for a process (and for ``os.environ``)."""
    env = {"MONO_AOT_HIP_LIBRARY": str(lib), "MONO_AOT_STANDIN_LOG": str(log)}
    env.update(extra)
    return env


@pytest.fixture
def hip_env(stand_in_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Calls:
    """This process uses the stand-in (a gfx942 device with 304 CUs unless a test says else);
    modules loaded during the test are unloaded after it."""
    from mono_aot.runtime.loader import unload_all

    log = tmp_path / "hip-calls.jsonl"
    for k, v in stand_in_env(stand_in_lib, log).items():
        monkeypatch.setenv(k, v)
    for k in ("MONO_AOT_STANDIN_ARCH", "MONO_AOT_STANDIN_CUS", "MONO_AOT_STANDIN_FAIL",
              "MONO_AOT_STANDIN_OCCUPANCY", "MONO_AOT_STRICT", "MONO_AOT_PATH"):  # fmt: skip
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MONO_AOT_CACHE_DIR", str(tmp_path / "user-cache"))
    yield Calls(log)
    unload_all()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding the real narrow and wide code objects of the shipped layout for both
    archs, built by ``mono-aot build`` (``MONO_AOT_TEST_STORE`` names a store to reuse: the
    build is then a no-op for every key already there)."""
    root = Path(os.environ.get("MONO_AOT_TEST_STORE") or tmp_path_factory.mktemp("artifacts"))
    cmd = [sys.executable, "-m", "mono_aot", "build", "--layout", LAYOUT, "--store", str(root)]
    for a in ARCHS:
        cmd += ["--arch", a]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    return root


@pytest.fixture(scope="session")
def one_rank_group(tmp_path_factory: pytest.TempPathFactory):
    """A gloo group of this process alone: runner construction is collective (its agreement
    gathers over the TP CPU group), and single-process tests agree with themselves."""
    from datetime import timedelta

    import torch.distributed as dist

    if not dist.is_initialized():
        store = dist.FileStore(str(tmp_path_factory.mktemp("gloo") / "store"), 1)
        dist.init_process_group(
            "gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60)
        )
    return dist.group.WORLD
