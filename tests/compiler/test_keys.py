"""The lookup key changes with every key input and with nothing else; build inputs likewise."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from mono_aot.compiler.inputs import build_inputs, directory_provider, installed_package_digest
from mono_aot.compiler.plan import current_toolchain, plan_jobs
from mono_aot.compiler.toolchain import find_linker, probe
from mono_aot.keys import lookup_key, real_provider
from mono_aot.spec.errors import BadInput
from mono_aot.spec.layouts import load_layout, parse_layout, shipped_layout_paths

from .conftest import FIXTURES

SHIPPED = shipped_layout_paths()[0]


@pytest.fixture
def provider(tmp_path):
    d = tmp_path / "prov"
    shutil.copytree(FIXTURES / "demo", d, ignore=shutil.ignore_patterns("__pycache__"))
    return directory_provider(d, "demo_kernels")


def _doc() -> dict:
    return tomllib.loads(SHIPPED.read_text())


def _layout(doc: dict, name: str = "lay"):
    return parse_layout(doc, "test", name=name)


def test_layout_file_formatting_does_not_change_the_key(tmp_path, provider):
    base = load_layout(SHIPPED)
    text = SHIPPED.read_text()
    # comments and whitespace
    noisy = "# a new comment\n\n" + text.replace(" = ", "   =   ").replace(
        "\n[", "\n\n# section\n["
    )
    # key order: write every table's keys reversed
    doc = _doc()
    lines = []
    for k, v in reversed(list(doc.items())):
        if not isinstance(v, dict):
            lines.append(f"{k} = {v!r}".replace("'", '"'))
    for section, table in reversed(list(doc.items())):
        if not isinstance(table, dict):
            continue
        if section == "targets":
            for arch, t in reversed(list(table.items())):
                lines.append(f"[targets.{arch}]\nctas = {t['ctas']}")
            continue
        lines.append(f"[{section}]")
        for k, v in reversed(list(table.items())):
            lines.append(f"{k} = {json.dumps(v)}")  # TOML's spelling of bools and strings
    reordered = "\n".join(lines) + "\n"
    for i, body in enumerate((noisy, reordered)):
        p = tmp_path / f"v{i}" / SHIPPED.name
        p.parent.mkdir()
        p.write_text(body)
        other = load_layout(p)
        for arch in base.archs:
            for v in ("narrow", "wide"):
                assert lookup_key(provider, v, other, arch) == lookup_key(provider, v, base, arch)


def test_name_description_and_runner_only_fields_do_not_change_the_key(provider):
    base = _layout(_doc())
    doc = _doc()
    doc["description"] = "something else"
    doc["serving"]["max_reqs"] = 512  # sizes the runner's buffers only
    other = _layout(doc, name="renamed")
    assert lookup_key(provider, "wide", other, "gfx942") == lookup_key(
        provider, "wide", base, "gfx942"
    )


@pytest.mark.parametrize(
    "section,field,value",
    [
        ("model", "layers", 4),
        ("model", "hidden", 4096),
        ("model", "norm_eps", 1e-5),
        ("model", "swiglu_alpha", 1.5),
        ("model", "swiglu_limit", 8.0),
        ("model", "rotary_dim", 32),
        ("model", "mlp", 8192),
        ("serving", "kv_block", 32),
        ("serving", "qpr", 4),
        ("serving", "chunk_reqs", 9),
        ("serving", "wide_base", 2),  # wide base
        ("serving", "peer_wait_s", 2.5),  # wait ticks
        ("kernel", "threads", 256),
    ],
)
def test_every_codegen_field_changes_the_key(provider, section, field, value):
    base = _layout(_doc())
    doc = _doc()
    doc[section][field] = value
    other = _layout(doc)
    for v in ("narrow", "wide"):
        assert lookup_key(provider, v, other, "gfx942") != lookup_key(provider, v, base, "gfx942")


def test_variant_arch_and_cta_count_change_the_key(provider):
    base = _layout(_doc())
    keys = {
        lookup_key(provider, v, base, a) for v in ("narrow", "wide") for a in ("gfx942", "gfx950")
    }
    assert len(keys) == 4
    doc = _doc()
    doc["targets"]["gfx942"]["ctas"] = 228
    assert lookup_key(provider, "wide", _layout(doc), "gfx942") != lookup_key(
        provider, "wide", base, "gfx942"
    )
    # another arch's CTA count is not this job's input
    assert lookup_key(provider, "wide", _layout(doc), "gfx950") == lookup_key(
        provider, "wide", base, "gfx950"
    )


def test_any_kernel_source_edit_changes_the_key(provider):
    lay = _layout(_doc())
    before = lookup_key(provider, "narrow", lay, "gfx942")
    src = provider.search_path / "demo_kernels.py"
    original = src.read_bytes()
    for edited in (
        original + b"# a comment\n",
        original.replace(b"    ", b"\t", 1),
        b" " + original,
    ):
        src.write_bytes(edited)
        assert lookup_key(provider, "narrow", lay, "gfx942") != before
    src.write_bytes(original)
    assert lookup_key(provider, "narrow", lay, "gfx942") == before
    helper = provider.search_path / "helper.py"
    helper.write_text("X = 1\n")  # a new module the kernels could import
    grown = directory_provider(provider.search_path, "demo_kernels")
    assert lookup_key(grown, "narrow", lay, "gfx942") != before
    other_module = dataclasses.replace(provider, module="other_kernels")
    assert lookup_key(other_module, "narrow", lay, "gfx942") != before


def test_real_provider_sources_cover_kernels_and_contract():
    prov = real_provider()
    rels = [rel for rel, _ in prov.sources]
    assert {"mono_aot/spec/abi.py", "mono_aot/spec/layouts.py", "mono_aot/spec/arch.py"} <= set(
        rels
    )
    assert all(r.startswith("mono_aot/") and r.endswith(".py") for r in rels)
    assert not any("__pycache__" in r for r in rels)
    kernels = Path(real_provider().sources[0][1]).parent / "kernels"
    if kernels.is_dir():
        for f in kernels.rglob("*.py"):
            if "__pycache__" not in f.parts:
                assert f"mono_aot/kernels/{f.relative_to(kernels).as_posix()}" in rels


def test_project_modules_the_kernels_import_are_sources(provider):
    src = provider.search_path / "demo_kernels.py"
    src.write_text(
        src.read_text()
        + "\n\ndef _unused():\n    from mono_aot.store.paths import user_cache_root\n"
        "    import mono_aot.compiler.toolchain\n"
    )
    rels = {rel for rel, _ in directory_provider(provider.search_path, "demo_kernels").sources}
    assert {
        "mono_aot/store/paths.py",
        "mono_aot/compiler/toolchain.py",
        "mono_aot/spec/errors.py",
    } <= rels
    assert "provider/demo_kernels.py" in rels
    assert not any(r.startswith("tests/") for r in rels)


def test_keys_never_import_flydsl():
    """The runtime computes keys with no compiler installed: keys.py must not import FlyDSL."""
    code = (
        "import sys; import mono_aot.keys as k; from mono_aot.spec.layouts import shipped_layouts;"
        "lay = shipped_layouts()[0]; print(k.lookup_key(k.real_provider(), 'wide', lay, 'gfx942'));"
        "bad = [m for m in sys.modules"
        " if m.split('.')[0] in ('flydsl', 'torch') or m.startswith('mono_aot.compiler')];"
        "assert not bad, bad"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.strip()) == 64


def test_a_different_linker_binary_changes_build_inputs_not_the_key(tmp_path, provider):
    lay = _layout(_doc())
    real = find_linker()
    wrapper = tmp_path / "ld.lld"
    wrapper.write_text(
        "#!/bin/sh\n# another build of the same linker\nexec "
        + " ".join(f"'{a}'" for a in real.argv)
        + ' "$@"\n'
    )
    wrapper.chmod(0o755)
    other = probe((str(wrapper),), wrapper, "MONO_AOT_LLD")
    assert other.version == real.version and other.sha256 != real.sha256
    tc = current_toolchain(real)
    tc2 = dataclasses.replace(tc, linker=other)
    [a] = plan_jobs([lay], ["gfx942"], ["wide"], provider, tc)
    [b] = plan_jobs([lay], ["gfx942"], ["wide"], provider, tc2)
    assert a.key == b.key
    assert a.build_inputs != b.build_inputs
    assert a.build_inputs["linker"]["sha256"] == real.sha256


def test_build_inputs_hold_no_paths_or_host_facts(provider):
    tc = current_toolchain()
    [job] = plan_jobs([_layout(_doc())], ["gfx950"], ["narrow"], provider, tc)
    text = repr(job.build_inputs) + repr(job.lookup_inputs)
    for fact in (os.uname().nodename, str(Path.home()), str(provider.search_path), sys.prefix):
        assert fact not in text
    assert job.build_inputs == build_inputs(
        flydsl=tc.flydsl_identity(),
        linker=tc.linker.identity(),
        options=job.build_inputs["options"],
    )
    assert installed_package_digest("flydsl") == installed_package_digest.__wrapped__("flydsl")


def test_plan_refuses_bad_selections(provider):
    tc = current_toolchain()
    doc = _doc()
    del doc["targets"]["gfx942"]
    only950 = _layout(doc, name="only950")
    with pytest.raises(BadInput, match="layout only950 does not target gfx942 .*targets gfx950"):
        plan_jobs([only950], ["gfx942"], [], provider, tc)
    with pytest.raises(BadInput, match="unknown arch"):
        plan_jobs([only950], ["gfx940"], [], provider, tc)
    doc = _doc()
    doc["serving"]["wide_base"] = 1
    wide_only = _layout(doc, name="wideonly")
    assert [j.variant for j in plan_jobs([wide_only], [], [], provider, tc)] == ["wide", "wide"]
    with pytest.raises(BadInput, match="layout wideonly has no narrow kernel"):
        plan_jobs([wide_only], [], ["narrow"], provider, tc)
