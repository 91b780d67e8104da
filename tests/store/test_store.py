"""Layers, publishing, replacement, prefixes and packs, on real files."""

from __future__ import annotations

import json
import logging
import os
import random
import stat
import sys
import textwrap

import pytest

from mono_aot.spec.errors import BadInput
from mono_aot.store import Store, StoreReadOnly
from tests.store.helpers import make_entry, make_pair, rand_key, snapshot, worker


def _env(tmp_path, *roots) -> dict[str, str]:
    return {
        "MONO_AOT_PATH": ":".join(str(r) for r in roots),
        "MONO_AOT_CACHE_DIR": str(tmp_path / "cache"),
    }


def test_layers_in_order_and_the_hit_names_its_layer(tmp_path) -> None:
    rng = random.Random(10)
    a, b = tmp_path / "a", tmp_path / "b"
    e1, d1 = make_pair(rng)
    e2, d2 = make_pair(rng)
    e1_new, d1_new = make_pair(rng, key=e1.key)
    Store.at(b).publish(e1, d1)
    Store.at(tmp_path / "cache").publish(e1_new, d1_new)
    Store.at(tmp_path / "cache").publish(e2, d2)
    store = Store.default(_env(tmp_path, a, b))
    assert [(lay.kind, lay.writable) for lay in store.layers] == [
        ("path", False),
        ("path", False),
        ("cache", True),
    ]
    hit = store.lookup(e1.key)
    assert hit.data == d1 and hit.layer.root == b and hit.layer.kind == "path"
    assert not hit.layer.writable
    hit = store.lookup(e2.key)
    assert hit.data == d2 and hit.layer.kind == "cache" and hit.layer.writable
    assert store.lookup(rand_key(rng)) is None
    assert "(read-only)" in store.miss_message(e1.key) and str(a) in store.miss_message(e1.key)


def test_damage_in_a_read_only_layer_is_skipped_left_in_place_and_the_next_layer_serves(
    tmp_path, caplog
) -> None:
    rng = random.Random(11)
    e, d = make_pair(rng)
    ro = tmp_path / "ro"
    hit = Store.at(ro).publish(e, d)
    Store.at(tmp_path / "cache").publish(e, d)
    hit.blob_path.write_bytes(b"\0" * len(d))
    before = snapshot(ro)
    with caplog.at_level(logging.WARNING, logger="mono_aot.store"):
        got = Store.default(_env(tmp_path, ro)).lookup(e.key)
    assert got.data == d and got.layer.kind == "cache"
    assert "read-only layer, left in place" in caplog.text
    assert snapshot(ro) == before


