"""The publish rules, on a real code object and on metadata changed one number at a time."""

from __future__ import annotations

import dataclasses
import zlib

import pytest

from mono_aot.compiler.checks import Expectation, check, coresidency
from mono_aot.compiler.codeobject import CodeObjectError, KernelMeta, parse_code_object
from mono_aot.compiler.extract import (
    ExtractError,
    artifact_ir_text,
    gpu_objects,
    launches,
    unescape_mlir_string,
)
from mono_aot.spec.arch import arch_info

from .conftest import store_files

GOOD_LAUNCH = [
    {"kernel": "demo_narrow_0", "grid": [304, 1, 1], "block": [512, 1, 1], "dynamic_lds": 0}
]
EXPECT = Expectation(
    kernel="demo_narrow_0",
    arch="gfx942",
    ctas=304,
    threads=512,
    kernargs=(("out", 0, 8), ("scratch", 8, 8), ("n", 16, 4)),
)


@pytest.fixture(scope="module")
def narrow_942(demo_store):
    """The demo narrow gfx942 code object and its parsed metadata (from the shared build)."""
    root, doc = demo_store
    [res] = [r for r in doc["results"] if r["variant"] == "narrow" and r["arch"] == "gfx942"]
    sha = res["blob_sha256"]
    [data] = [d for rel, d in store_files(root).items() if rel.endswith(sha)]
    return data, parse_code_object(data)


def _rules(violations):
    return sorted({v.rule for v in violations})


def test_real_code_object_passes_and_reads_right(narrow_942):
    data, meta = narrow_942
    assert (meta.machine, meta.osabi, meta.abi_version, meta.e_flags) == (224, 64, 4, 0x54C)
    assert meta.target.endswith("gfx942")
    assert "LLD" in meta.comment
    [k] = meta.kernels
    assert (k.name, k.symbol) == ("demo_narrow_0", "demo_narrow_0.kd")
    assert [(a.offset, a.size, a.value_kind) for a in k.args] == [
        (0, 8, "by_value"),
        (8, 8, "by_value"),
        (16, 4, "by_value"),
    ]
    assert k.kernarg_segment_size == 20 and k.max_flat_workgroup_size == 512
    assert meta.text_bytes > 8
    assert check(EXPECT, data, meta, "", GOOD_LAUNCH) == []


def test_each_rule_fires_with_its_numbers(narrow_942):
    data, meta = narrow_942
    k = meta.kernels[0]

    def with_kernel(**kw):
        return dataclasses.replace(meta, kernels=(dataclasses.replace(k, **kw),))

    cases = [
        (
            dict(stderr="warning: x\nerror: no libcall available for ftanh\n"),
            "compile",
            "no libcall",
        ),
        (dict(code=b""), "compile", "empty"),
        (dict(meta=dataclasses.replace(meta, text_bytes=4)), "compile", "4 bytes"),
        (dict(meta=dataclasses.replace(meta, e_flags=0x54F)), "elf", "0x54f"),
        (dict(meta=dataclasses.replace(meta, abi_version=3)), "elf", "abi_version"),
        (dict(meta=with_kernel(name="other_0")), "kernel", "other_0"),
        (dict(meta=with_kernel(args=k.args[:2])), "kernargs", "differ"),
        (
            dict(
                meta=with_kernel(
                    args=(
                        *k.args[:2],
                        dataclasses.replace(k.args[2], value_kind="hidden_block_count_x"),
                    )
                )
            ),
            "kernargs",
            "hidden_block_count_x",
        ),
        (dict(launch=[{**GOOD_LAUNCH[0], "grid": [1, 1, 1]}]), "launch", "grid [1, 1, 1]"),
        (dict(launch=[{**GOOD_LAUNCH[0], "block": [256, 1, 1]}]), "launch", "block"),
        (dict(launch=[{**GOOD_LAUNCH[0], "dynamic_lds": None}]), "launch", "constant"),
        (dict(launch=[]), "launch", "one launch"),
        (dict(meta=with_kernel(scratch=308)), "scratch", "308 bytes"),
        (dict(meta=with_kernel(vgpr_spill=76)), "spills", "76 VGPR"),
        (dict(meta=with_kernel(vgpr=260)), "co-residency", "264 per wave"),
        (dict(meta=with_kernel(lds=70000)), "co-residency", "70000 bytes > 65536"),
        (dict(meta=with_kernel(max_flat_workgroup_size=256)), "co-residency", "at most 256"),
        (
            dict(meta=with_kernel(sgpr=500)),
            "co-residency",
            "512 per wave; 2 waves per SIMD need 1024 > 800",
        ),
    ]
    for kw, rule, needle in cases:
        got = check(
            EXPECT,
            kw.get("code", data),
            kw.get("meta", meta),
            kw.get("stderr", ""),
            kw.get("launch", GOOD_LAUNCH),
        )
        assert rule in _rules(got), (kw, got)
        text = "; ".join(str(v) for v in got if v.rule == rule)
        assert needle in text, (needle, text)
        assert "demo_narrow_0 on gfx942" in text


