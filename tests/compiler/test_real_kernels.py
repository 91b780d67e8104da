"""``mono-aot build`` on the real kernels (``mono_aot.kernels``): the build's acceptance on them.

Both variants on both archs build and pass the publish rules, building the same inputs into
another empty store gives byte-identical blobs and equal entries, and the issue's
command run twice reports only hits the second time. Eight real compiles in all: the four of
the first store, and one more per (variant, arch) for the second stores, of which the gfx942
one is the acceptance command's own build into an empty default store.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import entry_docs, run_cli, store_files, without_timestamps

pytestmark = pytest.mark.slow

ARCHS = ("gfx942", "gfx950")
VARIANTS = ("narrow", "wide")


def _real_json(store: Path, *args: str, expect: int | None = 0) -> dict:
    p = run_cli(
        "build",
        "--store",
        str(store),
        "--json",
        *args,
        env_extra={"MONO_AOT_CACHE_DIR": str(store.parent / "unused-user-cache")},
        timeout=3600,
    )
    if expect is not None:
        assert p.returncode == expect, (
            f"exit {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
        )
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def real_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("real") / "store"
    doc = _real_json(root, "-j", "2")
    assert doc["summary"]["failed"] == 0
    assert {(r["arch"], r["variant"]) for r in doc["results"]} == {
        (a, v) for a in ARCHS for v in VARIANTS
    }
    return root


@pytest.fixture(scope="module")
def user_cache_gfx942(tmp_path_factory) -> tuple[Path, dict[str, str], dict]:
    """The issue's acceptance command, ``mono-aot build --arch gfx942``, into an empty default
    store (the user cache): (cache dir, environment, its --json document)."""
    cache = tmp_path_factory.mktemp("user") / "cache"
    env = {"MONO_AOT_CACHE_DIR": str(cache), "MONO_AOT_PATH": ""}
    p = run_cli("build", "--arch", "gfx942", "--json", env_extra=env, timeout=3600)
    assert p.returncode == 0, p.stderr[-4000:]
    return cache, env, json.loads(p.stdout)


@pytest.fixture(scope="module")
def second_stores(tmp_path_factory, user_cache_gfx942) -> dict[str, tuple[Path, dict]]:
    """Per arch, the same inputs built again into an empty store in a directory of another
    path length: gfx942 by the acceptance command (-j default), gfx950 with -j 1 and --store."""
    root = tmp_path_factory.mktemp("second-store-with-a-longer-path") / "store"
    doc = _real_json(root, "-j", "1", "--arch", "gfx950")
    cache, _, doc942 = user_cache_gfx942
    return {"gfx942": (cache, doc942), "gfx950": (root, doc)}


def _blobs(root: Path) -> dict[str, bytes]:
    return {rel.rsplit("/", 1)[1]: d for rel, d in store_files(root).items() if "/blobs/" in rel}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_real_kernels_build_reproducibly(real_store, second_stores, arch, variant):
    """The same inputs into another empty store: identical blob bytes, and the entry differs only
    in the provenance timestamps."""
    root, doc = second_stores[arch]
    [r] = [r for r in doc["results"] if r["variant"] == variant]
    assert r["status"] == "built" and r["compiled"]
    ea = {e["key"]: e for e in entry_docs(real_store).values()}
    eb = {e["key"]: e for e in entry_docs(root).values()}[r["key"]]
    assert eb["symbol"].endswith("_0")
    assert eb["build_inputs"]["options"]["address_space"] == "fixed"
    assert eb["provenance"]["address_space"] == "fixed"  # how the worker really ran
    assert without_timestamps(ea[r["key"]]) == without_timestamps(eb)
    sha = eb["blob"]["sha256"]
    assert r["blob_sha256"] == sha
    assert _blobs(root)[sha] == _blobs(real_store)[sha]


def test_build_arch_gfx942_into_the_user_cache_then_only_hits(user_cache_gfx942):
    """The issue's acceptance: ``mono-aot build --arch gfx942`` builds narrow and wide of the
    shipped layout into the default store; running it again reports only hits."""
    _, env, doc = user_cache_gfx942
    assert sorted(r["variant"] for r in doc["results"]) == ["narrow", "wide"]
    assert all(r["status"] == "built" for r in doc["results"])
    p = run_cli("build", "--arch", "gfx942", env_extra=env, timeout=3600)
    assert p.returncode == 0, p.stderr[-4000:]
    assert p.stdout.count("hit ") >= 2 and "0 compiles" in p.stdout
    assert "built" not in p.stdout.split("\n\n")[0]
