"""Read-only stores: hits succeed and change nothing on disk; misses say the layer is read-only.

We run as root in CI, and ``chmod a-w`` does not stop root, so there are two tests: one proves
the hit path never even attempts a write (every writing call is trapped) on a ``chmod -R a-w``
store; the other reads the store as another uid (nobody), which really cannot write.
"""

from __future__ import annotations

import builtins
import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mono_aot.store import Store
from tests.store.helpers import REPO, make_pair, rand_key, snapshot, worker

NOBODY = 65534


def _fill(root: Path, n: int, seed: int) -> list:
    rng = random.Random(seed)
    store = Store.at(root)
    pairs = [make_pair(rng, size=rng.randrange(1, 20000)) for _ in range(n)]
    for e, d in pairs:
        store.publish(e, d)
    return pairs


def _chmod_a_minus_w(root: Path, restore: bool = False) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            os.chmod(Path(dirpath) / name, 0o644 if restore else 0o444)
        os.chmod(dirpath, 0o755 if restore else 0o555)


class _NoWrites:
    """Trap every call that could write to disk while a lookup runs."""

    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real_open, real_os_open = builtins.open, os.open

        def guarded_os_open(path, flags, *a, **k):
            if flags & self.WRITE_FLAGS:
                raise AssertionError(f"a lookup opened {path} for writing")
            return real_os_open(path, flags, *a, **k)

        def guarded_open(file, mode="r", *a, **k):
            if any(c in mode for c in "wax+"):
                raise AssertionError(f"a lookup opened {file} with mode {mode}")
            return real_open(file, mode, *a, **k)

        def forbidden(name):
            def trap(*a, **k):
                raise AssertionError(f"a lookup called {name}{a}")

            return trap

        monkeypatch.setattr(os, "open", guarded_os_open)
        monkeypatch.setattr(builtins, "open", guarded_open)
        for name in (
            "rename",
            "replace",
            "unlink",
            "remove",
            "mkdir",
            "makedirs",
            "rmdir",
            "utime",
            "chmod",
            "ftruncate",
            "truncate",
            "symlink",
            "link",
        ):
            monkeypatch.setattr(os, name, forbidden(f"os.{name}"))
        monkeypatch.setattr(fcntl, "flock", forbidden("fcntl.flock"))


def test_hits_on_a_chmod_a_minus_w_store_attempt_no_write_and_change_nothing(
    tmp_path, monkeypatch
) -> None:
    root = tmp_path / "store"
    pairs = _fill(root, 6, 30)
    _chmod_a_minus_w(root)
    try:
        before = snapshot(root)
        env = {"MONO_AOT_PATH": str(root), "MONO_AOT_CACHE_DIR": str(tmp_path / "no-cache")}
        default, single = Store.default(env), Store.at(root)
        missing = rand_key()
        with monkeypatch.context() as m:
            _NoWrites(m)
            for e, d in pairs:
                assert single.lookup(e.key).data == d
                hit = default.lookup(e.key)
                assert hit.data == d and hit.layer.kind == "path" and not hit.layer.writable
            assert single.lookup(missing) is None and default.lookup(missing) is None
        for e, d in pairs[:2]:  # and from other processes
            p = worker("lookup", str(root), e.key)
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            assert json.loads(out)["sha256"] == hashlib.sha256(d).hexdigest()
        assert snapshot(root) == before
        assert not (tmp_path / "no-cache").exists()
    finally:
        _chmod_a_minus_w(root, restore=True)


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _nobody_python(env: dict[str, str], root: Path) -> str | None:
    """An interpreter that uid nobody can run and that imports this checkout, or None.

    The venv's own interpreter may live under a directory only root can enter; then the same
    Python version from PATH runs the same code with the venv's packages on PYTHONPATH."""
    want = f"python{sys.version_info.major}.{sys.version_info.minor}"
    on_path = [
        Path(d) / n
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d
        for n in (want, "python3")
    ]
    candidates = [sys.executable, *(str(p) for p in on_path if p.is_file())]
    probe = (
        f"import sys, os; assert sys.version_info[:2] == {tuple(sys.version_info[:2])!r}; "
        f"import mono_aot.store, pydantic; os.listdir({str(root)!r})"
    )
    for exe in dict.fromkeys(c for c in candidates if c):
        try:
            r = subprocess.run(
                [exe, "-c", probe],
                env=env,
                cwd="/",
                preexec_fn=_as_nobody,
                capture_output=True,
                timeout=60,
            )
        except OSError:
            continue
        if r.returncode == 0:
            return exe
    return None


