"""A layout the kernels cannot be built for is refused by ``build`` before any compile, with the
very lines ``layouts validate`` prints (``file: field: rule`` with the numbers), exit 2; and a
count the plans accept builds (the slow sample in ``tests/kernels/test_cta_counts.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mono_aot.spec.layouts import shipped_layout_dir

from .conftest import run_cli

pytestmark = pytest.mark.slow  # real process clusters or compiles


def _layout(tmp_path: Path, ctas: int) -> Path:
    text = (shipped_layout_dir() / "minimax-m3.1-dspark-tp4.toml").read_text()
    text = text.replace("ctas = 304", f"ctas = {ctas}")
    path = tmp_path / f"mi-{ctas}.toml"
    path.write_text(text)
    return path


def test_build_and_validate_refuse_an_unbuildable_count_with_the_same_line(tmp_path):
    lay = _layout(tmp_path, 24)  # gfx942: the all-reduce tile outgrows 64 KiB of LDS
    env = {"MONO_AOT_CACHE_DIR": str(tmp_path / "cache")}
    store = tmp_path / "store"
    v = run_cli("layouts", "validate", str(lay), env_extra=env)
    b = run_cli("build", "--store", str(store), "--layout", str(lay), env_extra=env)
    assert v.returncode == 2 and b.returncode == 2, (v.stderr, b.stderr)
    want = (
        f"{lay}: targets.gfx942.ctas: 24 workgroups, wide kernel: 75264 bytes of LDS exceed the "
        "CU's 65536: GEMV/attention 17408 + rstd 256 + all-reduce tile 56 tokens x 256 rows x 4"
    )
    for p in (v, b):
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and want in lines[0], p.stderr  # wide only: narrow fits at 24
        assert "Traceback" not in p.stdout + p.stderr
    assert [ln for ln in v.stderr.splitlines() if ln] == [ln for ln in b.stderr.splitlines() if ln]
    assert not (store / "v1" / "blobs").exists() or not any((store / "v1" / "blobs").iterdir())


def test_a_count_the_plans_accept_validates(tmp_path):
    v = run_cli("layouts", "validate", str(_layout(tmp_path, 228)))
    assert v.returncode == 0, v.stderr
