"""``mono-aot build`` end to end: real compiles in subprocesses into real stores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mono_aot.compiler.compile import disassemble
from mono_aot.compiler.inputs import directory_provider
from mono_aot.spec.layouts import shipped_layouts
from mono_aot.store import Store, encode_entry
from mono_aot.store.entry import Entry
from tests.conftest import sigint_to_threads

from .conftest import (
    DEMO,
    FIXTURES,
    build_json,
    demo_provider,
    entry_docs,
    provider_spec,
    run_cli,
    store_files,
    without_timestamps,
)

pytestmark = pytest.mark.slow


def test_builds_both_variants_on_both_archs(demo_store):
    root, doc = demo_store
    s = doc["summary"]
    assert (s["jobs"], s["built"], s["failed"], s["compiles"]) == (4, 4, 0, 4)
    assert {(r["arch"], r["variant"]) for r in doc["results"]} == {
        (a, v) for a in ("gfx942", "gfx950") for v in ("narrow", "wide")
    }
    entries = entry_docs(root)
    assert len(entries) == 4
    lay = shipped_layouts()[0]
    for e in entries.values():
        assert e["symbol"] == f"demo_{e['variant']}_0"
        assert e["launch"] == {"grid": lay.ctas(e["arch"]), "block": 512, "dynamic_lds": 0}
        assert [k["name"] for k in e["kernargs"]] == ["out", "scratch", "n"]
        assert e["elf"]["e_flags"] == {"gfx942": 0x54C, "gfx950": 0x54F}[e["arch"]]
        assert e["resources"]["scratch"] == 0 and e["resources"]["code_bytes"] > 0
        assert e["lookup_inputs"]["ctas"] == lay.ctas(e["arch"])
        assert e["build_inputs"]["linker"]["version"].startswith("LLD")
    # and the store serves them, verified
    store = Store.at(root)
    for r in doc["results"]:
        hit = store.lookup(r["key"])
        assert hit is not None and hit.entry.blob.sha256 == r["blob_sha256"]


def test_second_run_is_all_hits_and_compiles_nothing(demo_store_copy):
    before = store_files(demo_store_copy)
    doc = build_json(demo_store_copy)
    assert doc["summary"]["hit"] == 4 and doc["summary"]["compiles"] == 0
    assert store_files(demo_store_copy) == before
    p = run_cli("build", "--provider", DEMO, "--store", str(demo_store_copy))
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("hit ") >= 4 and "0 compiles" in p.stdout


def test_reproducible_and_independent_of_parallelism(demo_store, tmp_path):
    """-j 1 into another empty store: byte-identical blobs, entries equal but for timestamps."""
    root2 = tmp_path / "store"
    doc = build_json(root2, "-j", "1")
    assert doc["summary"]["compiles"] == 4
    a, b = store_files(demo_store[0]), store_files(root2)
    assert sorted(a) == sorted(b)
    for rel in a:
        if "/blobs/" in f"/{rel}":
            assert a[rel] == b[rel], rel
    ea, eb = entry_docs(demo_store[0]), entry_docs(root2)
    for rel in ea:
        assert without_timestamps(ea[rel]) == without_timestamps(eb[rel]), rel


def test_two_builders_on_one_store_compile_each_key_once(tmp_path):
    root = tmp_path / "store"
    cmd = [
        sys.executable,
        "-m",
        "mono_aot",
        "build",
        "--provider",
        DEMO,
        "--store",
        str(root),
        "--arch",
        "gfx942",
        "--json",
    ]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    docs = [json.loads(o[0]) for o in outs]
    assert sum(d["summary"]["compiles"] for d in docs) == 2
    for key in {r["key"] for d in docs for r in d["results"]}:
        statuses = sorted(r["status"] for d in docs for r in d["results"] if r["key"] == key)
        assert statuses == ["built", "hit"], (key, statuses)
    assert len(entry_docs(root)) == 2


def test_an_aborting_compile_fails_its_job_and_the_others_publish(tmp_path):
    root = tmp_path / "store"
    doc = build_json(root, "--arch", "gfx942", provider=provider_spec("faulty"), expect=1)
    by = {r["variant"]: r for r in doc["results"]}
    assert by["narrow"]["status"] == "built"
    assert by["wide"]["status"] == "failed"
    reason = by["wide"]["reason"]
    assert "faulty_kernels wide for gfx942" in reason and "signal 6" in reason
    assert "Assertion" in reason  # the tail of the compiler's stderr
    assert [e["variant"] for e in entry_docs(root).values()] == ["narrow"]
    p = run_cli(
        "build", "--provider", provider_spec("faulty"), "--store", str(root), "--arch", "gfx942"
    )
    assert p.returncode == 1
    assert "failed   minimax-m3.1-dspark-tp4/gfx942/wide" in p.stdout
    assert "hit      minimax-m3.1-dspark-tp4/gfx942/narrow" in p.stdout
    assert "1 of 2 jobs failed" in p.stderr


def test_spills_scratch_and_compiler_errors_are_refused_with_numbers(tmp_path):
    root = tmp_path / "store"
    doc = build_json(root, "--arch", "gfx942", provider=provider_spec("greedy"), expect=1)
    by = {r["variant"]: r for r in doc["results"]}
    spill = {v["rule"]: v for v in by["narrow"]["violations"]}
    assert {"scratch", "spills"} <= set(spill)
    assert spill["scratch"]["kernel"] == "greedy_spill_0" and spill["scratch"]["arch"] == "gfx942"
    assert "private_segment_fixed_size" in spill["scratch"]["detail"]
    assert any(ch.isdigit() for ch in spill["spills"]["detail"].split(" VGPR")[0])
    tanh = {v["rule"]: v for v in by["wide"]["violations"]}
    assert "no libcall available" in tanh["compile"]["detail"]
    assert entry_docs(root) == {}


def test_coresidency_refuses_lds_beyond_the_cu_only_where_it_does_not_fit(tmp_path):
    root = tmp_path / "store"
    doc = build_json(root, "--variant", "narrow", provider=provider_spec("hog"), expect=1)
    by = {r["arch"]: r for r in doc["results"]}
    assert by["gfx950"]["status"] == "built"
    rules = {v["rule"]: v["detail"] for v in by["gfx942"]["violations"]}
    assert "98304 bytes > 65536 per CU" in rules["co-residency"]
    [e] = entry_docs(root).values()
    assert e["arch"] == "gfx950" and e["resources"]["lds"] == 98304


def test_an_entry_from_another_toolchain_is_stale_and_replaced(demo_store_copy):
    store = Store.at(demo_store_copy)
    [job] = [
        r
        for r in build_json(demo_store_copy, "--dry-run", "--arch", "gfx942", "--variant", "wide")[
            "plan"
        ]
    ]
    hit = store.lookup(job["key"])
    old_inputs = json.loads(json.dumps(hit.entry.build_inputs))
    old_inputs["linker"] = {"version": "LLD 19.1.0", "sha256": "0" * 64}
    forged = Entry.model_validate({**hit.entry.model_dump(mode="json"), "build_inputs": old_inputs})
    hit.entry_path.write_bytes(encode_entry(forged))
    plan = build_json(demo_store_copy, "--dry-run", "--arch", "gfx942")["plan"]
    assert {p["variant"]: p["status"] for p in plan} == {"narrow": "hit", "wide": "stale"}
    doc = build_json(demo_store_copy, "--arch", "gfx942")
    by = {r["variant"]: r for r in doc["results"]}
    assert by["narrow"]["status"] == "hit"
    assert by["wide"]["status"] == "rebuilt" and "linker LLD 19.1.0 -> LLD" in by["wide"]["reason"]
    assert doc["summary"]["compiles"] == 1
    assert store.lookup(job["key"]).entry.build_inputs == job["build_inputs"]


def test_dry_run_plans_without_compiling(tmp_path):
    root = tmp_path / "store"
    doc = build_json(root, "--dry-run")
    assert [p["status"] for p in doc["plan"]] == ["miss"] * 4
    assert all(len(p["key"]) == 64 and p["lookup_inputs"]["arch"] == p["arch"] for p in doc["plan"])
    assert not root.exists() or store_files(root) == {}
    p = run_cli("build", "--provider", DEMO, "--store", str(root), "--dry-run", "--arch", "gfx950")
    assert p.returncode == 0
    assert p.stdout.count("miss ") == 2 and "gfx942" not in p.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--arch", "gfx940"], "unknown arch"),
        (["--variant", "medium"], "medium"),
        (["--layout", "no-such-layout"], "no such shipped layout"),
        (["-j", "0"], "-j"),
    ],
)
def test_bad_input_exits_2(tmp_path, args, needle):
    p = run_cli("build", "--provider", DEMO, "--store", str(tmp_path / "s"), "--dry-run", *args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert needle in p.stderr


def test_an_arch_the_layout_does_not_target_is_bad_input(tmp_path):
    src = shipped_layouts()[0]
    text = (FIXTURES.parent.parent.parent / "layouts" / f"{src.name}.toml").read_text()
    spec = tmp_path / "only950.toml"
    spec.write_text(text.split("[targets.gfx942]")[0] + "[targets.gfx950]\nctas = 256\n")
    p = run_cli(
        "build",
        "--provider",
        DEMO,
        "--store",
        str(tmp_path / "s"),
        "--layout",
        str(spec),
        "--arch",
        "gfx942",
        "--dry-run",
    )
    assert p.returncode == 2
    assert "layout only950 does not target gfx942" in p.stderr


def test_a_hung_compile_is_killed_and_reported(tmp_path):
    doc = build_json(
        tmp_path / "s",
        "--arch",
        "gfx942",
        "--variant",
        "narrow",
        "--timeout",
        "3",
        provider=provider_spec("hang"),
        expect=1,
    )
    [r] = doc["results"]
    assert r["status"] == "failed" and "did not finish within 3 s and was killed" in r["reason"]


def test_isa_text_for_tests(tmp_path):
    lay = shipped_layouts()[0]
    isa = disassemble(demo_provider(), "narrow", lay, "gfx942", tmp_path / "isa")
    assert "demo_narrow_0:" in isa
    assert "global_store_dword" in isa and "global_atomic_add" in isa and "s_endpgm" in isa
    assert "amdgcn-amd-amdhsa-unknown-gfx942" in isa


def test_fixture_provider_sources_are_the_fixture_files():
    prov = directory_provider(FIXTURES / "demo", "demo_kernels")
    rels = {rel for rel, _ in prov.sources}
    assert "provider/demo_kernels.py" in rels and "mono_aot/spec/abi.py" in rels


def test_default_store_is_the_user_cache_and_force_rebuilds(tmp_path):
    env = {"MONO_AOT_CACHE_DIR": str(tmp_path / "cache"), "MONO_AOT_PATH": ""}
    args = ("build", "--provider", DEMO, "--arch", "gfx950", "--variant", "wide", "--json")
    first = json.loads(run_cli(*args, env_extra=env).stdout)
    [r1] = first["results"]
    assert r1["status"] == "built" and r1["layer"] == "user cache"
    assert len(entry_docs(tmp_path / "cache")) == 1
    p = run_cli(*args, "--force", env_extra=env)
    assert p.returncode == 0, p.stderr
    [r2] = json.loads(p.stdout)["results"]
    assert r2["status"] == "rebuilt" and r2["compiled"] and r2["reason"] == "--force"
    assert r2["blob_sha256"] == r1["blob_sha256"]
    assert len(entry_docs(tmp_path / "cache")) == 1


def test_key_and_bytes_do_not_depend_on_where_the_sources_are(demo_store, tmp_path):
    import shutil

    moved = tmp_path / "elsewhere" / "kernels"
    shutil.copytree(FIXTURES / "demo", moved, ignore=shutil.ignore_patterns("__pycache__"))
    doc = build_json(
        tmp_path / "store",
        "--arch",
        "gfx942",
        "--variant",
        "narrow",
        provider=f"{moved}:demo_kernels",
        cwd=tmp_path,
    )
    [r] = doc["results"]
    [ref] = [
        x for x in demo_store[1]["results"] if (x["arch"], x["variant"]) == ("gfx942", "narrow")
    ]
    assert (r["key"], r["blob_sha256"]) == (ref["key"], ref["blob_sha256"])


def build_workers(tmp: Path) -> list[int]:
    """Compile worker processes of a build whose TMPDIR is ``tmp``: they run in an output
    directory under it."""
    import os

    pids = []
    for d in Path("/proc").iterdir():
        try:
            cmdline = (d / "cmdline").read_bytes()
            cwd = Path(os.readlink(d / "cwd"))
        except OSError:
            continue
        if b"mono_aot.compiler.worker" in cmdline and tmp.resolve() in cwd.parents:
            pids.append(int(d.name))
    return pids


@pytest.mark.parametrize(("signame", "code", "said"), [
    ("SIGINT", 130, "interrupted"),
    ("SIGTERM", 143, "terminated"),  # e.g. a batch scheduler or timeout(1): no orphans either
])  # fmt: skip
def test_interrupting_a_build_stops_its_workers(tmp_path, signame, code, said):
    import os
    import signal
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "MONO_AOT_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [
        sys.executable,
        "-m",
        "mono_aot",
        "build",
        "--provider",
        provider_spec("hang"),
        "--store",
        str(tmp_path / "s"),
        "--arch",
        "gfx942",
        "--timeout",
        "600",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def workers() -> list[int]:
        return build_workers(tmp)

    for _ in range(600):
        if len(list(tmp.glob("*/request.json"))) == 2 and len(workers()) == 2:
            break
        time.sleep(0.1)
    else:
        proc.kill()
        raise AssertionError(f"the workers did not start: {proc.communicate()}")
    proc.send_signal(getattr(signal, signame))
    out, err = proc.communicate(timeout=120)
    # an interrupt exits 128 + the signal, as shells report it, and no job reports a failure
    assert proc.returncode == code, (out, err)
    assert f"mono-aot: {said}" in err and "failed" not in out
    for _ in range(100):
        if not workers():
            break
        time.sleep(0.1)
    assert workers() == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tgkill is Linux's")
def test_ctrl_c_delivered_to_a_pool_thread_still_stops_the_build(tmp_path):
    """The kernel may deliver a process's SIGINT to any of its threads; Python runs the handler
    in the main thread only when that thread wakes, so the build must not sleep in a wait
    without timeout (it did: the interrupt was lost until a job finished, 600 s here)."""
    import contextlib
    import os
    import signal
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "MONO_AOT_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "mono_aot", "build", "--provider", provider_spec("hang"),
           "--store", str(tmp_path / "s"), "--arch", "gfx942", "--timeout", "600"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        if len(list(tmp.glob("*/request.json"))) == 2:
            break
        time.sleep(0.1)
    try:
        assert sigint_to_threads(proc.pid)  # the build's job threads
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130 and "mono-aot: interrupted" in err, (out, err)
    finally:  # a build that slept through it leaves nothing behind either
        proc.kill()
        for pid in build_workers(tmp):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        proc.wait()


def test_an_empty_store_path_is_bad_input_not_the_user_cache(tmp_path):
    cache = tmp_path / "user-cache"
    p = run_cli(
        "build", "--provider", DEMO, "--store", "", "--arch", "gfx942", "--variant", "narrow",
        env_extra={"MONO_AOT_CACHE_DIR": str(cache)},
    )  # fmt: skip
    assert p.returncode == 2 and "--store: empty path" in p.stderr, p.stderr
    assert not cache.exists()


def test_a_provider_module_missing_from_its_directory_is_bad_input(tmp_path):
    # caught before planning, rather than as one failed compile per job
    p = run_cli("build", "--provider", f"{tmp_path}:nomodule", "--store", str(tmp_path / "s"))
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert f"no module 'nomodule' in {tmp_path}" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "s").exists()