def test_republishing_identical_bytes_writes_nothing(tmp_path) -> None:
    store = Store.at(tmp_path)
    e, d = make_pair(random.Random(12))
    store.publish(e, d)
    before = snapshot(tmp_path)
    store.publish(e, d)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("umask,fmode,dmode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775)])
def test_files_are_readable_by_others_as_the_umask_allows(tmp_path, umask, fmode, dmode) -> None:
    e, d = make_pair(random.Random(13))
    old = os.umask(umask)
    try:
        hit, built = Store.at(tmp_path / "s").get_or_build(e.key, lambda: (e, d))
    finally:
        os.umask(old)
    assert built
    for p in (hit.blob_path, hit.entry_path, hit.layer.lock_path(e.key)):
        assert stat.S_IMODE(p.stat().st_mode) == fmode, p
    for p in (hit.blob_path.parent, hit.entry_path.parent, tmp_path / "s" / "v1"):
        assert stat.S_IMODE(p.stat().st_mode) == dmode, p


def test_get_or_build_key_mismatch_is_an_error(tmp_path) -> None:
    from mono_aot.spec.errors import MonoError

    with pytest.raises(MonoError, match="produced an entry for key"):
        Store.at(tmp_path).get_or_build(rand_key(), lambda: make_pair(random.Random(1)))


def test_accept_rejects_an_old_build_which_is_rebuilt_and_replaced(tmp_path) -> None:
    rng = random.Random(14)
    store = Store.at(tmp_path)
    key = rand_key(rng)
    old = rng.randbytes(500)
    store.publish(make_entry(old, key, flydsl="0.4.1"), old)
    new = rng.randbytes(600)
    accept = lambda e: e.provenance.flydsl_version == "0.4.2"  # noqa: E731
    hit, built = store.get_or_build(key, lambda: (make_entry(new, key), new), accept=accept)
    assert built and hit.data == new
    assert store.lookup(key).data == new
    hit, built = store.get_or_build(key, lambda: pytest.fail("rebuilt"), accept=accept)
    assert not built and hit.data == new


def test_accept_looks_past_a_rejected_read_only_entry(tmp_path) -> None:
    rng = random.Random(15)
    key = rand_key(rng)
    old, new = rng.randbytes(300), rng.randbytes(301)
    Store.at(tmp_path / "ro").publish(make_entry(old, key, flydsl="0.4.1"), old)
    store = Store.default(_env(tmp_path, tmp_path / "ro"))
    accept = lambda e: e.provenance.flydsl_version == "0.4.2"  # noqa: E731
    hit, built = store.get_or_build(key, lambda: (make_entry(new, key), new), accept=accept)
    assert built and hit.layer.kind == "cache"
    hit, built = store.get_or_build(key, lambda: pytest.fail("rebuilt"), accept=accept)
    assert not built and hit.data == new
    assert store.lookup(key).data == old  # without accept, layer order decides


def test_read_only_layers_refuse_writes_and_say_so(tmp_path) -> None:
    store = Store.at(tmp_path, writable=False)
    e, d = make_pair(random.Random(16))
    with pytest.raises(StoreReadOnly, match="read-only"):
        store.publish(e, d)
    with pytest.raises(StoreReadOnly, match=r"no entry for key .*read-only.*cannot build"):
        store.get_or_build(e.key, lambda: (e, d))
    with pytest.raises(StoreReadOnly, match="no writable layer"):
        store.gc(0)
    assert not (tmp_path / "v1").exists()


def test_resolve_prefix(tmp_path) -> None:
    rng = random.Random(17)
    store = Store.at(tmp_path)
    k1, k2 = "abcd" + rand_key(rng)[4:], "abcd" + rand_key(rng)[4:]
    for k in (k1, k2):
        store.publish(make_entry(b"x" * 10, k), b"x" * 10)
    assert store.resolve_prefix(k1[:10]) == k1
    assert store.resolve_prefix(k2.upper()) == k2
    with pytest.raises(BadInput) as info:
        store.resolve_prefix("abcd")
    assert k1 in str(info.value) and k2 in str(info.value) and "ambiguous" in str(info.value)
    with pytest.raises(BadInput, match="no entry matches"):
        store.resolve_prefix("0123")
    for bad in ("abc", "xyz1", "a" * 65):
        with pytest.raises(BadInput, match="not a key"):
            store.resolve_prefix(bad)


def test_packs_are_found_through_entry_points(tmp_path) -> None:
    """A fake installed distribution declares packs; discovery is the real importlib one."""
    site = tmp_path / "site"
    (site / "fakepack").mkdir(parents=True)
    (site / "fakepack" / "__init__.py").write_text(
        textwrap.dedent("""
        from pathlib import Path
        STORE_A = Path(__file__).parent / "store_a"
        def store_b():
            return str(Path(__file__).parent / "store_b")
        def broken():
            raise RuntimeError("pack data missing")
    """)
    )
    dist = site / "fake_pack-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-pack\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[mono_aot.packs]\na = fakepack:STORE_A\nb = fakepack:store_b\n"
        "c-broken = fakepack:broken\nd-module = fakepack\ne-absent = fakepack:nothing\n"
    )
    rng = random.Random(18)
    e1, d1 = make_pair(rng)
    e2, d2 = make_pair(rng)
    Store.at(site / "fakepack" / "store_a").publish(e1, d1)
    Store.at(site / "fakepack" / "store_b").publish(e2, d2)
    env = {
        "PYTHONPATH": os.pathsep.join([str(site), *sys.path]),
        "MONO_AOT_CACHE_DIR": str(tmp_path / "cache"),
        "MONO_AOT_PATH": "",
    }
    docs = []
    for key in (e1.key, e2.key):
        p = worker("lookup", "-", key, env=env)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        docs.append(json.loads(out))
    assert [(x["kind"], x["label"], x["writable"]) for x in docs[0]["layers"]] == [
        ("cache", "user cache", True),
        ("pack", "pack a", False),
        ("pack", "pack b", False),
    ]
    assert docs[0]["hit"] and docs[0]["layer"] == "pack a" and docs[0]["writable"] is False
    assert docs[1]["hit"] and docs[1]["layer"] == "pack b"
    for name in ("c-broken", "d-module", "e-absent"):
        assert f"pack entry point '{name}'" in err, err
    assert "pack data missing" in err


def test_gc_keeps_what_another_schema_version_needs_and_files_it_does_not_know(tmp_path) -> None:
    rng = random.Random(19)
    store = Store.at(tmp_path)
    newer, data = make_pair(rng)
    hit = store.publish(newer, data)
    doc = json.loads(hit.entry_path.read_bytes())
    doc["schema_version"] = 2  # as a later mono-aot might write it, naming its blob
    hit.entry_path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    stray = tmp_path / "v1" / "blobs" / "ab" / "NOTES.txt"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_text("not the store's")
    for _ in range(2):
        store.publish(*make_pair(rng))
    (plan,) = store.gc(0)
    assert {r.kind for r in plan.removals} == {"lru-entry", "lru-blob"}
    assert len(plan.removals) == 4
    assert hit.entry_path.exists() and hit.blob_path.exists() and stray.exists()
    assert plan.size_after == hit.entry_path.stat().st_size + len(data) + stray.stat().st_size
    assert plan.notes and "over the 0 asked" in plan.notes[0]
