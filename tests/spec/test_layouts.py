"""Layout specs: validation rules, derived constants, the canonical digest, the loader's errors."""

from __future__ import annotations

import copy
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mono_aot.spec.errors import LayoutError
from mono_aot.spec.layouts import (
    Layout,
    load_layout,
    parse_layout,
    resolve_layout,
    shipped_layout_dir,
    shipped_layout_paths,
)

SHIPPED = shipped_layout_dir() / "minimax-m3.1-dspark-tp4.toml"
INFERRED = shipped_layout_dir() / "test" / "inferred-qpr8-fp8row-tp4.toml"


def shipped_doc() -> dict:
    return tomllib.loads(SHIPPED.read_text())


def write_spec(tmp_path: Path, doc: dict, name: str = "spec") -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(tomli_w.dumps(doc))
    return p


def problems_of(tmp_path: Path, doc: dict) -> list[str]:
    with pytest.raises(LayoutError) as e:
        load_layout(write_spec(tmp_path, doc))
    return e.value.problems


def mutate(path: str, value) -> dict:
    doc = shipped_doc()
    *parents, leaf = path.split(".")
    node = doc
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return doc


# ---- the shipped spec ----


def test_every_shipped_layout_validates():
    paths = shipped_layout_paths()
    assert [p.name for p in paths] == ["minimax-m3.1-dspark-tp4.toml"]
    for p in paths:
        lay = load_layout(p)
        assert lay.name == p.stem


def test_shipped_values_and_derived_constants_match_hand_computation():
    lay = resolve_layout("minimax-m3.1-dspark-tp4")
    assert (lay.model.hidden, lay.model.heads, lay.model.kv_heads) == (6144, 64, 4)
    assert (lay.model.head_dim, lay.model.rotary_dim, lay.model.layers) == (128, 64, 5)
    assert (lay.parallel.tp, lay.serving.qpr, lay.serving.chunk_reqs) == (4, 7, 8)
    assert (lay.serving.wide_base, lay.kernel.threads) == (3, 512)
    assert (lay.serving.kv_block, lay.serving.max_reqs) == (128, 10)
    assert (lay.model.window, lay.model.causal) == (4096, False)
    assert (lay.weights.format, lay.weights.block) == ("mxfp8", 32)
    assert lay.targets["gfx942"].ctas == 304 and lay.targets["gfx950"].ctas == 256
    # by hand: 64 heads / 4 ranks = 16 q heads; 4 KV heads / 4 = 1
    assert lay.q_heads_per_rank == 16 and lay.kv_heads_per_rank == 1
    # 16 * 128 = 2048 q rows, + 128 K rows + 128 V rows = 2304
    assert lay.q_rows_per_rank == 2048 and lay.kv_rows_per_rank == 128
    assert lay.qkv_rows_per_rank == 2304 and lay.o_cols_per_rank == 2048
    # 12288 / 4 = 3072 MLP columns per rank, gate + up = 6144 rows
    assert lay.mlp_per_rank == 3072 and lay.gu_rows_per_rank == 6144
    # 8 requests x 7 tokens = 56; narrow serves 1..2 requests = 14 tokens
    assert lay.launch_tokens == 56
    assert lay.variant_reqs("narrow") == (1, 2) and lay.variant_reqs("wide") == (3, 8)
    assert lay.variant_tokens("narrow") == 14 and lay.variant_tokens("wide") == 56
    # 5.0 s x 1e8 ticks/s
    assert lay.wait_ticks == 500_000_000
    assert lay.kv_entry_bytes == 256
    assert lay.variants() == ("narrow", "wide")
    assert lay.archs == ("gfx942", "gfx950")


def test_wait_ticks_rounds_fractional_seconds(tmp_path):
    lay = load_layout(write_spec(tmp_path, mutate("serving.peer_wait_s", 0.25)))
    assert lay.wait_ticks == 25_000_000


