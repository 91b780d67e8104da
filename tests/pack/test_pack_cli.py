"""``coverage`` and ``pack`` without compiling: bad input, the serving install, and packs that are
served or skipped, found through real ``importlib.metadata`` discovery of installed
distributions (a dist-info directory on ``PYTHONPATH``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mono_aot import __version__
from mono_aot.keys import served_key
from mono_aot.keys.sources import kernel_source_digest
from mono_aot.spec.layouts import resolve_layout
from mono_aot.store import Store
from mono_aot.store.packs import PACK_INDEX, PackIndex
from tests.cli.test_without_build_extra import run_hidden
from tests.pack.conftest import REPO, clean_env, mono_aot, one_variant_layout
from tests.store.helpers import make_entry

SHIPPED = "minimax-m3.1-dspark-tp4"


def shipped_keys(arch: str = "gfx942") -> dict[str, str]:
    lay = resolve_layout(SHIPPED)
    return {v: served_key(v, lay, arch) for v in lay.variants()}


def fill(root: Path, keys: dict[str, str]) -> None:
    """Entries under the served keys with stand-in bytes (the store does not care what the
    bytes are; these tests are about which layer is asked, not about kernels)."""
    store = Store.at(root)
    for variant, key in keys.items():
        data = f"{variant} code object stand-in".encode() * 10
        store.publish(make_entry(data, key, variant=variant, layout=SHIPPED), data)


def fake_pack(site: Path, arch: str, digest: str | None, keys: dict[str, str], name=None) -> Path:
    """An installed pack distribution as ``mono-aot pack`` lays it out (module, store,
    pack.json, dist-info with the entry point); ``digest=None`` writes no index."""
    module = f"mono_aot_kernels_{name or arch}"
    pkg = site / module
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\nSTORE_ROOT = Path(__file__).resolve().parent / 'store'\n"
    )
    fill(pkg / "store", keys)
    if digest is not None:
        index = PackIndex(arch, "0.0.9", digest, ({"name": SHIPPED, "digest": "x"},), ())
        (pkg / "store" / PACK_INDEX).write_text(json.dumps(index.as_json()))
    dist = site / f"{module}-0.0.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.0.9\n"
    )
    (dist / "entry_points.txt").write_text(f"[mono_aot.packs]\n{arch} = {module}:STORE_ROOT\n")
    return pkg


def with_site(tmp_path: Path, site: Path) -> dict[str, str]:
    return clean_env(tmp_path, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))


# --- bad input and the serving install ---------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (("coverage", "--arch", "gfx9"), "--arch gfx9: unknown arch (supported: gfx942, gfx950)"),
        (("pack", "--arch", "gfx9"), "--arch gfx9: unknown arch (supported: gfx942, gfx950)"),
        (("coverage", "--layout", "nosuch"), "layout 'nosuch': no such shipped layout"),
        (("pack", "--arch", "gfx942", "--out", " "), "--out: empty path"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, argv, line):
    p = mono_aot(*argv, env=clean_env(tmp_path))
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.splitlines()) == 1 and line in p.stderr, p.stderr


def test_coverage_refuses_an_arch_the_named_layout_does_not_target(tmp_path):
    layout = one_variant_layout(tmp_path)  # gfx942 only
    p = mono_aot("coverage", "--layout", layout, "--arch", "gfx950", env=clean_env(tmp_path))
    assert p.returncode == 2
    assert (
        p.stderr.strip() == f"mono-aot: layout {layout} does not target gfx950 (it targets gfx942)"
    )


def test_pack_names_the_build_extra_in_one_line_exit_2(tmp_path):
    for hide in (("flydsl",), ("build",), ("hatchling",)):
        p = run_hidden(tmp_path, "pack", "--arch", "gfx942", hide=hide)
        assert p.returncode == 2, p.stderr
        lines = [x for x in p.stderr.splitlines() if not x.startswith("LEAKED")]
        assert lines == [
            "mono-aot: mono-aot pack needs the 'build' extra: pip install 'mono-aot[build]'"
        ]


def test_coverage_works_without_the_build_extra_and_names_each_missing_key(tmp_path):
    p = run_hidden(tmp_path, "coverage", "--json")
    assert p.returncode == 1, p.stderr
    assert "LEAKED []" in p.stderr
    doc = json.loads(p.stdout)
    want = {("gfx942", v): k for v, k in shipped_keys("gfx942").items()}
    want |= {("gfx950", v): k for v, k in shipped_keys("gfx950").items()}
    assert {(r["arch"], r["variant"]): r["key"] for r in doc["keys"]} == want
    assert doc["missing"] == 4 and doc["kernel_sources"] == kernel_source_digest()
    for (arch, variant), key in want.items():
        line = (
            f"mono-aot: not served: {SHIPPED}/{arch}/{variant} key {key}; build it: "
            f"mono-aot build --arch {arch} --layout {SHIPPED} --variant {variant}, or install "
            f"mono-aot-kernels-{arch} {__version__} (made by: mono-aot pack --arch {arch})"
        )
        assert line in p.stderr.splitlines()
    assert not (tmp_path / "cache").exists()  # a miss writes nothing either


def test_coverage_reports_the_layer_that_serves_each_key(tmp_path):
    shared = tmp_path / "shared"
    fill(shared, shipped_keys("gfx942"))
    env = clean_env(tmp_path, MONO_AOT_PATH=str(shared))
    p = mono_aot("coverage", "--arch", "gfx942", env=env)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    for variant, key in shipped_keys("gfx942").items():
        assert f"served  {SHIPPED}/gfx942/{variant}  {key[:16]}  MONO_AOT_PATH {shared}" in p.stdout
    assert p.stdout.splitlines()[-1] == "2 of 2 keys served"
    # the other arch is not there: exit 1, and only its keys are named
    p = mono_aot("coverage", env=env)
    assert p.returncode == 1
    assert "2 of 4 keys served" in p.stdout
    assert [x.split()[3] for x in p.stderr.splitlines()] == [
        f"{SHIPPED}/gfx950/narrow",
        f"{SHIPPED}/gfx950/wide",
    ]


# --- packs served and skipped -----------------------------------------------------------------


def test_a_pack_of_this_kernel_source_digest_serves_and_doctor_says_so(tmp_path):
    site = tmp_path / "site"
    fake_pack(site, "gfx942", kernel_source_digest(), shipped_keys("gfx942"))
    env = with_site(tmp_path, site)
    p = mono_aot("coverage", "--arch", "gfx942", "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert {r["layer"] for r in json.loads(p.stdout)["keys"]} == {"pack gfx942"}
    doc = json.loads(mono_aot("doctor", "--json", env=env).stdout)
    (pack,) = doc["packs"]
    assert pack["status"] == "served" and pack["reason"] is None
    assert (pack["dist"], pack["dist_version"], pack["mono_aot"]) == (
        "mono-aot-kernels-gfx942", "0.0.9", "0.0.9",
    )  # fmt: skip
    text = mono_aot("doctor", env=env).stdout
    assert "pack    gfx942: mono-aot-kernels-gfx942 0.0.9  served  (mono-aot 0.0.9, " in text


def test_a_pack_of_other_kernel_sources_is_skipped_once_and_its_keys_are_missing(tmp_path):
    site = tmp_path / "site"
    other = "ab" * 32
    fake_pack(site, "gfx942", other, shipped_keys("gfx942"))  # its entries even use our keys
    env = with_site(tmp_path, site)
    p = mono_aot("coverage", "--arch", "gfx942", env=env)
    assert p.returncode == 1
    warnings = [x for x in p.stderr.splitlines() if "skipped" in x]
    assert warnings == [
        f"mono-aot: pack gfx942 (mono-aot-kernels-gfx942 0.0.9, {site / 'mono_aot_kernels_gfx942' / 'store'}) "
        f"skipped: built for mono-aot 0.0.9 with kernel sources {other[:16]}..., but the installed "
        f"mono-aot {__version__} has kernel sources {kernel_source_digest()[:16]}...; none of its "
        "entries is served (install the pack built for this mono-aot, or rebuild it: mono-aot "
        "pack --arch gfx942)"
    ]
    for key in shipped_keys("gfx942").values():
        assert f"key {key}; build it" in p.stderr
    doc = json.loads(mono_aot("doctor", "--json", env=env).stdout)
    assert doc["packs"][0]["status"] == "skipped" and other[:16] in doc["packs"][0]["reason"]
    # once per process, however many stores are made; the library call without a digest
    # (what the build does: its keys carry the digest anyway) only checks that packs load
    code = textwrap.dedent("""
        import logging, sys
        from mono_aot.keys.sources import kernel_source_digest
        from mono_aot.store import Store
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="W %(message)s")
        for _ in range(3):
            s = Store.default(kernel_sources=kernel_source_digest())
            assert [layer.label for layer in s.layers] == ["user cache"], s.layers
        assert [layer.label for layer in Store.default().layers] == ["user cache", "pack gfx942"]
    """)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert len([x for x in p.stderr.splitlines() if x.startswith("W ")]) == 1, p.stderr


def test_a_pack_with_a_damaged_index_is_skipped_and_one_without_is_served(tmp_path):
    site = tmp_path / "site"
    bad = fake_pack(site, "gfx942", kernel_source_digest(), shipped_keys("gfx942"))
    (bad / "store" / PACK_INDEX).write_text('{"format": "mono-aot.pack", "version": 1}')
    fake_pack(site, "gfx950", None, shipped_keys("gfx950"))  # made by hand: no index
    env = with_site(tmp_path, site)
    p = mono_aot("coverage", "--json", env=env)
    assert p.returncode == 1
    served = {(r["arch"], r["layer"]) for r in json.loads(p.stdout)["keys"]}
    assert served == {("gfx942", None), ("gfx950", "pack gfx950")}
    assert f"{bad / 'store' / PACK_INDEX}: not a mono-aot pack index: 'kernel_sources'" in p.stderr