READER = r"""
import hashlib, json, sys
from mono_aot.store import Store
root, nocache, good, bad, missing = sys.argv[1:6]
good = good.split(",")
out = {}
single = Store.at(root)
out["writable"] = single.layers[0].writable
out["hits"] = [hashlib.sha256(single.lookup(k).data).hexdigest() for k in good]
out["bad_hit"] = single.lookup(bad) is not None
out["missing_hit"] = single.lookup(missing) is not None
for name, store in (("single", single),
                    ("default", Store.default({"MONO_AOT_PATH": root, "MONO_AOT_CACHE_DIR": nocache}))):
    try:
        store.get_or_build(missing, lambda: sys.exit("built"))
        out[name + "_miss"] = None
    except Exception as e:
        out[name + "_miss"] = f"{type(e).__name__}: {e}"
hit = Store.default({"MONO_AOT_PATH": root, "MONO_AOT_CACHE_DIR": nocache}).lookup(good[0])
out["default_layer"] = [hit.layer.label, hit.layer.writable]
print(json.dumps(out))
"""


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="needs root to run a reader as another uid; "
    "as a non-root user the chmod test above is already a real read-only test",
)
def test_another_uid_reads_a_read_only_store_and_changes_nothing() -> None:
    top = Path(tempfile.mkdtemp(prefix="mono-aot-ro-"))  # tmp_path is private to root
    try:
        os.chmod(top, 0o755)
        root, nocache = top / "store", top / "cache-of-root"
        old = os.umask(0o022)
        try:
            pairs = _fill(root, 5, 31)
            bad_e, bad_d = _fill(root, 1, 32)[0]
            nocache.mkdir()
        finally:
            os.umask(old)
        blob = Store.at(root).lookup(bad_e.key).blob_path
        blob.write_bytes(bytes([bad_d[0] ^ 0xFF]) + bad_d[1:])
        _chmod_a_minus_w(root)
        before = snapshot(root)
        site_packages = [p for p in sys.path if p.endswith("site-packages")]
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(top),
            "PYTHONPATH": os.pathsep.join([str(REPO), *site_packages]),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        exe = _nobody_python(env, root)
        if exe is None:
            pytest.skip(
                "no Python interpreter here can be run by uid nobody and import this "
                "checkout (the venv's interpreter is not readable by other users)"
            )
        missing = rand_key()
        r = subprocess.run(
            [
                exe,
                "-c",
                READER,
                str(root),
                str(nocache),
                ",".join(e.key for e, _ in pairs),
                bad_e.key,
                missing,
            ],
            env=env,
            cwd="/",
            preexec_fn=_as_nobody,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["writable"] is False
        assert out["hits"] == [e.blob.sha256 for e, _ in pairs]
        assert out["bad_hit"] is False and out["missing_hit"] is False
        assert "read-only layer, left in place" in r.stderr and bad_e.key[:16] in r.stderr
        for name in ("single", "default"):
            assert out[f"{name}_miss"].startswith("StoreReadOnly: no entry for key"), out
            assert "read-only" in out[f"{name}_miss"]
        assert out["default_layer"] == ["MONO_AOT_PATH", False]
        assert snapshot(root) == before
        assert os.listdir(nocache) == []
    finally:
        _chmod_a_minus_w(top, restore=True)
        shutil.rmtree(top)