def test_wide_base_one_means_no_narrow_variant(tmp_path):
    lay = load_layout(write_spec(tmp_path, mutate("serving.wide_base", 1)))
    assert lay.variants() == ("wide",)


def test_ctas_of_an_untargeted_arch_names_both(tmp_path):
    doc = shipped_doc()
    del doc["targets"]["gfx950"]
    lay = load_layout(write_spec(tmp_path, doc))
    with pytest.raises(LayoutError, match="does not target gfx950.*gfx942"):
        lay.ctas("gfx950")


# ---- validation rules: one test each ----

RULES = [
    # (field path, bad value, field named in the message, words of the rule)
    ("model.hidden", 0, "model.hidden", "greater than 0"),
    ("model.layers", -1, "model.layers", "greater than 0"),
    ("targets.gfx942.ctas", 0, "targets.gfx942.ctas", "greater than 0"),
    ("targets.gfx942.ctas", 305, "targets.gfx942.ctas", "at most 304 CUs"),
    ("targets.gfx950.ctas", 2**40, "targets.gfx950.ctas", "at most 256 CUs"),
    ("model.heads", 66, "model.heads", "divide evenly over tp=4"),
    ("model.kv_heads", 6, "model.kv_heads", "divide evenly over tp=4"),
    ("model.heads", 68, "model.heads", "multiple of kv_heads=8"),
    ("model.rotary_dim", 63, "model.rotary_dim", "must be even"),
    ("model.rotary_dim", 130, "model.rotary_dim", "must not exceed head_dim=128"),
    ("model.hidden", 6146, "model.hidden", "divide evenly over tp=4"),
    ("model.hidden", 6152, "model.hidden", "16-byte vector width"),
    ("model.mlp", 12290, "model.mlp", "divide evenly over tp=4"),
    ("model.mlp", 12296, "model.mlp", "16-byte vector width"),
    ("serving.wide_base", 9, "serving.wide_base", "between 1 and chunk_reqs=8"),
    ("serving.wide_base", 0, "serving.wide_base", "greater than 0"),
    ("serving.chunk_reqs", 20, "serving.chunk_reqs", "exceeds the kernels' limit of 128"),
    ("serving.max_reqs", 4, "serving.chunk_reqs", "must not exceed max_reqs=4"),
    ("kernel.threads", 500, "kernel.threads", "multiple of the 64-lane wavefront"),
    ("kernel.threads", 2048, "kernel.threads", "exceeds the hardware limit of 1024"),
    ("model.norm_eps", 0.0, "model.norm_eps", "greater than 0"),
    ("serving.peer_wait_s", -1.0, "serving.peer_wait_s", "greater than 0"),
]


@pytest.mark.parametrize(
    ("path", "value", "field", "rule"), RULES, ids=[f"{r[0]}={r[1]}" for r in RULES]
)
def test_each_rule_names_file_field_and_rule(tmp_path, path, value, field, rule):
    doc = mutate(path, value)
    if path == "model.heads" and value == 68:
        doc["model"]["kv_heads"] = 8
    problems = problems_of(tmp_path, doc)
    hits = [p for p in problems if f": {field}: " in p and rule in p]
    assert hits, problems
    assert all(p.startswith(str(tmp_path / "spec.toml") + ": ") for p in problems)


def test_unknown_arch_is_rejected_and_says_how_to_add_one(tmp_path):
    doc = shipped_doc()
    doc["targets"]["gfx940"] = {"ctas": 228}
    (problem,) = problems_of(tmp_path, doc)
    assert "targets.gfx940: unknown arch; supported: gfx942, gfx950" in problem
    assert "mono_aot/spec/arch.py" in problem


def test_no_targets_is_rejected(tmp_path):
    doc = shipped_doc()
    doc["targets"] = {}
    assert any("targets:" in p for p in problems_of(tmp_path, doc))


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("model.hidden", "6144", "valid integer"),
        ("model.hidden", 6144.0, "valid integer"),
        ("model.layers", True, "valid integer"),
        ("model.norm_eps", "1e-6", "valid number"),
        ("kernel", 512, "valid dictionary"),
    ],
)
def test_wrong_types_are_rejected_not_coerced(tmp_path, path, value, words):
    problems = problems_of(tmp_path, mutate(path, value))
    assert any(f": {path}: " in p and words in p for p in problems), problems


