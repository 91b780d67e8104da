"""The installed-package digest cache (``mono_aot.compiler.inputs``): a shortcut that never
changes the answer. A changed install is hashed again; corrupt or foreign cache files are
ignored and replaced; recently modified files are not cached (timestamp resolution)."""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path

import pytest

from mono_aot.compiler import inputs
from mono_aot.compiler.inputs import hash_installed_package

digest = inputs.installed_package_digest.__wrapped__  # no per-process cache


def _fake_dist(site: Path, body: bytes = b"X = 1\n") -> Path:
    pkg = site / "fakedigestpkg"
    info = site / "fakedigestpkg-1.0.dist-info"
    pkg.mkdir(parents=True)
    info.mkdir()
    (pkg / "__init__.py").write_bytes(body)
    (pkg / "data.bin").write_bytes(os.urandom(4096))
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakedigestpkg\nVersion: 1.0\n")
    rows = ["fakedigestpkg/__init__.py,,", "fakedigestpkg/data.bin,,"]
    rows += ["fakedigestpkg-1.0.dist-info/METADATA,,", "fakedigestpkg-1.0.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    return pkg


@pytest.fixture
def fake(tmp_path, monkeypatch):
    site = tmp_path / "site"
    pkg = _fake_dist(site)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("MONO_AOT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(inputs, "_RACY_SECONDS", 0.0)
    return pkg


def _cache_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / inputs.DIGEST_CACHE_DIR).glob("*.json"))


def test_a_hit_reads_no_file_and_equals_the_full_hash(fake, tmp_path, monkeypatch):
    first = digest("fakedigestpkg")
    assert first == hash_installed_package("fakedigestpkg")
    assert len(_cache_files(tmp_path)) == 1

    def no_hashing(*a, **k):
        raise AssertionError("hashed although the install did not change")

    monkeypatch.setattr(inputs, "_hash_rows", no_hashing)
    assert digest("fakedigestpkg") == first


def test_a_changed_file_is_hashed_again(fake, tmp_path):
    first = digest("fakedigestpkg")
    init = fake / "__init__.py"
    st = init.stat()
    init.write_bytes(b"X = 2\n")  # same size; mtime put back: only ctime tells
    os.utime(init, ns=(st.st_atime_ns, st.st_mtime_ns))
    second = digest("fakedigestpkg")
    assert second != first
    assert second == hash_installed_package("fakedigestpkg")


def test_a_reinstall_is_hashed_again(fake, tmp_path):
    first = digest("fakedigestpkg")
    data = fake / "data.bin"
    tmp = fake / "data.bin.new"
    tmp.write_bytes(os.urandom(4096))
    os.replace(tmp, data)  # a new inode, as pip writes files
    second = digest("fakedigestpkg")
    assert second != first and second == hash_installed_package("fakedigestpkg")


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"garbage",
        b"[]",
        b'{"body": {}, "body_sha256": "0"}',
        b"\xff\xfe" * 10,
        b"{" * 100_000,
    ],
)
def test_corrupt_cache_contents_are_ignored_and_replaced(fake, tmp_path, content):
    want = digest("fakedigestpkg")
    [cache] = _cache_files(tmp_path)
    cache.write_bytes(content)
    assert digest("fakedigestpkg") == want
    doc = json.loads(cache.read_bytes())
    assert doc["body"]["result"]["sha256"] == want[1]


def test_a_forged_result_with_a_wrong_checksum_is_ignored(fake, tmp_path):
    want = digest("fakedigestpkg")
    [cache] = _cache_files(tmp_path)
    doc = json.loads(cache.read_bytes())
    doc["body"]["result"]["sha256"] = "0" * 64
    cache.write_text(json.dumps(doc))
    assert digest("fakedigestpkg") == want


def test_another_installs_cache_is_not_used(fake, tmp_path):
    want = digest("fakedigestpkg")
    [cache] = _cache_files(tmp_path)
    doc = json.loads(cache.read_bytes())
    doc["body"]["fingerprint"] = "f" * 64  # valid in form, for another install
    doc["body"]["result"]["sha256"] = "1" * 64
    doc["body_sha256"] = inputs.sha256_hex(inputs.canonical_json(doc["body"]))
    cache.write_text(json.dumps(doc))
    assert digest("fakedigestpkg") == want


def test_recently_modified_files_are_not_cached(fake, tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "_RACY_SECONDS", 3600.0)
    assert digest("fakedigestpkg") == hash_installed_package("fakedigestpkg")
    assert _cache_files(tmp_path) == []


def test_an_unwritable_cache_only_costs_the_hashing(fake, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MONO_AOT_CACHE_DIR", str(blocker / "cache"))
    assert digest("fakedigestpkg") == hash_installed_package("fakedigestpkg")


def test_the_real_flydsl_digest_is_unchanged_by_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MONO_AOT_CACHE_DIR", str(tmp_path / "cache"))
    try:
        metadata.distribution("flydsl")
    except metadata.PackageNotFoundError:
        pytest.skip("FlyDSL is not installed")
    want = hash_installed_package("flydsl")
    assert digest("flydsl") == want
    assert digest("flydsl") == want
