"""``mono-aot cache`` in real processes on real stores."""

from __future__ import annotations

import json
import os
import random

import pytest

from mono_aot.cli.cache import SizeType
from mono_aot.store import Store
from mono_aot.store._fs import TEMP_PREFIX
from tests.store.helpers import make_entry, make_pair, rand_key, run_cli, snapshot


def _cache(root, *args, **kw):
    return run_cli("cache", "--store", str(root), *args, **kw)


def _age(store: Store, entry, when: float) -> None:
    """Make ``entry`` last used at ``when`` (its entry and blob times, which gc reads); no
    lookup here: a lookup is a use."""
    layer = store.layers[0]
    for p in (layer.entry_path(entry.key), layer.blob_path(entry.blob.sha256)):
        os.utime(p, (when, when))


@pytest.fixture
def filled(tmp_path):
    rng = random.Random(40)
    root = tmp_path / "store"
    store = Store.at(root)
    pairs = [
        make_pair(rng, size=10_000, variant=v, hidden=h)
        for v, h in [("narrow", 3072), ("wide", 3072), ("narrow", 4096)]
    ]
    for e, d in pairs:
        store.publish(e, d)
    return root, store, pairs


def test_ls_and_show(filled) -> None:
    root, store, pairs = filled
    r = _cache(root, "ls", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert sorted(x["key"] for x in rows) == sorted(e.key for e, _ in pairs)
    assert {(x["variant"], x["arch"], x["layout"], x["size"], x["layer"]) for x in rows} == {
        (e.variant, e.arch, e.layout, len(d), "store") for e, d in pairs
    }
    r = _cache(root, "ls")
    assert r.returncode == 0 and pairs[0][0].key[:16] in r.stdout and "3 entries" in r.stdout
    e, d = pairs[1]
    r = _cache(root, "show", e.key[:8], "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["key"] == e.key and doc["blob_status"] == "verified"
    assert doc["entry"] == e.model_dump(mode="json")
    r = _cache(root, "show", e.key[:8])
    assert r.returncode == 0 and e.blob.sha256 in r.stdout and "verified" in r.stdout


def test_unknown_and_ambiguous_keys_are_bad_input(tmp_path) -> None:
    store = Store.at(tmp_path)
    k1, k2 = "beef" + rand_key()[4:], "beef" + rand_key()[4:]
    for k in (k1, k2):
        store.publish(make_entry(b"z" * 9, k), b"z" * 9)
    r = _cache(tmp_path, "show", "beef")
    assert r.returncode == 2 and "ambiguous" in r.stderr and k1 in r.stderr and k2 in r.stderr
    r = _cache(tmp_path, "show", "0000")
    assert r.returncode == 2 and "no entry matches" in r.stderr
    r = _cache(tmp_path, "explain", "zz")
    assert r.returncode == 2 and "not a key" in r.stderr


def test_explain_one_key_and_the_difference_of_two(filled) -> None:
    root, _, pairs = filled
    a, b = pairs[0][0], pairs[2][0]  # narrow/3072 and narrow/4096
    r = _cache(root, "explain", a.key[:10], "--json")
    assert r.returncode == 0, r.stderr
    inputs = json.loads(r.stdout)["inputs"]
    assert inputs["lookup.layout.hidden"] == 3072 and inputs["build.flydsl"] == "0.4.2"
    assert inputs["lookup.layout.heads[0]"] == 16
    r = _cache(root, "explain", a.key[:10], b.key[:10], "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["differ"] == {
        "lookup.layout.hidden": {"a": 3072, "b": 4096, "in": ["a", "b"]}
    }
    r = _cache(root, "explain", a.key[:10], b.key[:10])
    assert "lookup.layout.hidden: 3072 -> 4096" in r.stdout
    assert "variant" not in r.stdout  # only what differs


def test_verify_lists_what_is_corrupt_or_missing_and_exits_1(filled) -> None:
    root, store, pairs = filled
    assert _cache(root, "verify", "--all").returncode == 0
    (e0, d0), (e1, _), (e2, _) = pairs
    h0 = store.lookup(e0.key)
    h0.blob_path.write_bytes(d0[:-1] + bytes([d0[-1] ^ 0x40]))
    os.unlink(store.lookup(e1.key).blob_path)
    r = _cache(root, "verify", "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    found = {(p["kind"], p["key"]) for p in doc["problems"]}
    assert ("blob-corrupt", e0.key) in found and ("blob-missing", e1.key) in found
    assert doc["ok"] == 1
    r = _cache(root, "verify", e2.key[:6], rand_key())
    assert r.returncode == 1 and "MISSING" in r.stdout and "1 verified, 1 problems" in r.stdout
    r = _cache(root, "verify", "--all")  # the damaged files went to quarantine
    assert r.returncode == 0, r.stdout


def test_gc_dry_run_lists_exactly_what_gc_removes_lru_first(tmp_path) -> None:
    rng = random.Random(41)
    root = tmp_path / "store"
    store = Store.at(root)
    shared = rng.randbytes(5000)
    pairs = [make_pair(rng, size=5000) for _ in range(6)]
    pairs += [
        (make_entry(shared, rand_key(rng)), shared),
        (make_entry(shared, rand_key(rng)), shared),
    ]
    for e, d in pairs:
        store.publish(e, d)
    for i, (e, _) in enumerate(pairs):  # pairs[0] is the least recently used
        _age(store, e, 1_700_000_000 + 1000 * i)
    _age(store, pairs[6][0], 1_700_000_000 + 100)  # the shared blob is old via one entry...
    os.utime(
        store.layers[0].entry_path(pairs[7][0].key), (1_800_000_000,) * 2
    )  # ...new via another
    orphan = rng.randbytes(777)
    Store.at(root).publish(make_entry(orphan, rand_key(rng)), orphan)
    orphan_entry = next(
        p for p in root.rglob("*.json") if p.name not in {e.key + ".json" for e, _ in pairs}
    )
    orphan_entry.unlink()  # as if killed between blob and entry
    temp = root / "v1" / "blobs" / "ab" / f"{TEMP_PREFIX}x.123.abcd"
    temp.parent.mkdir(parents=True, exist_ok=True)
    temp.write_bytes(b"partial")
    broken = store.layers[0].entry_path(pairs[3][0].key)
    broken.write_bytes(broken.read_bytes()[:-10])  # a corrupt entry is garbage too
    before = snapshot(root)

    dry = _cache(root, "gc", "--max-size", "20K", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert snapshot(root) == before  # the dry run removes nothing
    real = _cache(root, "gc", "--max-size", "20K", "--json")
    assert real.returncode == 0, real.stderr
    (d_layer,), (r_layer,) = json.loads(dry.stdout)["layers"], json.loads(real.stdout)["layers"]
    assert d_layer["removed"] == r_layer["removed"]
    removed = {x["path"]: x for x in r_layer["removed"]}
    assert all(not os.path.exists(p) for p in removed)
    kinds = sorted(x["kind"] for x in removed.values())
    assert kinds.count("temp") == 1 and kinds.count("corrupt-entry") == 1
    # the blob no entry had, and the corrupt entry's blob once that entry is gone
    assert {x["path"] for x in removed.values() if x["kind"] == "orphan-blob"} == {
        str(store.layers[0].blob_path(s))
        for s in (make_entry(orphan, "0" * 64).blob.sha256, pairs[3][0].blob.sha256)
    }
    lru = [x["key"] for x in r_layer["removed"] if x["kind"] == "lru-entry"]
    survivors = [e.key for e, _ in pairs if e.key not in lru and e.key != pairs[3][0].key]
    # 7 intact entries of about 2 KiB, 6 blobs of 5000 bytes (one shared): down to 20 KiB
    # takes the five oldest; the shared blob stays, since pairs[7] still needs it
    assert lru == [pairs[i][0].key for i in (0, 6, 1, 2, 4)]
    assert store.lookup(pairs[7][0].key).data == shared  # its blob was needed: kept
    assert r_layer["size_after"] <= 20 * 1024
    for k in survivors:
        assert store.lookup(k) is not None
    text = _cache(root, "gc", "--max-size", "20K", "--dry-run")
    assert text.returncode == 0 and "would remove 0 files" in text.stdout
    r = _cache(root, "verify", "--all")
    assert r.returncode == 0, r.stdout + r.stderr


def test_gc_and_clear_never_touch_read_only_layers(tmp_path) -> None:
    rng = random.Random(42)
    ro, cache = tmp_path / "ro", tmp_path / "cache"
    for root in (ro, cache):
        for _ in range(3):
            Store.at(root).publish(*make_pair(rng))
    env = {"MONO_AOT_PATH": str(ro), "MONO_AOT_CACHE_DIR": str(cache)}
    before = snapshot(ro)
    r = run_cli("cache", "gc", "--max-size", "0", env=env)
    assert r.returncode == 0, r.stderr
    assert "removed 6 files" in r.stdout and str(ro) not in r.stdout
    assert snapshot(ro) == before
    assert not list((cache / "v1" / "entries").rglob("*.json"))
    r = run_cli("cache", "clear", "--yes", env=env)
    assert r.returncode == 0 and snapshot(ro) == before


def test_clear_refuses_without_yes_off_a_terminal_and_keeps_locks(filled) -> None:
    root, store, pairs = filled
    store.get_or_build(pairs[0][0].key, lambda: pytest.fail("built"))
    e, d = make_pair(random.Random(1))
    store.get_or_build(e.key, lambda: (e, d))
    before = snapshot(root)
    r = _cache(root, "clear")
    assert r.returncode == 2 and "--yes" in r.stderr and "not a terminal" in r.stderr
    assert snapshot(root) == before
    r = _cache(root, "clear", "--yes")
    assert r.returncode == 0 and "8 files" in r.stdout, r.stdout
    left = sorted(p.name for p in root.rglob("*") if p.is_file())
    assert left == sorted([f"{e.key}.lock", "store.lock"])  # lock files are never unlinked
    assert json.loads(_cache(root, "ls", "--json").stdout) == []


@pytest.mark.parametrize(
    "text,n",
    [
        ("1024", 1024),
        ("500M", 500 << 20),
        ("2G", 2 << 30),
        ("10k", 10240),
        ("1.5G", 3 << 29),
        ("7MiB", 7 << 20),
        ("0", 0),
        ("3 MB", 3 << 20),
    ],
)
def test_sizes(text, n) -> None:
    assert SizeType().convert(text, None, None) == n


def test_bad_size_is_a_usage_error(tmp_path) -> None:
    for bad in ("2X", "-1", "", "M"):
        r = _cache(tmp_path, "gc", "--max-size", bad)
        assert r.returncode == 2 and "is not a size" in r.stderr, (bad, r.stderr)


def test_an_empty_store_path_is_bad_input_not_the_working_directory(tmp_path) -> None:
    # Path("") is "."; `clear --yes` must never empty the directory the user stands in
    for args in (("ls",), ("clear", "--yes")):
        r = run_cli("cache", "--store", "", *args, env={"MONO_AOT_CACHE_DIR": str(tmp_path)})
        assert r.returncode == 2 and "--store: empty path" in r.stderr, r.stderr


def test_verify_rows_are_not_worded_as_warnings(filled) -> None:
    root, store, pairs = filled
    (e0, d0), _, _ = pairs
    store.lookup(e0.key).blob_path.write_bytes(d0[:-1])
    r = _cache(root, "verify", e0.key, rand_key())
    assert r.returncode == 1
    rows = r.stdout.splitlines()
    assert any(x.startswith("BLOB-CORRUPT  store ") for x in rows), r.stdout
    assert any(x.startswith("MISSING  ") for x in rows) and "mono-aot: " not in r.stdout


def test_gc_names_a_terabyte_size_in_tib(tmp_path) -> None:
    from mono_aot.cli.cache import human

    assert [human(n) for n in (0, 1536, 3 << 29, 3 << 39)] == [
        "0 B", "1.5 KiB", "1.5 GiB", "1.5 TiB"
    ]  # fmt: skip
    r = _cache(tmp_path / "s", "gc", "--max-size", "1.5T", "--dry-run")
    assert r.returncode == 0 and "(max 1.5 TiB)" in r.stdout, r.stdout