def test_unknown_keys_are_rejected(tmp_path):
    doc = shipped_doc()
    doc["model"]["hiden"] = 6144
    doc["extra"] = 1
    problems = problems_of(tmp_path, doc)
    assert any("model.hiden: unknown key" in p for p in problems)
    assert any(": extra: unknown key" in p for p in problems)


def test_missing_key_is_named(tmp_path):
    doc = shipped_doc()
    del doc["serving"]["qpr"]
    assert any("serving.qpr: required key is missing" in p for p in problems_of(tmp_path, doc))


def test_every_problem_is_reported_not_just_the_first(tmp_path):
    doc = mutate("model.rotary_dim", 63)
    doc["kernel"]["threads"] = 500
    problems = problems_of(tmp_path, doc)
    assert len(problems) == 2


def test_name_must_match_the_file(tmp_path):
    doc = shipped_doc()
    doc["name"] = "other"
    (problem,) = problems_of(tmp_path, doc)
    assert "name: 'other' differs from the file's stem 'spec'" in problem


def test_invalid_toml_and_unreadable_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nlayers = 5\n")
    with pytest.raises(LayoutError, match=r"bad\.toml: invalid TOML"):
        load_layout(bad)
    with pytest.raises(LayoutError, match="cannot read"):
        load_layout(tmp_path / "absent.toml")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(LayoutError, match="not UTF-8"):
        load_layout(binary)


def test_unknown_shipped_name_lists_the_shipped_ones():
    with pytest.raises(LayoutError, match="no such shipped layout.*minimax-m3.1-dspark-tp4"):
        resolve_layout("nope")


# ---- canonical form and digest ----


def test_digest_is_stable_under_key_order_comments_and_formatting(tmp_path):
    base = load_layout(SHIPPED).digest
    text = SHIPPED.read_text()
    # comments stripped, blank lines and spacing changed, sections reversed
    lines = [line.split("#", 1)[0].rstrip() for line in text.splitlines()]
    compact = "\n".join(line.replace(" = ", "=") for line in lines if line)
    (tmp_path / "a").mkdir()
    p = tmp_path / "a" / "minimax-m3.1-dspark-tp4.toml"
    p.write_text(compact)
    assert load_layout(p).digest == base
    doc = shipped_doc()
    reordered = {
        k: (dict(reversed(list(v.items()))) if isinstance(v, dict) else v)
        for k, v in reversed(list(doc.items()))
    }
    assert load_layout(write_spec(tmp_path, reordered, "reordered")).digest == base
    # an integer written as 7 where a float is expected normalises to 7.0
    assert load_layout(write_spec(tmp_path, mutate("model.swiglu_limit", 7), "int")).digest == base


def _codegen_fields() -> list[str]:
    """Every field of every section of the spec's schema (not only those the shipped file sets)."""
    out = []
    for section in ("model", "parallel", "serving", "weights", "kernel"):
        for k in Layout.model_fields[section].annotation.model_fields:
            if (section, k) != ("serving", "max_reqs"):
                out.append(f"{section}.{k}")
    return out


# a changed value that still passes validation, for each codegen field
_PERTURBED = {
    "model.layers": 4, "model.hidden": 6400, "model.heads": 32, "model.kv_heads": 8,
    "model.head_dim": 64, "model.rotary_dim": 32, "model.mlp": 8192, "model.norm_eps": 1e-5,
    "model.swiglu_alpha": 1.5, "model.swiglu_limit": 6.0, "parallel.tp": 2,
    "serving.kv_block": 32, "serving.qpr": 4, "serving.chunk_reqs": 6, "serving.wide_base": 2,
    "serving.peer_wait_s": 2.5, "kernel.threads": 256, "model.window": 2048,
    "model.causal": True, "weights.format": "fp8-row", "weights.block": 64,
}  # fmt: skip


