"""The attention phases (``mono_aot.kernels.attention``): compile, resources, ISA, and on a GPU
against the torch reference.

The compile tests build the standalone probe kernel (the three phases behind a runtime phase
selector, the same code the megakernel inlines) through the build worker, once per (arch,
variant) and session. The ROCm tests run the probe on the GPU in a fresh subprocess (this file
run as a script) and compare with ``mono_aot.reference.step_rank`` on a one-layer layout whose
qkv and o projections are identities, so the reference's attention output is its attention
all-reduce partial and the kernel's qkv input is the reference's own normed activations.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mono_aot.compiler.compile import compile_kernel, disassemble
from mono_aot.compiler.inputs import directory_provider
from mono_aot.spec import abi
from mono_aot.spec.arch import arch_info, base_arch
from mono_aot.spec.errors import MonoUnsupported
from mono_aot.spec.layouts import Layout, parse_layout, resolve_layout, shipped_layout_dir

LAYOUT_NAME = "minimax-m3.1-dspark-tp4"
ARCHS = ("gfx942", "gfx950")
PROVIDER_MODULE = "attn_probe_provider"
PROVIDER_SRC = """\
from mono_aot.kernels import attention as A

KERNEL_NAMES = {"narrow": A.PROBE_KERNEL, "wide": A.PROBE_KERNEL}


def launcher_for(variant, layout, arch):
    return A.probe_launcher(layout, arch, variant)


def trace_args(variant, layout):
    return A.probe_trace_args(layout, variant)
