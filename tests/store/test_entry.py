"""The entry file format and verification on every read, including random damage."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random

import pytest

from mono_aot.spec.errors import BadInput, MonoError
from mono_aot.store import (
    EntryCorrupt,
    EntryUnknownSchema,
    Store,
    decode_entry,
    encode_entry,
)
from tests.store.helpers import make_entry, make_pair, rand_key


def test_encode_decode_round_trip_and_is_deterministic() -> None:
    e, _ = make_pair(random.Random(0))
    raw = encode_entry(e)
    assert decode_entry(raw, e.key) == e
    assert encode_entry(decode_entry(raw, e.key)) == raw
    doc = json.loads(raw)
    assert doc["format"] == "mono-aot.entry" and doc["schema_version"] == 1
    assert doc["entry"]["key"] == e.key  # readable and diffable by a person


def test_entry_under_the_wrong_key_is_corrupt() -> None:
    e, _ = make_pair(random.Random(0))
    with pytest.raises(EntryCorrupt, match="filed under key"):
        decode_entry(encode_entry(e), rand_key())


def test_unknown_schema_version_is_not_read_further() -> None:
    e, _ = make_pair(random.Random(0))
    doc = json.loads(encode_entry(e))
    doc["schema_version"] = 2
    doc["entry"] = {"anything": "a later mono-aot may write"}  # not even an Entry
    raw = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    with pytest.raises(EntryUnknownSchema) as info:
        decode_entry(raw, e.key)
    assert info.value.version == 2


def test_unknown_schema_entry_is_ignored_with_a_warning_and_left_alone(tmp_path, caplog) -> None:
    store = Store.at(tmp_path)
    e, data = make_pair(random.Random(1))
    hit = store.publish(e, data)
    doc = json.loads(hit.entry_path.read_bytes())
    doc["schema_version"] = 7
    hit.entry_path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    with caplog.at_level(logging.WARNING, logger="mono_aot.store"):
        assert store.lookup(e.key) is None
    assert "entry schema version 7" in caplog.text and "ignored" in caplog.text
    assert hit.entry_path.exists()  # another version's entry is not quarantined
    assert not store.layers[0].quarantine_dir.exists()


def test_publish_refuses_data_that_does_not_match_the_entry(tmp_path) -> None:
    store = Store.at(tmp_path)
    e, data = make_pair(random.Random(2))
    with pytest.raises(MonoError, match="refusing to publish"):
        store.publish(e, data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(MonoError, match="refusing to publish"):
        store.publish(e, data + b"\0")
    assert not (tmp_path / "v1" / "entries").exists()


@pytest.mark.parametrize("bad", ["", "abc", "A" * 64, "g" * 64, "0" * 63, "../" + "0" * 61])
def test_keys_are_validated(tmp_path, bad) -> None:
    with pytest.raises(BadInput, match="sha256"):
        Store.at(tmp_path).lookup(bad)


def _mutate_entry(raw: bytes, rng: random.Random) -> tuple[str, bytes]:
    kind = rng.choice(["byte", "truncate", "insert", "delete", "value", "reformat"])
    b = bytearray(raw)
    if kind == "byte":
        i = rng.randrange(len(b))
        b[i] = rng.choice([c for c in range(256) if c != b[i]])
    elif kind == "truncate":
        del b[rng.randrange(len(b)) :]
    elif kind == "insert":
        b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
    elif kind == "delete":
        del b[rng.randrange(len(b))]
    elif kind == "value":  # a careful, valid JSON edit of one field
        doc = json.loads(raw)
        field = rng.choice(["arch", "symbol", "variant", "layout"])
        doc["entry"][field] += "x"
        b = bytearray((json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
    else:  # the same document, written by another JSON tool
        b = bytearray(json.dumps(json.loads(raw)).encode())
    assert bytes(b) != raw
    return f"entry-{kind}", bytes(b)


def _mutate_blob(raw: bytes, rng: random.Random) -> tuple[str, bytes]:
    b = bytearray(raw)
    if rng.random() < 0.7:
        b[rng.randrange(len(b))] ^= rng.randrange(1, 256)
        return "blob-flip", bytes(b)
    return "blob-truncate", bytes(b[: rng.randrange(len(b))])


def test_every_random_mutation_is_detected_on_the_next_lookup(tmp_path, caplog) -> None:
    """300 random mutations (any byte flipped in a blob, any truncation or edit of an entry):
    each next lookup misses, says what and why, and moves the bad file to quarantine."""
    rng = random.Random(20260303)
    store = Store.at(tmp_path)
    pairs = [make_pair(rng, size=rng.randrange(1, 3000)) for _ in range(8)]
    for e, d in pairs:
        store.publish(e, d)
    kinds: dict[str, int] = {}
    for trial in range(300):
        e, data = rng.choice(pairs)
        hit = store.lookup(e.key)
        assert hit is not None and hit.data == data
        if rng.random() < 0.5:
            path, (kind, bad) = hit.entry_path, _mutate_entry(hit.entry_path.read_bytes(), rng)
        else:
            path, (kind, bad) = hit.blob_path, _mutate_blob(data, rng)
        with open(path, "r+b") as f:  # damage in place, as a disk or an editor would
            f.write(bad)
            f.truncate(len(bad))
        kinds[kind] = kinds.get(kind, 0) + 1
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mono_aot.store"):
            got = store.lookup(e.key)
        assert got is None, f"trial {trial}: {kind} at {path} not detected"
        assert path.name[:16] in caplog.text or e.key[:16] in caplog.text, caplog.text
        if "schema version" not in caplog.text:  # another version's entry: left alone
            assert "moved to" in caplog.text, f"trial {trial} {kind}: {caplog.text}"
            assert not path.exists() or path.read_bytes() != bad
        store.publish(e, data)  # repair, for the next trial
    assert sum(kinds.values()) == 300 and len(kinds) == 8, kinds


def test_missing_blob_moves_the_entry_and_a_rebuild_replaces_it(tmp_path, caplog) -> None:
    store = Store.at(tmp_path)
    e, data = make_pair(random.Random(3))
    hit = store.publish(e, data)
    os.unlink(hit.blob_path)
    with caplog.at_level(logging.WARNING, logger="mono_aot.store"):
        assert store.lookup(e.key) is None
    assert "is missing" in caplog.text and "moved to" in caplog.text
    assert not hit.entry_path.exists()
    q = sorted(p.name for p in store.layers[0].quarantine_dir.iterdir())
    assert any(n.endswith(f"{e.key}.json") for n in q) and any(n.endswith(".reason") for n in q)
    hit2, built = store.get_or_build(e.key, lambda: (e, data))
    assert built and hit2.data == data and store.lookup(e.key).data == data


def test_corrupt_blob_is_rewritten_by_the_next_publish(tmp_path) -> None:
    store = Store.at(tmp_path)
    e, data = make_pair(random.Random(4))
    hit = store.publish(e, data)
    hit.blob_path.write_bytes(b"x" * len(data))
    assert store.publish(e, data).data == data
    assert hit.blob_path.read_bytes() == data
    assert hashlib.sha256(store.lookup(e.key).data).hexdigest() == e.blob.sha256


def test_entry_equal_blob_shared_by_two_keys(tmp_path) -> None:
    store = Store.at(tmp_path)
    data = random.Random(5).randbytes(100)
    a, b = make_entry(data, rand_key()), make_entry(data, rand_key(), variant="wide")
    store.publish(a, data)
    store.publish(b, data)
    assert store.lookup(a.key).blob_path == store.lookup(b.key).blob_path