def test_every_codegen_field_is_perturbed_by_the_test():
    assert sorted(_PERTURBED) == sorted(_codegen_fields())


@pytest.mark.parametrize(
    ("field", "value"),
    [("model.window", 0), ("model.causal", False), ("weights.format", "fp8-row"),
     ("weights.block", 32)],
)  # fmt: skip
def test_a_field_added_later_left_at_its_default_keeps_the_digest(tmp_path, field, value):
    """Specs written before the window and the weight format existed keep their binaries: the
    inferred layout (written then, none of these fields) has the digest it shipped with."""
    base = load_layout(INFERRED)
    assert base.digest.startswith("4f916bf9e266")
    doc = tomllib.loads(INFERRED.read_text())
    section, key = field.split(".")
    doc.setdefault(section, {})[key] = value
    assert load_layout(write_spec(tmp_path, doc)).digest == base.digest


def test_mxfp8_needs_whole_blocks_and_the_kernels_refuse_only_causal_attention(tmp_path):
    doc = mutate("weights.format", "mxfp8")
    doc["weights"]["block"] = 48  # hidden 6144 and 3072 down inputs are whole blocks, 2048 not
    with pytest.raises(LayoutError) as e:
        parse_layout(doc, "spec.toml", name="spec")
    assert "model.heads" in str(e.value) and "48-input mxfp8 blocks" in str(e.value)
    doc["weights"]["block"] = 24
    with pytest.raises(LayoutError, match="weights.block: 24 must be a multiple of the 16-byte"):
        parse_layout(doc, "spec.toml", name="spec")
    real = mutate("model.window", 4096)
    real["model"]["causal"] = True
    real["weights"] = {"format": "mxfp8"}
    # a geometry the reference takes, whose spec file the kernels refuse for causality alone
    assert parse_layout(real, "spec.toml", name="spec").weights.block == 32
    problems = problems_of(tmp_path, real)
    assert any(": model.causal: " in p for p in problems), problems
    assert not any(": model.window: " in p or ": weights." in p for p in problems), problems


@pytest.mark.parametrize("field", sorted(_PERTURBED))
def test_digest_changes_when_any_codegen_field_changes(tmp_path, field):
    # the digest of any valid geometry, buildable or not (kernel rules: tests/spec/test_plans.py)
    base = load_layout(SHIPPED).digest
    lay = parse_layout(mutate(field, _PERTURBED[field]), "perturbed", name="spec")
    assert lay.digest != base


@pytest.mark.parametrize(
    ("field", "value"),
    [("description", "renamed"), ("serving.max_reqs", 512), ("targets.gfx942.ctas", 228)],
)
def test_digest_ignores_fields_that_do_not_reach_generated_code(tmp_path, field, value):
    base = load_layout(SHIPPED).digest
    assert load_layout(write_spec(tmp_path, mutate(field, value))).digest == base


def test_layout_cannot_be_constructed_invalid():
    doc = shipped_doc()
    doc["name"] = "x"
    doc["model"]["rotary_dim"] = 63
    with pytest.raises(ValueError):
        Layout.model_validate(doc)


# ---- fuzzing the loader ----

_scalars = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_fuzz_wrong_values_always_give_layout_error(tmp_path, data):
    doc = copy.deepcopy(shipped_doc())
    fields = [(s, k) for s in ("model", "parallel", "serving", "kernel") for k in doc[s]]
    for _ in range(data.draw(st.integers(1, 3))):
        s, k = data.draw(st.sampled_from(fields))
        doc[s][k] = data.draw(_scalars)
    try:
        lay = parse_layout(doc, "fuzz.toml", name="fuzz")
    except LayoutError as e:
        assert e.problems and all(p.startswith("fuzz.toml: ") for p in e.problems)
    else:
        assert isinstance(lay.digest, str)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=300) | st.text(max_size=300))
