"""A real process for the store tests: ``python -m tests.store.worker CMD ARGS`` (repo root cwd).

Commands print one JSON line on stdout.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

from mono_aot.store import Store
from tests.store.helpers import make_entry


def _hit_doc(hit, built=None) -> dict:
    if hit is None:
        return {"hit": False}
    return {
        "hit": True,
        "sha256": hashlib.sha256(hit.data).hexdigest(),
        "size": len(hit.data),
        "layer": hit.layer.label,
        "writable": hit.layer.writable,
        "built": built,
    }


def main(argv: list[str]) -> int:
    cmd, *args = argv
    if cmd == "publish":  # ROOT KEY SEED SIZE
        root, key, seed, size = args
        data = random.Random(int(seed)).randbytes(int(size))
        Store.at(root).publish(make_entry(data, key), data)
        print(json.dumps({"published": hashlib.sha256(data).hexdigest()}), flush=True)
    elif cmd == "get-or-build":  # ROOT KEY BUILD_LOG START_AT
        root, key, log, start_at = args
        store = Store.at(root)
        while time.time() < float(start_at):
            time.sleep(0.001)

        def build():
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
            time.sleep(1.0)  # a compile: long enough that every other process misses
            data = os.urandom(8192)  # different in every build: a second build would show
            return make_entry(data, key), data

        hit, built = store.get_or_build(key, build)
        print(json.dumps(_hit_doc(hit, built)), flush=True)
    elif cmd == "lookup":  # ROOT KEY  (ROOT "-" means Store.default())
        root, key = args
        store = Store.default() if root == "-" else Store.at(root)
        print(
            json.dumps(
                {
                    **_hit_doc(store.lookup(key)),
                    "layers": [layer.as_json() for layer in store.layers],
                }
            ),
            flush=True,
        )
    elif cmd == "build-miss":  # ROOT KEY: get_or_build of a missing key must fail, not write
        root, key = args
        store = Store.default() if root == "-" else Store.at(root)
        try:
            store.get_or_build(key, lambda: (_ for _ in ()).throw(AssertionError("built")))
        except Exception as e:
            print(json.dumps({"error": type(e).__name__, "message": str(e)}), flush=True)
            return 0
        print(json.dumps({"error": None}), flush=True)
    elif cmd == "hold-lock":  # ROOT KEY SECONDS: take the key's build lock and sit on it
        root, key, seconds = args
        from mono_aot.store.lock import key_lock

        layer = Store.at(root).layers[0]
        with key_lock(layer.lock_path(key), f"key {key}"):
            print(json.dumps({"locked": os.getpid()}), flush=True)
            time.sleep(float(seconds))
    else:
        raise SystemExit(f"unknown command {cmd}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    raise SystemExit(main(sys.argv[1:]))
