"""The serving install, for real: the ``mono-aot`` wheel and a pack wheel installed by pip into a
fresh virtual environment with no build extra, its files read-only, ``HOME`` an empty directory.

As root (CI), ``chmod a-w`` stops nothing, so the served commands run as uid ``nobody`` there,
which really cannot write; either way every file of the venv, ``HOME`` and ``TMPDIR`` is compared
before and after, so "nothing is written" is checked, not assumed. Bytecode writing stays on
(pip precompiles the installed modules, so imports need to write nothing).

The venv gets mono-aot's real dependencies from pip's configured sources (``torch==2.13.0``
pinned exactly; the CPU build is a local wheel on the build hosts): about a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from mono_aot import __version__
from mono_aot.keys import served_key
from mono_aot.keys.sources import kernel_source_digest
from mono_aot.spec.layouts import load_layout, resolve_layout
from mono_aot.store import Store
from tests.store.helpers import snapshot

pytestmark = pytest.mark.slow
NOBODY = 65534
BUILD_ONLY = ("flydsl", "ziglang", "msgpack", "elftools", "build", "hatchling", "numpy")
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"

# What the runtime loader does to get a kernel's bytes: mono_aot.runtime.miss.find_or_build in
# strict mode (a miss raises instead of building), over the store layers serving reads.
LOOKUP = textwrap.dedent("""
    import hashlib, json, sys
    import mono_aot.keys.sources as sources

    def parsed():
        raise AssertionError("the installed mono-aot parsed its kernel sources")

    sources.parse_kernel_sources = parsed  # an installed wheel reads its manifest instead
    import os
    from mono_aot.keys import served_key
    from mono_aot.keys.sources import kernel_source_digest
    from mono_aot.runtime.miss import KernelMissing, find_or_build, served_store
    from mono_aot.spec.layouts import resolve_layout

    layout = resolve_layout("minimax-m3.1-dspark-tp4")
    env = {**os.environ, "MONO_AOT_STRICT": "1"}
    store = served_store(env)
    out = {"digest": kernel_source_digest(), "layers": [l.label for l in store.layers], "hits": {}}
    for variant in ("narrow", "wide"):
        try:
            hit = find_or_build(served_key(variant, layout, "gfx942"), variant, layout, "gfx942",
                                env=env)
        except KernelMissing:
            hit = None
        out["hits"][variant] = None if hit is None else {
            "sha256": hashlib.sha256(hit.data).hexdigest(), "size": len(hit.data),
            "entry_blob": hit.entry.blob.sha256, "layer": hit.layer.label,
            "writable": hit.layer.writable, "root": str(hit.layer.root),
        }
    out["modules"] = sorted({m.split(".")[0] for m in sys.modules})
    print(json.dumps(out))
