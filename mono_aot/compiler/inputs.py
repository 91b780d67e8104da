"""Build inputs: the toolchain half of an entry, and kernel providers outside the package.

Equal build inputs for one lookup key mean equal bytes; an entry whose recorded inputs differ
from the current toolchain's is stale (``mono_aot.compiler.plan``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from mono_aot.keys import Provider
from mono_aot.keys.sources import closure, py_files, relative
from mono_aot.spec.util import canonical_json, file_sha256, sha256_hex
from mono_aot.store.paths import user_cache_root

BUILD_SCHEMA_VERSION = 1


def directory_provider(directory: Path, module: str) -> Provider:
    """A provider living in ``directory`` (tests' fixture kernels): module ``module`` importable
    with ``directory`` on ``sys.path``; its sources are the directory's ``*.py`` plus the project
    modules they (and the contract) import."""
    d = Path(directory).resolve()
    files = closure(py_files(d))
    return Provider(
        module, tuple((relative(p, d), p) for p in files), search_path=d, uses_abi_contract=False
    )


def _hashed_files(dist) -> list[tuple[str, Path]]:
    """(RECORD-relative path, file) of every file the digest covers, sorted."""
    skip_names = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
    rows = []
    for f in dist.files or []:
        rel = f.as_posix()
        if rel.endswith(".pyc") or "__pycache__" in rel or f.name in skip_names:
            continue
        if rel.startswith("..") or rel.startswith("/"):
            continue  # scripts installed outside site-packages: not FlyDSL's code
        path = Path(f.locate())
        if path.is_file():
            rows.append((rel, path))
    return sorted(rows)


def _record_file(dist) -> Path | None:
    for f in dist.files or []:
        if f.name == "RECORD" and len(f.parts) == 2 and f.parts[0].endswith(".dist-info"):
            return Path(f.locate())
    return None


def hash_installed_package(dist_name: str) -> tuple[str, str, int]:
    """(version, sha256, file count) of an installed distribution's files, from its RECORD,
    every file read and hashed (no cache).

    Compiled ``.pyc`` files and install bookkeeping (RECORD, INSTALLER, direct_url.json) vary by
    install, not by content, and are left out.
    """
    from importlib import metadata

    dist = metadata.distribution(dist_name)
    return _hash_rows(dist.version, _hashed_files(dist))


def _hash_rows(version: str, rows: list[tuple[str, Path]]) -> tuple[str, str, int]:
    h = hashlib.sha256()
    for rel, path in rows:
        h.update(f"{rel}\0{file_sha256(path)}\n".encode())
    return version, h.hexdigest(), len(rows)


# --- the digest cache ------------------------------------------------------------------------
# Hashing FlyDSL's ~285 MB of files costs a few tenths of a second on every `mono-aot build`.
# The digest is kept in the user cache next to the store, keyed by a fingerprint of the stat of
# RECORD and of every hashed file (path, size, mtime_ns, ctime_ns, inode, device): any change to
# the install (a reinstall, an upgrade, an edited file: a write moves ctime, which nothing can
# set back) changes the fingerprint, and the files are hashed again. The cache is only ever a
# shortcut to the same result: a missing, unreadable, corrupt, foreign or mismatched file is
# ignored, and a write that fails is skipped.

DIGEST_CACHE_FORMAT = "mono-aot.dist-digest"
DIGEST_CACHE_VERSION = 1
DIGEST_CACHE_DIR = "toolchain"
_MAX_CACHE_BYTES = 1 << 16
# a file modified this recently may change again within the file system's timestamp resolution
# without its stat changing (git's "racily clean" case): such a digest is not cached
_RACY_SECONDS = 2.0


def _fingerprint(record: Path, rows: list[tuple[str, Path]]) -> tuple[str, int]:
    """sha256 of the stat of RECORD and every hashed file, and the newest mtime_ns among them."""
    items = []
    newest = 0
    for rel, path in [("RECORD", record), *rows]:
        st = os.stat(path)
        newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
        items.append(
            [rel, os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns,
             st.st_ino, st.st_dev]
        )  # fmt: skip
    return sha256_hex(canonical_json(items)), newest


def digest_cache_file(dist_name: str, record: Path, env: dict[str, str] | None = None) -> Path:
    """One cache file per installed copy (two venvs sharing a user cache do not collide)."""
    where = sha256_hex(os.path.realpath(record.parent).encode())[:16]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in dist_name)
    return user_cache_root(env) / DIGEST_CACHE_DIR / f"{safe}-{where}.json"


def _doc_body(dist_name: str, fingerprint: str, result: tuple[str, str, int]) -> dict[str, Any]:
    return {
        "dist": dist_name,
        "fingerprint": fingerprint,
        "format": DIGEST_CACHE_FORMAT,
        "result": {"files": result[2], "sha256": result[1], "version": result[0]},
        "version": DIGEST_CACHE_VERSION,
    }


def _read_cached(path: Path, dist_name: str, fingerprint: str) -> tuple[str, str, int] | None:
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_CACHE_BYTES + 1)
        if len(raw) > _MAX_CACHE_BYTES:
            return None
        doc = json.loads(raw)
        if not isinstance(doc, dict) or set(doc) != {"body", "body_sha256"}:
            return None
        body = doc["body"]
        if not isinstance(body, dict) or doc["body_sha256"] != sha256_hex(canonical_json(body)):
            return None
        res = body.get("result")
        if not isinstance(res, dict):
            return None
        version, digest, files = res.get("version"), res.get("sha256"), res.get("files")
        if not (
            isinstance(version, str)
            and isinstance(digest, str)
            and len(digest) == 64
            and all(c in "0123456789abcdef" for c in digest)
            and isinstance(files, int)
            and not isinstance(files, bool)
            and files >= 0
        ):
            return None
        result = (version, digest, files)
        if body != _doc_body(dist_name, fingerprint, result):
            return None  # another install, another format, or the files changed
        return result
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _write_cached(path: Path, dist_name: str, fingerprint: str, result: tuple[str, str, int]):
    body = _doc_body(dist_name, fingerprint, result)
    data = canonical_json({"body": body, "body_sha256": sha256_hex(canonical_json(body))})
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass  # a read-only or missing cache only costs the hashing next time
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@lru_cache(maxsize=4)
def installed_package_digest(dist_name: str) -> tuple[str, str, int]:
    """(version, sha256, file count) of an installed distribution's files (see
    ``hash_installed_package``), through the digest cache in the user cache: the files are
    hashed only when the stat fingerprint of the install differs from the cached one. Cached per
    process too.
    """
    from importlib import metadata

    dist = metadata.distribution(dist_name)
    rows = _hashed_files(dist)
    record = _record_file(dist)
    if record is None:
        return _hash_rows(dist.version, rows)
    try:
        before, newest = _fingerprint(record, rows)
    except OSError:
        return _hash_rows(dist.version, rows)
    cache = digest_cache_file(dist_name, record)
    hit = _read_cached(cache, dist_name, before)
    if hit is not None and hit[0] == dist.version and hit[2] == len(rows):
        return hit
    result = _hash_rows(dist.version, rows)
    try:
        after, _ = _fingerprint(record, rows)
    except OSError:
        return result
    if after == before and time.time_ns() - newest > _RACY_SECONDS * 1e9:
        _write_cached(cache, dist_name, before, result)
    return result


def build_inputs(
    *, flydsl: dict[str, Any], linker: dict[str, str], options: dict[str, Any]
) -> dict[str, Any]:
    """The toolchain half of an entry: equal build inputs mean equal bytes for one key."""
    return {
        "build_schema": BUILD_SCHEMA_VERSION,
        "flydsl": dict(flydsl),
        "linker": dict(linker),
        "options": dict(options),
    }
