"""Session builds for the pack tests: real compiles, real wheels, each made once per session.

- ``pack_build``: ``mono-aot pack --arch gfx942`` of the shipped layout into a fresh store (two
  real kernel compiles), its JSON report and the wheel;
- ``mono_aot_wheel``: the ``mono-aot`` wheel, made by the ``build`` front end from this checkout;
- ``skewed_pack``: a pack made by a copy of this checkout whose kernel sources differ by one
  comment (one real compile: a one-variant layout), as a pack from another release would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "layouts" / "minimax-m3.1-dspark-tp4.toml"


def mono_aot(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 1800
) -> subprocess.CompletedProcess:
    """``python -m mono_aot ARGS`` in a fresh process of this venv."""
    return subprocess.run(
        [sys.executable, "-m", "mono_aot", *map(str, args)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def clean_env(top: Path, **extra: str) -> dict[str, str]:
    """This environment with the store variables pointed into ``top`` (the user's cache is
    never touched)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONO_AOT_")}
    env["MONO_AOT_CACHE_DIR"] = str(top / "cache")
    env.update(extra)
    return env


def one_variant_layout(path: Path, name: str = "skew-tp4") -> Path:
    """The shipped geometry with ``wide_base = 1`` (the wide kernel only) for gfx942 only."""
    text = SHIPPED.read_text()
    assert "wide_base = 3" in text and "[targets.gfx950]" in text
    text = text.replace("wide_base = 3", "wide_base = 1")
    text = text[: text.index("[targets.gfx950]")]
    out = path / f"{name}.toml"
    out.write_text(text)
    return out


@pytest.fixture(scope="session")
def pack_build(tmp_path_factory) -> SimpleNamespace:
    top = tmp_path_factory.mktemp("pack")
    store, out = top / "store", top / "dist"
    p = mono_aot(
        "pack", "--arch", "gfx942", "--store", store, "--out", out, "-j", "2", "--json",
        env=clean_env(top),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    (wheel,) = doc["wheels"]
    return SimpleNamespace(top=top, store=store, out=out, doc=doc, wheel=Path(wheel["wheel"]))


@pytest.fixture(scope="session")
def mono_aot_wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mono-aot-wheel")
    manifest = REPO / "mono_aot" / "_kernel_sources.json"
    existed = manifest.exists()
    p = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    assert manifest.exists() == existed, "the build hook wrote into the checkout"
    (wheel,) = out.glob("mono_aot-*.whl")
    return wheel


@pytest.fixture(scope="session")
def skewed_pack(tmp_path_factory) -> SimpleNamespace:
    top = tmp_path_factory.mktemp("skew")
    src = top / "src"
    shutil.copytree(
        REPO / "mono_aot",
        src / "mono_aot",
        ignore=shutil.ignore_patterns("__pycache__", "_kernel_sources.json"),
    )
    shutil.copytree(REPO / "layouts", src / "layouts")
    kernel = src / "mono_aot" / "kernels" / "__init__.py"
    kernel.write_text(kernel.read_text() + "\n# an edit this test's installed mono-aot lacks\n")
    layout = one_variant_layout(top)
    p = mono_aot(
        "pack", "--arch", "gfx942", "--layout", layout, "--store", top / "store",
        "--out", top / "dist", "--json",
        env=clean_env(top, PYTHONPATH=str(src)), cwd=top,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    (wheel,) = doc["wheels"]
    return SimpleNamespace(top=top, layout=layout, doc=doc, wheel=Path(wheel["wheel"]))