""")


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _interpreter(as_nobody: bool) -> str:
    """A Python of this version that can make a venv (and that nobody can run, as root)."""
    cands = [os.path.realpath(getattr(sys, "_base_executable", sys.executable))]
    cands += [str(Path(d) / PY) for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    for exe in dict.fromkeys(c for c in cands if os.path.isfile(c)):
        try:
            r = subprocess.run(
                [exe, "-c", "import venv, ensurepip, sys; print(sys.version_info[:2])"],
                cwd="/",
                preexec_fn=_as_nobody if as_nobody else None,
                capture_output=True,
                text=True,
            )
        except OSError:  # e.g. under a directory only root may enter
            continue
        if r.returncode == 0 and r.stdout.strip() == str(tuple(sys.version_info[:2])):
            return exe
    pytest.skip(f"no {PY} that can create a venv" + (" and that uid nobody can run" * as_nobody))


def _chmod_tree(root: Path, writable: bool) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames, None]:
            p = Path(dirpath) / name if name else Path(dirpath)
            if p.is_symlink():
                continue
            mode = p.stat().st_mode
            os.chmod(p, (mode | 0o200) if writable else (mode & ~0o222))


def _pip(venv: Path, *args: str) -> None:
    p = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]


@pytest.fixture
def top():
    d = Path(tempfile.mkdtemp(prefix="mono-aot-serving-"))  # tmp_path is private to root
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        _chmod_tree(d, writable=True)
        shutil.rmtree(d, ignore_errors=True)


def test_a_fresh_read_only_serving_install_serves_verified_bytes_and_writes_nothing(
    top, pack_build, mono_aot_wheel, skewed_pack
):
    as_nobody = os.geteuid() == 0
    venv, wheels, home, tmp = top / "venv", top / "wheels", top / "home", top / "tmp"
    for d in (wheels, home, tmp):
        d.mkdir()
    shutil.copy(mono_aot_wheel, wheels)
    shutil.copy(pack_build.wheel, wheels)
    skew_layout = top / skewed_pack.layout.name
    shutil.copy(skewed_pack.layout, skew_layout)
    old = os.umask(0o022)
    try:
        subprocess.run([_interpreter(as_nobody), "-m", "venv", str(venv)], check=True, timeout=300)
        _pip(
            venv, "install", "--quiet", "--find-links", str(wheels),
            f"mono-aot=={__version__}", f"mono-aot-kernels-gfx942=={__version__}", "torch==2.13.0",
        )  # fmt: skip
    finally:
        os.umask(old)
    if as_nobody:
        for d in (home, tmp):
            os.chown(d, NOBODY, NOBODY)

    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp)}

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(venv / "bin" / argv[0]), *argv[1:]],
            env=env,
            cwd=str(home),
            preexec_fn=_as_nobody if as_nobody else None,
            capture_output=True,
            text=True,
            timeout=300,
        )

    # no build extra: none of its packages can be imported
    probe = f"import importlib.util as u; print([m for m in {BUILD_ONLY!r} if u.find_spec(m)])"
    p = run("python", "-c", probe)
    assert (p.returncode, p.stdout.strip()) == (0, "[]"), p.stderr

    _chmod_tree(venv, writable=False)
    before = snapshot(venv)

    p = run("mono-aot", "coverage", "--arch", "gfx942", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [(r["variant"], r["layer"]) for r in doc["keys"]] == [
        ("narrow", "pack gfx942"),
        ("wide", "pack gfx942"),
    ]
    assert doc["kernel_sources"] == kernel_source_digest()

    p = run("python", "-c", LOOKUP)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["digest"] == kernel_source_digest()  # from the manifest: parsing would raise
    assert got["layers"] == ["user cache", "pack gfx942"]
    lay = resolve_layout("minimax-m3.1-dspark-tp4")
    source = Store.at(pack_build.store, writable=False)
    for variant, hit in got["hits"].items():
        want = source.lookup(served_key(variant, lay, "gfx942"))
        assert hit["sha256"] == hit["entry_blob"] == want.entry.blob.sha256
        assert hit["size"] == len(want.data)
        assert (hit["layer"], hit["writable"]) == ("pack gfx942", False)
        assert hit["root"].startswith(str(venv))
    assert not set(BUILD_ONLY) & set(got["modules"]) and "torch" not in got["modules"]

    p = run("mono-aot", "doctor", "--json")
    assert p.returncode == 0, p.stderr
    (pack,) = json.loads(p.stdout)["packs"]
    assert (pack["name"], pack["dist_version"], pack["status"]) == ("gfx942", __version__, "served")

    assert snapshot(venv) == before, "the serving install changed files in the venv"
    assert os.listdir(home) == [], "something was written under HOME (the user cache?)"
    assert os.listdir(tmp) == []

    # without the pack: coverage names each missing key and the command that builds it
    _chmod_tree(venv, writable=True)
    _pip(venv, "uninstall", "--yes", "mono-aot-kernels-gfx942")
    _chmod_tree(venv, writable=False)
    p = run("mono-aot", "coverage", "--arch", "gfx942")
    assert p.returncode == 1
    for variant in ("narrow", "wide"):
        key = served_key(variant, lay, "gfx942")
        assert (
            f"mono-aot: not served: {lay.name}/gfx942/{variant} key {key}; build it: mono-aot "
            f"build --arch gfx942 --layout {lay.name} --variant {variant}"
        ) in p.stderr

    # a pack built from other kernel sources: skipped with one warning, its keys missing
    _chmod_tree(venv, writable=True)
    _pip(venv, "install", "--quiet", "--no-index", "--no-deps", str(skewed_pack.wheel))
    _chmod_tree(venv, writable=False)
    (skew,) = skewed_pack.doc["wheels"]
    assert skew["kernel_sources"] != kernel_source_digest()
    p = run("mono-aot", "coverage", "--arch", "gfx942", "--layout", str(skew_layout))
    assert p.returncode == 1
    warnings = [x for x in p.stderr.splitlines() if "skipped" in x]
    assert len(warnings) == 1, p.stderr
    assert (
        f"mono-aot: pack gfx942 (mono-aot-kernels-gfx942 {__version__}, " in warnings[0]
        and f"skipped: built for mono-aot {__version__} with kernel sources "
        f"{skew['kernel_sources'][:16]}..., but the installed mono-aot {__version__} has kernel "
        f"sources {kernel_source_digest()[:16]}...; none of its entries is served"
        in warnings[0]
    )
    (entry,) = skew["entries"]
    wide = served_key("wide", load_layout(skew_layout), "gfx942")
    assert entry["key"] != wide  # the pack holds this layout's wide kernel, under its own key
    assert f"not served: {skewed_pack.layout.stem}/gfx942/wide key {wide}" in p.stderr
    p = run("mono-aot", "doctor", "--json")
    (pack,) = json.loads(p.stdout)["packs"]
    assert pack["status"] == "skipped" and skew["kernel_sources"][:16] in pack["reason"]
    assert os.listdir(home) == [] and os.listdir(tmp) == []