def test_fuzz_malformed_files_always_give_layout_error(tmp_path, content):
    p = tmp_path / "fuzz.toml"
    if isinstance(content, bytes):
        p.write_bytes(SHIPPED.read_bytes()[: len(content)] + content)
    else:
        p.write_text(content)
    try:
        load_layout(p)
    except LayoutError as e:
        assert all(line.startswith(str(p)) for line in e.problems)


# ---- the CLI ----


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mono_aot", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_validate_ok_and_bad(tmp_path):
    ok = run_cli("layouts", "validate", str(SHIPPED))
    assert ok.returncode == 0, ok.stderr
    bad = write_spec(tmp_path, mutate("model.rotary_dim", 63))
    r = run_cli("layouts", "validate", str(SHIPPED), str(bad))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines == [
        f"mono-aot: {bad}: model.rotary_dim: 63 must be even (NeoX rotates pairs of halves)"
    ]
    assert "Traceback" not in r.stderr


def test_cli_list_show_schema_json():
    import json

    r = run_cli("layouts", "list", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["name"] == "minimax-m3.1-dspark-tp4"
    r = run_cli("layouts", "show", "minimax-m3.1-dspark-tp4", "--json")
    doc = json.loads(r.stdout)
    assert doc["derived"]["qkv_rows_per_rank"] == 2304 and len(doc["digest"]) == 64
    assert doc["spec"]["weights"] == {"format": "mxfp8", "block": 32}
    # the performance model, by hand: per layer and rank 83,361,792 weight bytes and one E8M0
    # byte per 32 inputs (2304x192 + 6144x64 + 6144x192 + 6144x96 = 2,605,056); K/V 256 B a
    # position and layer (one KV head a rank); past the window of 4096 a request of 7 rows
    # reads 4095 + 7 positions, so 32K of context costs what 4K does
    one, full4k, full32k = doc["derived"]["launch"]
    assert (one["requests"], one["context"], one["kv"]) == (1, 1024, (1024 + 7) * 5 * 256)
    assert full4k["weights"] == 5 * 83_361_792 and full4k["scales"] == 5 * 2_605_056
    assert full4k["kv"] == full32k["kv"] == 8 * (4095 + 7) * 5 * 256
    assert full4k["total"] == 5 * 83_361_792 + 5 * 2_605_056 + 8 * 4102 * 1280
    assert full4k["hbm_floor_us"] == {
        "gfx942": round(full4k["total"] / 5.3e12 * 1e6, 1),
        "gfx950": round(full4k["total"] / 8e12 * 1e6, 1),
    }
    r = run_cli("layouts", "schema")
    assert "properties" in json.loads(r.stdout)
    r = run_cli("layouts", "show", "nope")
    assert r.returncode == 2 and "no such shipped layout" in r.stderr


def test_cli_validate_reports_a_directory_and_an_unreadable_file_per_file(tmp_path):
    import json

    d = tmp_path / "dir.toml"
    d.mkdir()
    missing = tmp_path / "missing.toml"
    r = run_cli("layouts", "validate", "--json", str(d), str(missing), str(SHIPPED))
    assert r.returncode == 2, r.stderr
    docs = json.loads(r.stdout)  # every file has its result, the good one too
    assert [x["ok"] for x in docs] == [False, False, True]
    assert r.stderr.strip().splitlines() == [
        f"mono-aot: {d}: cannot read: Is a directory",
        f"mono-aot: {missing}: cannot read: No such file or directory",
    ]


def test_cli_show_prints_the_canonical_form_whose_sha256_is_the_digest():
    import hashlib

    r = run_cli("layouts", "show", "minimax-m3.1-dspark-tp4")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("canonical"))
    canonical = line.split(": ", 1)[1]
    digest = r.stdout.split("digest ", 1)[1].split()[0]
    assert hashlib.sha256(canonical.encode()).hexdigest() == digest
