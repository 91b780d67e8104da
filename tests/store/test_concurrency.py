"""Single flight across processes, lock holders that die, publishers killed with SIGKILL."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import select
import signal
import time

import pytest

from mono_aot.store import LockTimeout, Store
from mono_aot.store import lock as lockmod
from mono_aot.store._fs import TEMP_PREFIX, TEST_PAUSE_ENV
from mono_aot.store.lock import key_lock
from tests.store.helpers import rand_key, worker


def test_eight_processes_missing_the_same_key_build_it_once(tmp_path) -> None:
    key = rand_key()
    log = tmp_path / "builds.log"
    start_at = time.time() + 2.0  # every process is imported and waiting by then
    procs = [
        worker("get-or-build", str(tmp_path / "store"), key, str(log), str(start_at))
        for _ in range(8)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "Traceback" not in err, err
        results.append(json.loads(out))
    builders = log.read_text().split()
    assert len(builders) == 1, f"{len(builders)} builds ran: {builders}"
    assert sum(r["built"] for r in results) == 1
    assert len({r["sha256"] for r in results}) == 1 and all(r["hit"] for r in results)
    hit = Store.at(tmp_path / "store").lookup(key)
    assert hashlib.sha256(hit.data).hexdigest() == results[0]["sha256"]


def test_a_waiter_names_the_holder_and_a_killed_holder_never_blocks(
    tmp_path, monkeypatch, caplog
) -> None:
    root, key = tmp_path / "store", rand_key()
    holder = worker("hold-lock", str(root), key, "600")
    try:
        line = holder.stdout.readline()
        assert json.loads(line)["locked"] == holder.pid, holder.stderr.read()
        monkeypatch.setattr(lockmod, "NOTICE_AFTER", 0.2)
        path = Store.at(root).layers[0].lock_path(key)
        with caplog.at_level(logging.WARNING, logger="mono_aot.store"):
            with pytest.raises(LockTimeout, match=f"pid={holder.pid} "):
                with key_lock(path, f"key {key}", timeout=1.0):
                    pytest.fail("took a lock that is held")
        assert f"is held by pid={holder.pid} " in caplog.text and "waiting" in caplog.text
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        with key_lock(path, f"key {key}", timeout=60):  # the kernel dropped the dead one's lock
            assert f"pid={os.getpid()} " in path.read_text()
        assert path.exists()  # lock files are never unlinked
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


POINTS = [
    "blob-partial",
    "blob-written",
    "blob-visible",
    "entry-partial",
    "entry-written",
    "entry-visible",
]


def _wait_for_pause(p, point: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    buf = ""
    while f"paused at {point}" not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"publisher never reached {point}: {buf}"
        ready, _, _ = select.select([p.stderr], [], [], left)
        if ready:
            chunk = os.read(p.stderr.fileno(), 4096).decode()
            assert chunk or p.poll() is None, f"publisher exited before {point}: {buf}"
            buf += chunk


@pytest.mark.slow
def test_publishers_killed_at_random_points_never_expose_partial_results(tmp_path) -> None:
    """66 publishers SIGKILLed: 36 exactly at each step of publishing (6 per point, the test
    hook holds them there), 30 at random moments. After each kill, every visible entry
    verifies, and a lookup returns nothing or the complete bytes of one attempted publish."""
    root = tmp_path / "store"
    store = Store.at(root)
    rng = random.Random(66)
    keys = [rand_key(rng) for _ in range(3)]
    attempted: dict[str, set[str]] = {k: set() for k in keys}
    landed: dict[str, int] = {}
    for trial in range(66):
        key, seed = rng.choice(keys), rng.randrange(1 << 30)
        size = rng.choice([1, 100, 4096, 200_000, 1_000_000])
        data = random.Random(seed).randbytes(size)
        attempted[key].add(hashlib.sha256(data).hexdigest())
        if trial < 36:
            point = POINTS[trial % 6]
            p = worker(
                "publish",
                str(root),
                key,
                str(seed),
                str(size),
                env={TEST_PAUSE_ENV: f"{point}=600"},
            )
            _wait_for_pause(p, point)
            landed[point] = landed.get(point, 0) + 1
        else:
            p = worker(
                "publish", str(root), key, str(seed), str(size), env={TEST_PAUSE_ENV: "*=0.003"}
            )
            time.sleep(rng.uniform(0.0, 0.4))
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=60)
        if p.returncode == 0:
            landed["finished"] = landed.get("finished", 0) + 1
        report = store.verify(all_layers=True)
        assert report.problems == [], f"trial {trial}: {[x.message() for x in report.problems]}"
        for k in keys:
            hit = store.lookup(k)
            if hit is not None:
                assert hashlib.sha256(hit.data).hexdigest() in attempted[k], f"trial {trial}"
                assert len(hit.data) == hit.entry.blob.size
    assert all(landed.get(pt) == 6 for pt in POINTS), landed
    temps = [p for p in root.rglob(f"{TEMP_PREFIX}*")]
    assert temps, "no kill landed while a temp file was open"
    (plan,) = store.gc(1 << 40)  # collects the leftovers of the killed processes
    assert {r.path for r in plan.removals if r.kind == "temp"} == set(temps)
    assert not list(root.rglob(f"{TEMP_PREFIX}*"))
    assert store.verify(all_layers=True).problems == []