def test_python_error_names_are_not_compiler_errors(narrow_942):
    data, meta = narrow_942
    assert check(EXPECT, data, meta, "RuntimeError: no\nTypeError: x\n", GOOD_LAUNCH) == []


def test_coresidency_register_arithmetic():
    info = arch_info("gfx942")

    def meta(vgpr, agpr=0, lds=0):
        return KernelMeta("k_0", "k_0.kd", 0, (), vgpr, agpr, 20, 0, 0, lds, 0, 64, 1024)

    # 512 threads = 8 waves = 2 per SIMD: 256 registers per wave fit, 257 round to 264 and do not
    assert coresidency(meta(256, agpr=128), 512, info) == []
    assert coresidency(meta(8, agpr=0), 512, info) == []  # sgpr 20: fine
    [why] = coresidency(meta(257), 512, info)
    assert "264 per wave" in why and "528 > 512" in why and "at most 256" in why
    # 1024 threads = 4 waves per SIMD: 128 per wave
    assert coresidency(meta(128), 1024, info) == []
    assert coresidency(meta(129), 1024, info)
    # 256 threads = 1 wave per SIMD: the whole file
    assert coresidency(meta(512), 256, info) == []
    # LDS: static plus dynamic
    assert coresidency(meta(8, lds=60000), 512, info) == []
    [why] = coresidency(meta(8, lds=60000), 512, info, dynamic_lds=8000)
    assert "68000 bytes (60000 static + 8000 dynamic) > 65536" in why
    assert coresidency(meta(8, lds=100000), 512, arch_info("gfx950")) == []


def test_code_object_parser_refuses_garbage(narrow_942):
    data, _ = narrow_942
    with pytest.raises(CodeObjectError, match="not an ELF"):
        parse_code_object(b"hello")
    with pytest.raises(CodeObjectError):
        parse_code_object(data[:200])
    no_note = bytearray(data)
    i = no_note.find(b"AMDGPU\0")
    no_note[i : i + 6] = b"XXXXXX"
    with pytest.raises(CodeObjectError, match="NT_AMDGPU_METADATA"):
        parse_code_object(bytes(no_note))


def test_mlir_string_and_module_parsing():
    assert unescape_mlir_string('a\\\\b\\7F\\22z"rest', 0) == (b"a\\b\x7f\x22z", 11)
    with pytest.raises(ExtractError):
        unescape_mlir_string("abc", 0)
    text = (
        'gpu.binary @kernels [#gpu.object<#rocdl.target<chip = "gfx950">, kernels = <[]>, '
        'bin = "\\7FELF\\00x">]\n'
        "%0 = llvm.mlir.constant(256 : index) : i64\n%1 = llvm.mlir.constant(1 : index) : i64\n"
        "%2 = llvm.mlir.constant(512 : index) : i64\n%3 = llvm.mlir.constant(4096 : i32) : i32\n"
        "gpu.launch_func <%arg3 : !llvm.ptr> @kernels::@k_0 blocks in (%0, %1, %1) threads in "
        "(%2, %1, %1) : i64 dynamic_shared_memory_size %3 args(%arg0 : i64)\n"
    )
    [obj] = gpu_objects(text)
    assert (obj.chip, obj.binary) == ("gfx950", b"\x7fELF\x00x")
    [la] = launches(text)
    assert (la.kernel, la.grid, la.block, la.dynamic_lds) == ("k_0", (256, 1, 1), (512, 1, 1), 4096)


def test_the_lowered_mlir_comes_out_of_the_artifact_state():
    assert artifact_ir_text({"ir_zlib": zlib.compress(b"module {}")}) == "module {}"
