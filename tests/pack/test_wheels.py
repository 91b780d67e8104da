"""The two wheels, as built for real: the pack (real kernels for gfx942, hatchling through the
``build`` front end) and ``mono-aot`` itself (its build hook's kernel source manifest)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from email.parser import Parser

import pytest

from mono_aot import __version__
from mono_aot.keys import served_key
from mono_aot.keys.sources import MANIFEST_NAME, kernel_source_digest, parse_kernel_sources
from mono_aot.spec.layouts import resolve_layout
from mono_aot.store import Store, decode_entry
from tests.pack.conftest import clean_env, mono_aot

pytestmark = pytest.mark.slow
MOD = "mono_aot_kernels_gfx942"
FIXED_TIME = (2020, 2, 2, 0, 0, 0)


def test_pack_builds_what_is_missing_and_reports_the_wheel(pack_build):
    doc = pack_build.doc
    assert [(r["variant"], r["status"], r["compiled"]) for r in doc["results"]] == [
        ("narrow", "built", True),
        ("wide", "built", True),
    ]
    (w,) = doc["wheels"]
    assert pack_build.wheel.name == f"{MOD}-{__version__}-py3-none-any.whl"
    assert pack_build.wheel.parent == pack_build.out
    assert w["size"] == pack_build.wheel.stat().st_size
    assert w["sha256"] == hashlib.sha256(pack_build.wheel.read_bytes()).hexdigest()
    assert not [p for p in pack_build.out.iterdir() if p.name.startswith(".tmp-")]


def test_rebuilding_from_the_same_store_gives_a_byte_identical_wheel(pack_build, tmp_path):
    out = tmp_path / "again"
    p = mono_aot(
        "pack", "--arch", "gfx942", "--store", pack_build.store, "--out", out,
        env=clean_env(tmp_path),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert [x.split()[0] for x in lines[:2]] == ["hit", "hit"]  # nothing was compiled
    again = out / pack_build.wheel.name
    size = again.stat().st_size
    assert lines[-1] == f"{again}  {size} bytes ({size / 1024:.1f} KiB, 2 entries)"
    assert again.read_bytes() == pack_build.wheel.read_bytes()


def test_the_pack_wheel_holds_a_verified_read_only_store_and_its_entry_point(pack_build, tmp_path):
    with zipfile.ZipFile(pack_build.wheel) as z:
        infos = z.infolist()
        names = [i.filename for i in infos]
        files = {i.filename: z.read(i) for i in infos}
    dist_info = f"{MOD}-{__version__}.dist-info/"
    assert {i.date_time for i in infos} == {FIXED_TIME}
    assert names == sorted(n for n in names if not n.startswith(dist_info)) + [
        f"{dist_info}{x}" for x in ("METADATA", "WHEEL", "entry_points.txt", "RECORD")
    ]
    meta = Parser().parsestr(files[f"{dist_info}METADATA"].decode())
    assert meta["Name"] == "mono-aot-kernels-gfx942" and meta["Version"] == __version__
    assert meta.get_all("Requires-Dist") == [f"mono-aot=={__version__}"]
    assert files[f"{dist_info}entry_points.txt"].decode().split() == [
        "[mono_aot.packs]", "gfx942", "=", f"{MOD}:STORE_ROOT",
    ]  # fmt: skip
    assert b"Root-Is-Purelib: true" in files[f"{dist_info}WHEEL"]

    # the store inside, unpacked: every entry and blob verifies, under the served keys
    root = tmp_path / "unpacked"
    with zipfile.ZipFile(pack_build.wheel) as z:
        z.extractall(root)
    store_root = root / MOD / "store"
    index = json.loads((store_root / "pack.json").read_text())
    lay = resolve_layout("minimax-m3.1-dspark-tp4")
    want = {served_key(v, lay, "gfx942"): v for v in lay.variants()}
    assert {e["key"]: e["variant"] for e in index["entries"]} == want
    assert (index["arch"], index["mono_aot"], index["kernel_sources"]) == (
        "gfx942", __version__, kernel_source_digest(),
    )  # fmt: skip
    assert index["layouts"] == [{"name": lay.name, "digest": lay.digest}]
    store = Store.at(store_root, writable=False)
    source = Store.at(pack_build.store, writable=False)
    for e in index["entries"]:
        hit = store.lookup(e["key"])
        assert hit is not None and hit.entry.blob.sha256 == e["blob_sha256"]
        assert hit.data == source.lookup(e["key"]).data
        assert decode_entry(hit.entry_path.read_bytes(), e["key"]).variant == e["variant"]
    stored = {p.relative_to(store_root).as_posix() for p in store_root.rglob("*") if p.is_file()}
    assert len(stored) == 5 and all(x == "pack.json" or x.startswith("v1/") for x in stored)
    init = (root / MOD / "__init__.py").read_text()
    assert f"KERNEL_SOURCES = {kernel_source_digest()!r}" in init


def test_the_mono_aot_wheel_carries_the_manifest_and_no_binaries(mono_aot_wheel):
    with zipfile.ZipFile(mono_aot_wheel) as z:
        names = z.namelist()
        manifest = json.loads(z.read(f"mono_aot/{MANIFEST_NAME}"))
    assert manifest["sha256"] == kernel_source_digest()
    assert manifest["files"] == sorted(rel for rel, _ in parse_kernel_sources())
    assert "mono_aot/_layouts/minimax-m3.1-dspark-tp4.toml" in names
    # sources and data only (the C source is the stand-in HIP library `mono-aot bench` compiles)
    allowed = (".py", ".c", ".json", ".toml", "METADATA", "WHEEL", "RECORD", "entry_points.txt")
    assert [n for n in names if not n.endswith(allowed)] == []
    assert not [n for n in names if "/v1/" in n or n.startswith(("tests/", "layouts/"))]