"""


def _attention():
    from mono_aot.kernels import attention

    return attention


# ---------------------------------------------------------------- compile once per session


@pytest.fixture(scope="session")
def probe_provider(tmp_path_factory):
    d = tmp_path_factory.mktemp("attn-provider")
    (d / f"{PROVIDER_MODULE}.py").write_text(PROVIDER_SRC)
    return directory_provider(d, PROVIDER_MODULE)


@pytest.fixture(scope="session")
def probe_build(probe_provider, tmp_path_factory):
    """(arch, variant, mode) -> CompileResult / ISA text, each built once in its own worker."""
    done: dict = {}

    def get(arch: str, variant: str, mode: str = "compile"):
        key = (arch, variant, mode)
        if key not in done:
            out = tmp_path_factory.mktemp(f"attn-{arch}-{variant}-{mode}")
            lay = resolve_layout(LAYOUT_NAME)
            if mode == "isa":
                done[key] = disassemble(probe_provider, variant, lay, arch, out)
            else:
                done[key] = compile_kernel(probe_provider, variant, lay, arch, out)
        return done[key]

    return get


BUILDS = [("gfx942", "wide"), ("gfx950", "wide"), ("gfx942", "narrow")]


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "variant"), BUILDS)
def test_probe_compiles_within_budget(probe_build, arch, variant):
    r = probe_build(arch, variant)
    assert not [ln for ln in r.stderr.splitlines() if "error:" in ln], r.stderr[-2000:]
    md = r.metadata
    assert md.target.endswith(arch), md.target
    assert md.e_flags == arch_info(arch).e_flags
    (k,) = md.kernels
    assert k.name == _attention().PROBE_KERNEL + "_0"
    lay = resolve_layout(LAYOUT_NAME)
    info = arch_info(arch)
    waves_per_simd = lay.kernel.threads // info.wavefront_size // info.simds_per_cu
    assert k.scratch == 0 and k.vgpr_spill == 0 and k.sgpr_spill == 0, k
    assert k.vgpr + k.agpr <= info.vgprs_per_simd // waves_per_simd, k
    geom = _attention().attention_phases(lay, arch, variant).geometry
    assert k.lds == geom.lds_bytes  # the probe's only LDS is the phases' arena
    assert geom.lds_bytes <= 24 * 1024  # leaves most of gfx942's 64 KiB to the other phases
    # 9 addresses then 4 Int32, nothing hidden
    assert [(a.offset, a.size) for a in k.args] == [(8 * i, 8) for i in range(9)] + [
        (72 + 4 * i, 4) for i in range(4)
    ]
    assert k.kernarg_segment_size == 88
    assert md.text_bytes > 8000  # the three phases: an emptied kernel is a few hundred bytes
    assert k.max_flat_workgroup_size >= lay.kernel.threads


def _count(isa: str, mnemonic: str) -> int:
    """Instructions ``mnemonic`` in the ISA text, any encoding suffix (_e32, _e64, _sdwa)."""
    pattern = rf"^\s+{re.escape(mnemonic)}(?:_e32|_e64|_sdwa|_dpp)?(?=\s|$)"
    return len(re.findall(pattern, isa, flags=re.M))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_probe_isa_has_what_the_design_relies_on(probe_build, arch):
    isa = probe_build(arch, "wide", "isa")
    geom = _attention().attention_phases(resolve_layout(LAYOUT_NAME), arch, "wide").geometry
    # fp8 both ways: the cache write encodes, the attention decodes
    assert _count(isa, "v_cvt_pk_fp8_f32") >= 2
    assert _count(isa, "v_cvt_pk_f32_fp8") >= 16
    if arch == "gfx950":  # K straight to bf16 pairs, P rounded by the hardware's packer
        assert _count(isa, "v_cvt_scalef32_pk_bf16_fp8") >= 16
        assert _count(isa, "v_cvt_pk_bf16_f32") >= 8
    # both products of a staged chunk on the bf16 MFMA: per 16-position tile 8 (QK) + 8 (PV)
    # 16-deep ones on gfx942, half as many 32-deep ones on gfx950
    if arch == "gfx950":
        assert _count(isa, "v_mfma_f32_16x16x32_bf16") >= 8 * (geom.chunk // 16)
    else:
        assert _count(isa, "v_mfma_f32_16x16x16_bf16") >= 16 * (geom.chunk // 16)
    # the cache is read with 16-byte loads only and written a dword a lane: no byte or short
    # access to global memory anywhere in the phases
    assert _count(isa, "global_load_dwordx4") >= 4
    for narrow in ("global_load_ubyte", "global_load_sbyte", "global_load_ushort", "global_load_short_d16",
                   "global_store_byte", "global_store_short"):  # fmt: skip
        assert _count(isa, narrow) == 0, narrow
    assert _count(isa, "global_store_dword") >= 1
    # staged K/V: 16-byte LDS writes, 16-byte K reads
    assert _count(isa, "ds_write_b128") >= 2
    assert _count(isa, "ds_read_b128") >= 2
    assert _count(isa, "v_exp_f32") >= 1 and _count(isa, "s_barrier") >= 2


# ---------------------------------------------------------------- geometry and split rules


def _spec(**overrides) -> dict:
    data = tomllib.loads((shipped_layout_dir() / f"{LAYOUT_NAME}.toml").read_text())
    for dotted, value in overrides.items():
        section, key = dotted.split("__")
        data[section][key] = value
    return data


def _layout(**overrides) -> Layout:
    return parse_layout(_spec(**overrides), source="test", name="attn-test")


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"model__head_dim": 64}, "head_dim 64"),
        ({"model__kv_heads": 8}, "2 KV heads per rank"),
        ({"kernel__threads": 256}, "112 query rows per request, but the 4 waves"),
    ],
)
def test_unsupported_geometry_is_refused_with_the_reason(overrides, words):
    lay = _layout(**overrides)
    with pytest.raises(MonoUnsupported, match=re.escape(words)):
        _attention().AttnGeometry.build(lay, "gfx942", "wide")


@settings(max_examples=300, deadline=None)
@given(
    arch=st.sampled_from(ARCHS),
    lens=st.lists(st.integers(min_value=0, max_value=1 << 21), min_size=1, max_size=8),
)
def test_split_never_needs_more_slots_than_the_scratch_has(arch, lens):
    lay = resolve_layout(LAYOUT_NAME)
    g = _attention().AttnGeometry.build(lay, arch, "wide")
    part, tasks = _attention().attention_split(g, lens)
    assert part >= abi.ATTN_PARTITION and part % g.chunk == 0
    assert sum(tasks) <= g.slots == abi.attn_partial_slots(lay, "wide")
    for s, k in zip(lens, tasks, strict=True):
        assert k >= 1 and k * part >= s and (k - 1) * part < max(s, 1)


# ---------------------------------------------------------------- the lanes' operand layout, emulated


def _mfma_16x16(a_lanes, b_lanes):
    """``v_mfma_f32_16x16x{4E}_bf16`` on per-lane operands of E elements, as the CDNA ISA lays
    them out: lane l holds A[l % 16][E (l // 16) + e] and B[E (l // 16) + e][l % 16] and gets
    D[4 (l // 16) + i][l % 16] (i = 0..3). E = 4: the 16-deep instruction, 8: gfx950's 32."""
    E = len(a_lanes[0])
    a = torch.zeros((16, 4 * E), dtype=torch.float64)
    b = torch.zeros((4 * E, 16), dtype=torch.float64)
    for lane in range(64):
        for e in range(E):
            a[lane % 16, E * (lane // 16) + e] = a_lanes[lane][e]
            b[E * (lane // 16) + e, lane % 16] = b_lanes[lane][e]
    d = a @ b
    return [[float(d[4 * (lane // 16) + i, lane % 16]) for i in range(4)] for lane in range(64)]


def _add(x, y):
    return [[p + q for p, q in zip(r, s, strict=True)] for r, s in zip(x, y, strict=True)]


@pytest.mark.parametrize("arch", ARCHS)
def test_lane_layout_computes_both_products(arch):
    """One staged chunk through the kernel's index functions and the ISA's MFMA register
    layout gives ``S = q K^T`` and ``O = P V`` (every position, row and dim in its place)."""
    from mono_aot.reference.fp8 import decode, format_for_arch

    g = _attention().AttnGeometry.build(resolve_layout(LAYOUT_NAME), arch, "wide")
    fmt = format_for_arch(arch)
    D, C, E = g.head_dim, g.chunk, 2 * g.mfma_words  # E: operand elements a lane
    gen = torch.Generator().manual_seed(3)
    rows = torch.randint(0, 256, (C, 2 * D), generator=gen, dtype=torch.int64).to(torch.uint8)
    table = decode(torch.arange(256, dtype=torch.int64).to(torch.uint8), fmt, torch.float64)
    rows[torch.isnan(table[rows.to(torch.int64)])] = 0
    kv = decode(rows, fmt, torch.float64)
    k, v = kv[:, :D], kv[:, D:]
    # staging: thread (srow, seg) puts its 32 bytes of cache row srow at its LDS word
    lds = torch.full((g.lds_bytes,), -1, dtype=torch.int64)
    for tid in range(g.threads):
        srow, seg = tid // 8, tid % 8
        word = g.stage_k_word(srow, seg) if seg < 4 else g.stage_v_word(srow, seg)
        at = slice(word * 4, word * 4 + 32)
        assert bool((lds[at] == -1).all())  # no two threads write the same bytes
        lds[at] = rows[srow, seg * 32 : seg * 32 + 32].to(torch.int64)

    def byte(word, off):
        code = int(lds[word * 4 + off])
        assert code >= 0, "read an LDS byte nobody staged"
        return float(table[code])

    q = torch.randn((16, D), generator=gen, dtype=torch.float64)
    p = torch.rand((16, C), generator=gen, dtype=torch.float64)
    s_emul = torch.full((16, C), torch.nan, dtype=torch.float64)
    o_emul = torch.full((16, D), torch.nan, dtype=torch.float64)
    lanes = [(lane % 16, lane // 16) for lane in range(64)]
    for tile in range(C // 16):
        acc = [[0.0] * 4 for _ in range(64)]
        for st_ in range(D // (4 * E)):  # k-steps over the head dims
            a = [
                [byte(g.k_frag_word(tile, nn, grp), E * st_ + e) for e in range(E)]
                for nn, grp in lanes
            ]
            b = [[float(q[nn, g.qk_dim(grp, st_, e)]) for e in range(E)] for nn, grp in lanes]
            acc = _add(acc, _mfma_16x16(a, b))
        for lane, (nn, grp) in enumerate(lanes):
            for j in range(4):
                s_emul[nn, g.score_pos(tile, grp, j)] = acc[lane][j]
    o_acc = [[[0.0] * 4 for _ in range(64)] for _ in range(8)]
    for step in range(C // (4 * E)):  # PV steps over the chunk's positions
        b = [[float(p[nn, g.pv_pos(step, grp, e)]) for e in range(E)] for nn, grp in lanes]
        for t in range(8):
            a = [
                [byte(g.v_frag_word(g.pv_pos(step, grp, e), nn), t) for e in range(E)]
                for nn, grp in lanes
            ]
            o_acc[t] = _add(o_acc[t], _mfma_16x16(a, b))
    for t in range(8):
        for lane, (nn, grp) in enumerate(lanes):
            for j in range(4):
                o_emul[nn, g.out_dim(grp, j, t)] = o_acc[t][lane][j]
    assert torch.allclose(s_emul, q @ k.T, rtol=1e-12, atol=1e-9)
    assert torch.allclose(o_emul, p @ v, rtol=1e-12, atol=1e-9)
    # what the kernel's contiguous loads and stores assume about those functions
    for grp in range(4):
        dims = [g.qk_dim(grp, u, e) for u in range(D // (4 * E)) for e in range(E)]
        assert dims == list(range(32 * grp, 32 * grp + 32))
        assert [g.out_dim(grp, e // 8, e % 8) for e in range(32)] == list(
            range(32 * grp, 32 * grp + 32)
        )


# ---------------------------------------------------------------- on a GPU, against the reference

HEAD_Q_ROWS = 2048  # q rows of a rank on the test layout (16 heads x 128)


def _gpu_layout() -> Layout:
    """One layer, hidden = the rank's qkv rows (2304) so qkv and o can be identities."""
    return _layout(model__layers=1, model__hidden=2304, model__mlp=256)


def _identity_codes(rows: int, cols: int, fmt) -> torch.Tensor:
    from mono_aot.reference.fp8 import encode

    one = int(encode(torch.tensor([1.0]), fmt)[0])
    w = torch.zeros((rows, cols), dtype=torch.uint8)
    k = min(rows, cols)
    w[torch.arange(k), torch.arange(k)] = one
    return w


def _gpu_case(arch: str, variant: str, seq_lens: list[int], drop: list[int], seed: int):
    """Inputs of one case and the reference's answer (numerics 'kernel')."""
    from mono_aot.reference.fp8 import encode, format_for_arch
    from mono_aot.reference.kvcache import slots_of
    from mono_aot.reference.step import StepInputs, gemma_norm, step_rank
    from mono_aot.reference.weights import stack_layers

    gen = torch.Generator().manual_seed(seed)
    lay = _gpu_layout()
    fmt = format_for_arch(arch)
    m, s = lay.model, lay.serving
    qpr, kb, D = s.qpr, s.kv_block, m.head_dim
    reqs, n = len(seq_lens), len(seq_lens) * s.qpr
    need = [-(-sl // kb) for sl in seq_lens]
    nblk = sum(need) + 5
    order = torch.randperm(nblk, generator=gen).to(torch.int32)  # non-contiguous blocks
    bt = torch.full((reqs + 1, max(need) + 3), 1 << 30, dtype=torch.int32)  # junk past the rows
    at = 0
    for i, k in enumerate(need):
        bt[i, :k] = order[at : at + k]
        at += k
    pos = torch.tensor([sl - qpr + t for sl in seq_lens for t in range(qpr)], dtype=torch.int64)
    slots = torch.tensor(
        [
            int(bt[i, p // kb]) * kb + p % kb
            for i in range(reqs)
            for p in pos[i * qpr : (i + 1) * qpr].tolist()
        ],
        dtype=torch.int64,
    )
    slots[drop] = -1
    # the cache: NaN codes everywhere, valid codes at the context the step reads but does not
    # write (the positions before the draft block, and the draft tokens whose slot is -1)
    cache = torch.full((nblk, 1, kb, 2 * D), fmt.nan_code, dtype=torch.uint8)
    rows = cache.view(nblk * kb, 2 * D)
    for i, sl in enumerate(seq_lens):
        p = torch.arange(sl, dtype=torch.int64)
        keep = p < sl - qpr
        for t in range(qpr):
            keep[sl - qpr + t] = bool(slots[i * qpr + t] == -1)
        ids = slots_of(bt, i, p[keep], kb, nblk)
        vals = torch.randn((ids.numel(), 2 * D), generator=gen, dtype=torch.float64) * 8
        rows[ids] = encode(vals, fmt, saturate=True)
    x = (torch.randn((n, m.hidden), generator=gen) * 3).to(torch.bfloat16)
    cos_sin = (torch.rand((max(seq_lens) + 1, m.rotary_dim), generator=gen) * 2 - 1).to(
        torch.bfloat16
    )
    w_q = (torch.rand(D, generator=gen) * 2 - 0.5).to(torch.bfloat16)
    w_k = (torch.rand(D, generator=gen) * 2 - 0.5).to(torch.bfloat16)
    zero = lambda k: torch.zeros(k, dtype=torch.bfloat16)  # noqa: E731
    packed = {
        "qkv_w": _identity_codes(lay.qkv_rows_per_rank, m.hidden, fmt),
        "qkv_s": torch.ones(lay.qkv_rows_per_rank, dtype=torch.float32),
        "o_w": _identity_codes(m.hidden, lay.o_cols_per_rank, fmt),
        "o_s": torch.ones(m.hidden, dtype=torch.float32),
        "gu_w": torch.zeros((lay.gu_rows_per_rank, m.hidden), dtype=torch.uint8),
        "gu_s": torch.ones(lay.gu_rows_per_rank, dtype=torch.float32),
        "d_w": torch.zeros((m.hidden, lay.mlp_per_rank), dtype=torch.uint8),
        "d_s": torch.ones(m.hidden, dtype=torch.float32),
        "w_in": zero(m.hidden),
        "w_post": zero(m.hidden),
        "w_q": w_q,
        "w_k": w_k,
        "k_scale": torch.tensor(0.0625, dtype=torch.float32),
        "v_scale": torch.tensor(0.03125, dtype=torch.float32),
    }
    weights = stack_layers([packed], zero(m.hidden), lay)
    inputs = StepInputs(
        x=x,
        positions=pos,
        slots=slots,
        block_table=bt,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        cos_sin=cos_sin,
    )
    ref_cache = cache.clone()
    peers = torch.zeros((1, 2, lay.parallel.tp, n, m.hidden), dtype=torch.float64)
    res = step_rank(lay, fmt, 0, weights, [ref_cache], inputs, peers, numerics="kernel")
    # what the kernel's qkv region holds: the projection of the stored (bf16) normed x
    h = gemma_norm(x.to(torch.float64), packed["w_in"], m.norm_eps).to(torch.bfloat16)
    qkv = h[:, : lay.qkv_rows_per_rank].to(torch.float32)
    case = {
        "arch": arch, "variant": variant, "layout": lay.model_dump(mode="json"), "n": n,
        "qkv": qkv, "cache": cache, "bt": bt, "pos": pos, "slots": slots,
        "seq_lens": inputs.seq_lens, "cos_sin": cos_sin, "w_q": w_q, "w_k": w_k,
        "k_scale": packed["k_scale"], "v_scale": packed["v_scale"],
    }  # fmt: skip
    return case, res, ref_cache


def _run_probe_subprocess(case: dict, tmp_path: Path) -> dict:
    """This file as a script, in a fresh interpreter with a private FlyDSL cache."""
    src, dst = tmp_path / "case.pt", tmp_path / "out.pt"
    torch.save(case, src)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYDSL_")}
    env["FLYDSL_RUNTIME_CACHE_DIR"] = str(tmp_path / "flydsl-cache")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(src), str(dst)],
        env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "error:" not in proc.stderr, proc.stderr[-3000:]
    return torch.load(dst)


def _device_arch() -> str:
    return base_arch(torch.cuda.get_device_properties(0).gcnArchName)


def _check_against_reference(case, res, ref_cache, out):
    from mono_aot.reference.fp8 import boundary_distance, format_for_arch

    n = case["n"]
    assert out["health"].tolist() == [0, 0, 0, 0]
    got = out["attn"].to(torch.float64)
    assert not bool(torch.isnan(got).any()), (
        "attention output rows left unwritten (poison survived)"
    )
    want = res.partials[0, 0][:, :HEAD_Q_ROWS]
    rel = float((got - want).norm() / want.norm())
    assert rel <= 2e-2, rel
    # cache: untouched bytes unchanged (NaN poison included), written bytes equal the
    # reference's except where the pre-encode value is within fp32 noise of an fp8 midpoint
    cache = out["cache"]
    kb = cache.shape[2]
    near = (
        boundary_distance(res.kv_prequant[0, :, 0, :], format_for_arch(case["arch"])) < 1e-5
    )  # [n, 256]
    diff = cache != ref_cache
    allowed = torch.zeros_like(diff)
    for t in range(n):
        sl = int(case["slots"][t])
        if sl >= 0:
            allowed[sl // kb, 0, sl % kb] = near[t]
    assert not bool((diff & ~allowed).any()), f"{int((diff & ~allowed).sum())} cache bytes differ"
    assert int(diff.sum()) <= 0.001 * n * 256


GPU_CASES = {
    # narrow: a single-partition request and a split one
    "narrow-mixed": ("narrow", [8, 700], [3]),
    # wide: boundaries of the chunk (64) and of the minimum partition (256)
    "wide-boundaries": ("wide", [8, 9, 16, 17, 255, 256, 257, 520], [0, 63]),
    # wide: a long context makes the partition longer than the minimum
    "wide-long": ("wide", [8, 40, 300, 1030, 100_003], [12, 39]),
}


@pytest.mark.rocm
@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_phases_match_the_reference_on_gpu(name, tmp_path):
    variant, lens, drop = GPU_CASES[name]
    arch = _device_arch()
    case, res, ref_cache = _gpu_case(arch, variant, lens, drop, seed=len(name))
    g = _attention().AttnGeometry.build(_gpu_layout(), arch, variant)
    _, tasks = _attention().attention_split(g, lens)
    assert max(tasks) > 1  # every case exercises the combine phase
    out = _run_probe_subprocess(case, tmp_path)
    _check_against_reference(case, res, ref_cache, out)


@pytest.mark.rocm
@pytest.mark.parametrize("where", ["block_table", "slot"])
def test_bad_block_is_recorded_not_dereferenced_on_gpu(where, tmp_path):
    arch = _device_arch()
    case, _, _ = _gpu_case(arch, "narrow", [8, 300], [], seed=5)
    nblk = case["cache"].shape[0]
    if where == "block_table":
        case["bt"][1, 5] = nblk + 100  # covers positions 80..95 of request 1 (context)
        expect = (abi.STATUS_BAD_BLOCK, 1 * 16 + _attention().WHAT_ATTENTION, nblk + 100)
    else:
        case["slots"][10] = nblk * case["cache"].shape[2] + 3  # one past the cache's blocks
        expect = (abi.STATUS_BAD_BLOCK, 1 * 16 + _attention().WHAT_KV_WRITE, nblk)
    before = case["cache"].clone()
    out = _run_probe_subprocess(case, tmp_path)
    assert tuple(out["health"].tolist()[:3]) == expect
    assert out["health"].tolist()[3] == STEP
    # the cache rows that changed are exactly the valid slots' (nothing written for the bad one)
    kb = before.shape[2]
    changed = (out["cache"] != before).any(dim=-1).reshape(-1).nonzero().reshape(-1).tolist()
    good = [int(s) for s in case["slots"] if 0 <= int(s) < before.shape[0] * kb]
    assert set(changed) == set(good)


# ---------------------------------------------------------------- the subprocess side

STEP = 41  # the step counter the probe sees (recorded with a bad block)
LAYER = 1  # the probe runs the reference's layer 0 as layer 1 of a two-row pointer table


def _gpu_main(src: str, dst: str, dev: str = "cuda") -> None:
    case = torch.load(src)
    from mono_aot.kernels import attention as A

    lay = parse_layout(case["layout"], source="case")
    arch, variant, n = case["arch"], case["variant"], case["n"]
    if dev == "cuda":
        assert _device_arch() == arch
    plan = abi.scratch_plan(lay, variant)
    scratch = torch.zeros(plan.total, dtype=torch.uint8, device=dev)
    q0 = plan.offset("qkv")
    scratch[q0 : q0 + case["qkv"].numel() * 4] = (
        case["qkv"].contiguous().view(torch.uint8).reshape(-1).to(dev)
    )
    a0 = plan.offset("attn")
    attn_bytes = n * lay.q_rows_per_rank * 2
    scratch[a0 : a0 + attn_bytes] = 0xFF  # poison: bf16 NaN
    on = {
        k: case[k].contiguous().to(dev)
        for k in ("cache", "bt", "pos", "slots", "seq_lens", "cos_sin", "w_q", "w_k")
    }
    ks = case["k_scale"].reshape(1).to(dev)
    vs = case["v_scale"].reshape(1).to(dev)
    # row 0 of the table: a decoy layer (NaN cache, other scales) the probe must not read
    decoy = torch.full_like(on["cache"], 0x7F)
    dks = torch.full((1,), 1e-3, dtype=torch.float32, device=dev)
    tab = torch.zeros((2, abi.TABLE_SLOTS), dtype=torch.int64)
    for row, (cache, k_s, v_s) in enumerate(((decoy, dks, dks), (on["cache"], ks, vs))):
        tab[row, abi.T_W_Q] = on["w_q"].data_ptr()
        tab[row, abi.T_W_K] = on["w_k"].data_ptr()
        tab[row, abi.T_K_SCALE] = k_s.data_ptr()
        tab[row, abi.T_V_SCALE] = v_s.data_ptr()
        tab[row, abi.T_CACHE] = cache.data_ptr()
        tab[row, abi.T_NBLK] = cache.shape[0]
    tab = tab.to(dev)
    health = torch.zeros(abi.HEALTH_WORDS, dtype=torch.int32, device=dev)
    step = torch.tensor([STEP], dtype=torch.int32, device=dev)
    launch = A.probe_launcher(lay, arch, variant)
    args = {
        "scratch": scratch.data_ptr(), "tab": tab.data_ptr(), "cos_sin": on["cos_sin"].data_ptr(),
        "bt": on["bt"].data_ptr(), "pos": on["pos"].data_ptr(), "slots": on["slots"].data_ptr(),
        "seq_lens": on["seq_lens"].data_ptr(), "step": step.data_ptr(), "health": health.data_ptr(),
        "layer": LAYER, "bt_stride": on["bt"].stride(0), "n": n,
    }  # fmt: skip
    stream = torch.cuda.current_stream() if dev == "cuda" else None
    for phase in ("prep", "partial", "combine"):
        vals = [args[a] for a in A.PROBE_ARGS if a != "phase"]
        launch(*vals, A.PROBE_PHASES[phase], stream=stream)
    if dev == "cuda":
        torch.cuda.synchronize()
    attn = scratch[a0 : a0 + attn_bytes].view(torch.bfloat16).reshape(n, lay.q_rows_per_rank)
    torch.save({"attn": attn.cpu(), "cache": on["cache"].cpu(), "health": health.cpu()}, dst)


if __name__ == "__main__":
    _gpu_main(sys.argv[1], sys.argv[2])
