"""Shared helpers for the build tests: fixture providers, running the CLI, reading stores."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mono_aot.compiler.inputs import directory_provider

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DEMO = f"{FIXTURES / 'demo'}:demo_kernels"


def provider_spec(name: str) -> str:
    return f"{FIXTURES / name}:{name}_kernels"


def demo_provider():
    return directory_provider(FIXTURES / "demo", "demo_kernels")


def run_cli(
    *args: str,
    env_extra: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 900,
) -> subprocess.CompletedProcess:
    """``python -m mono_aot ARGS`` in a child process, with the user cache kept out of the way."""
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "mono_aot", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def build_json(
    store: Path, *args: str, provider: str = DEMO, expect: int | None = 0, cwd: Path | None = None
) -> dict:
    """Run ``mono-aot build --json`` into ``store``; return the parsed document."""
    p = run_cli(
        "build",
        "--provider",
        provider,
        "--store",
        str(store),
        "--json",
        *args,
        env_extra={"MONO_AOT_CACHE_DIR": str(store.parent / "unused-user-cache")},
        cwd=cwd,
    )
    if expect is not None:
        assert p.returncode == expect, (
            f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
        )
    return json.loads(p.stdout)


def store_files(root: Path) -> dict[str, bytes]:
    """Every published file of a store (entries and blobs), by relative path."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and ("/entries/" in f"/{rel}" or "/blobs/" in f"/{rel}"):
            out[rel] = p.read_bytes()
    return out


def entry_docs(root: Path) -> dict[str, dict]:
    return {
        rel: json.loads(data)["entry"]
        for rel, data in store_files(root).items()
        if rel.endswith(".json") and "/entries/" in f"/{rel}"
    }


def without_timestamps(entry: dict) -> dict:
    doc = json.loads(json.dumps(entry))
    doc["provenance"].pop("built_at")
    doc["provenance"].pop("build_seconds")
    return doc


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory) -> tuple[Path, dict]:
    """The demo provider built for both variants on both archs with -j 2 (4 compiles), once."""
    root = tmp_path_factory.mktemp("demo-store") / "store"
    doc = build_json(root, "-j", "2")
    return root, doc


@pytest.fixture
def demo_store_copy(demo_store, tmp_path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(demo_store[0], root)
    return root


TINY = Path(__file__).resolve().parents[2] / "layouts" / "test" / "emulator-tiny-tp4.toml"


def build_tiny_as_a_user(
    mono_aot: list[str], store: Path, *args: str, cwd: Path | None = None
) -> dict:
    """``mono-aot build --layout TINY --store STORE --json ARGS`` started by the argv prefix
    ``mono_aot`` (an interpreter with ``-m mono_aot``, or the console script), with the venv's
    own install (no PYTHONPATH) and the user cache kept out of the way; its JSON document."""
    env = dict(os.environ, MONO_AOT_CACHE_DIR=str(store.parent / "unused-user-cache"))
    env.pop("PYTHONPATH", None)
    argv = [*mono_aot, "build", "--layout", str(TINY), "--store", str(store), "--json", *args]
    p = subprocess.run(
        argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=3600,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert p.returncode == 0, f"{mono_aot}: exit {p.returncode}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout)
