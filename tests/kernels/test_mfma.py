"""The wide kernel's MFMA GEMM phase (mono_aot/kernels/mfma.py).

Three kinds of evidence, none needing a GPU except the last:
- the tiling plans of the shipped layout (row split, LDS, chunking) and their input checks;
- a host emulation of one whole phase that runs the kernel's own index functions (who loads
  which 16 bytes, which MFMA lane holds what, where partials are parked in LDS and read back,
  which thread emits which output) on Python ints, with the documented MFMA operand layouts,
  against torch's ``decode(W) @ x^T * s``; it also checks every weight byte is loaded by exactly
  one load instruction and every output is emitted exactly once;
- compiles of the standalone four-projection kernel for gfx942 and gfx950 in fresh worker
  subprocesses (metadata and ISA), and a ROCm-marked run of it against torch on a real GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from mono_aot.kernels import mfma
from mono_aot.reference import fp8
from mono_aot.reference.weights import quantize_rows
from mono_aot.spec.arch import ARCHS
from mono_aot.spec.layouts import resolve_layout

LAYOUT = "minimax-m3.1-dspark-tp4"
ARCH_LIST = ("gfx942", "gfx950")


@pytest.fixture(scope="module")
def layout():
    return resolve_layout(LAYOUT)


# ---------------------------------------------------------------------------------------------
# plans
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCH_LIST)
def test_wide_plans_of_the_shipped_layout(layout, arch):
    plans = mfma.wide_plans(layout, arch)
    assert set(plans) == set(mfma.PROJECTIONS)
    shapes = {k: (p.rows, p.cols, p.pairs) for k, p in plans.items()}
    assert shapes == {
        "qkv": (2304, 6144, False),
        "o": (6144, 2048, False),
        "gu": (6144, 6144, True),
        "down": (6144, 3072, False),
    }
    ctas = layout.ctas(arch)
    for name, p in plans.items():
        assert p.ctas == ctas and p.threads == 512 and p.max_tokens == 56
        assert p.min_tokens == 21  # wide_base 3 requests x 7 tokens
        assert (p.mx_block, p.fnuz) == (32, arch == "gfx942")  # MXFP8; gfx942 reads e4m3fnuz
        assert p.mfma_k == {"gfx942": 16, "gfx950": 32}[arch]
        # every row (pair) belongs to exactly one workgroup, runs differ by at most one row
        runs = [mfma.cta_run(p, c) for c in range(ctas)]
        assert [r for r, _ in runs] == sorted(r for r, _ in runs)
        covered = [i for r0, cnt in runs for i in range(r0, r0 + cnt)]
        assert covered == list(range(p.seg_rows)), name
        counts = {cnt for _, cnt in runs}
        assert counts <= {p.seg_rows // ctas, -(-p.seg_rows // ctas)} and min(counts) >= 1
        assert max(counts) <= p.seg_tiles * mfma.TILE
        assert [mfma.cta_run(p, c) for c in (0, ctas - 1)] == [
            (a, b - a) for a, b in (p.cta_rows(0), p.cta_rows(ctas - 1))
        ]
        # the K loop: 8 waves x chunks x 64 cover cols once
        assert p.chunks_per_wave * p.waves * mfma.CHUNK == p.cols
        assert p.lds_bytes <= mfma.DEFAULT_LDS_BUDGET
        assert p.lds_bytes <= ARCHS[arch].lds_bytes_per_cu
    assert plans["qkv"].row_tiles == 1  # 2304 rows / 304 or 256 workgroups: <= 9 rows each
    assert plans["gu"].row_tiles == 2  # a gate tile and an up tile
    assert sum(p.weight_bytes for p in plans.values()) == 83_361_792  # per layer and rank


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"rows": 64, "cols": 1000}, "cols=1000 must be a multiple of 512"),
        ({"rows": 63, "cols": 512, "pairs": True}, "rows=63 must be even"),
        ({"rows": 10, "cols": 512, "ctas": 11}, "cannot give each of 11 workgroups"),
        ({"rows": 64, "cols": 512, "max_tokens": 8, "min_tokens": 9}, "tokens 9..8"),
        ({"rows": 64, "cols": 512, "mfma_k": 8}, "mfma_k=8"),
        ({"rows": 64, "cols": 512, "threads": 500}, "threads=500"),
        ({"rows": 64, "cols": 512, "x_stride": 516}, "x_stride=516"),
        (
            {"rows": 100, "cols": 512, "ctas": 2, "lds_budget": 4096},
            "lds_budget=4096 is below one reduction round (8192 bytes)",
        ),
    ],
)
def test_plan_rejects_what_the_kernel_cannot_do(kwargs, needle):
    args = {"ctas": 4, "max_tokens": 64, **kwargs}
    with pytest.raises(ValueError, match="GemmPlan") as e:
        mfma.GemmPlan(**args)
    assert needle in str(e.value)


def test_unknown_arch_is_named(layout):
    with pytest.raises(Exception, match="gfx940"):
        mfma.wide_plans(layout, "gfx940")


def test_narrow_plans_cover_the_narrow_token_range(layout):
    p = mfma.plans_for(layout, "gfx942", "narrow")["gu"]
    assert (p.min_tokens, p.max_tokens) == (7, 14)  # 1..2 requests of 7 tokens
    assert (p.min_token_tiles, p.token_tiles) == (1, 1)  # a single version


# ---------------------------------------------------------------------------------------------
# host emulation of one phase with the kernel's index functions
# ---------------------------------------------------------------------------------------------


def _mfma_model(a_ops, b_ops, c, kl):
    """D += A x B for one 16x16 MFMA, from per-lane operands (AMD's documented layouts:
    A[i][k] in lane i + 16 (k // kl), element k % kl; B[k][j] in lane j + 16 (k // kl);
    D[i][j] in lane j + 16 (i // 4), item i % 4). a_ops, b_ops: [64, kl]; c: [64, 4]."""
    A = torch.zeros(16, 4 * kl, dtype=torch.float64)
    B = torch.zeros(4 * kl, 16, dtype=torch.float64)
    for g in range(4):
        A[:, g * kl : (g + 1) * kl] = a_ops[16 * g : 16 * g + 16]
        B[g * kl : (g + 1) * kl, :] = b_ops[16 * g : 16 * g + 16].T
    D = A @ B
    lanes = torch.arange(64)
    for item in range(4):
        c[:, item] += D[4 * (lanes // 16) + item, lanes % 16]
    return c


def emulate(P, dec, s, x, n):
    """Run one phase for every workgroup as the kernel does; -> (emitted {(tok, row): value},
    load counts {(row, k16): instructions that load it})."""
    kl = P.mfma_k // 4
    steps = mfma.LANE_K // kl
    nt = mfma.version_tiles(P, n)
    out, loads = {}, Counter()
    lanes = range(64)
    for wg, p in [(wg, p) for wg in range(P.ctas) for p in range(P.passes)]:
        base = mfma.pass_base(P, p)  # row passes: each a K sweep over its own row tiles
        r0, cnt = mfma.cta_run(P, wg)
        red = torch.full((P.lds_floats,), float("nan"), dtype=torch.float64)
        accs = []
        for wave in range(P.waves):
            acc = [
                [torch.zeros(64, 4, dtype=torch.float64) for _ in range(nt)]
                for _ in range(P.row_tiles)
            ]
            for q in range(P.chunks_per_wave):
                wv = []
                for m in range(P.row_tiles):
                    rows = [mfma.lane_row(P, r0, cnt, m, lane % 16, base) for lane in lanes]
                    ks = [mfma.lane_k(P, wave, lane // 16, q) for lane in lanes]
                    for addr in set(
                        zip(rows, ks, strict=True)
                    ):  # one instruction, distinct addresses
                        loads[addr] += 1
                    wv.append(
                        torch.stack([dec[r, k : k + 16] for r, k in zip(rows, ks, strict=True)])
                    )
                for t in range(nt):
                    toks = [mfma.lane_tok(t, lane % 16, n) for lane in lanes]
                    ks = [mfma.lane_k(P, wave, lane // 16, q) for lane in lanes]
                    xv = torch.stack([x[tk, k : k + 16] for tk, k in zip(toks, ks, strict=True)])
                    for i in range(steps):
                        for m in range(P.row_tiles):
                            sl = slice(i * kl, (i + 1) * kl)
                            _mfma_model(wv[m][:, sl], xv[:, sl], acc[m][t], kl)
            accs.append(acc)
        for tiles in mfma.round_tiles(P, nt):
            if not (tiles[0] == 0 or nt > P.min_token_tiles or n > tiles[0] * mfma.TILE):
                continue
            for wave in range(P.waves):
                for tr, t in enumerate(tiles):
                    for m in range(P.row_tiles):
                        for lane in lanes:
                            off = mfma.red_park(P, tr, wave, m, lane)
                            red[off : off + 4] = accs[wave][m][t][lane]
            elems = len(tiles) * mfma.TILE * P.seg_tiles * mfma.TILE
            for k in range(-(-elems // P.threads)):
                ragged = k * P.threads + P.threads > elems
                for tid in range(P.threads):
                    e = tid + k * P.threads
                    tr, j, r, f = mfma.red_elem(P, min(e, elems - 1) if ragged else e)
                    tok = tiles[0] * mfma.TILE + tr * mfma.TILE + j
                    if not (base + r < cnt and tok < n and e < elems):
                        continue
                    sums = [
                        sum(
                            float(
                                red[mfma.red_read(P, tr, wv, seg * P.seg_tiles + r // mfma.TILE, f)]
                            )
                            for wv in range(P.waves)
                        )
                        for seg in range(2 if P.pairs else 1)
                    ]
                    row = r0 + base + r
                    vals = [sums[0] * float(s[row])]
                    if P.pairs:
                        vals.append(sums[1] * float(s[row + P.seg_rows]))
                    assert (tok, row) not in out, f"({tok}, {row}) emitted twice"
                    out[(tok, row)] = vals
    return out, loads


EMU_CASES = [
    # rows, cols, ctas, max_tokens, min_tokens, pairs, threads, mfma_k, lds_budget, n values
    (40, 1024, 3, 40, 1, False, 512, 16, 16384, (1, 16, 17, 40)),  # runs of 13/14, 1..3 tiles
    (40, 1024, 3, 40, 24, False, 512, 32, 16384, (5, 33)),  # catch-all smallest version
    (58, 512, 4, 24, 1, True, 512, 16, 16384, (9, 24)),  # gate/up pairs, ragged reduction
    (100, 512, 3, 20, 1, False, 256, 32, 32768, (20,)),  # 3 row tiles, 4 waves, 2 passes
    (32, 512, 8, 48, 1, False, 512, 16, 16384, (0, 47)),  # 4 rows per run, 2 tiles per round
    (100, 512, 2, 40, 1, False, 512, 16, 16384, (3, 40)),  # runs of 4 tiles: 2 row passes
    (90, 512, 2, 24, 1, False, 512, 32, 16384, (24,)),  # 3 tiles: a clamped last pass
    (200, 512, 2, 24, 1, True, 512, 16, 16384, (17,)),  # 50 pairs a run: 4 passes of a pair
    (100, 512, 2, 40, 24, False, 512, 32, 8192, (1, 40)),  # one tile a pass (as o/down at 32)
]


@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: f"{c[0]}x{c[1]}-pairs{int(c[5])}-k{c[7]}")
def test_emulated_phase_matches_torch(case):
    rows, cols, ctas, max_t, min_t, pairs, threads, mk, budget, ns = case
    P = mfma.GemmPlan(
        rows,
        cols,
        ctas,
        max_t,
        threads=threads,
        pairs=pairs,
        min_tokens=min_t,
        mfma_k=mk,
        lds_budget=budget,
    )
    gen = torch.Generator().manual_seed(rows * 1000 + cols)
    codes, s = quantize_rows(torch.randn(rows, cols, generator=gen), "e4m3fnuz")
    dec = fp8.decode(codes, "e4m3fnuz", torch.float64)
    for n in ns:
        x = torch.randn(max(n, 1), cols, generator=gen).to(torch.bfloat16).to(torch.float64)
        ref = (x[:n] @ dec.T) * s.to(torch.float64)  # [n, rows]
        out, loads = emulate(P, dec, s, x, n)
        # every 16-byte piece of every row is loaded by exactly one load instruction
        assert set(loads) == {(r, k) for r in range(rows) for k in range(0, cols, 16)}
        if P.passes == 1:
            assert set(loads.values()) == {1}
        else:  # only a clamped last pass repeats rows (never at the shipped CTA counts)
            assert P.passes * P.seg_tiles > P.run_tiles or set(loads.values()) == {1}
        # every (token < n, row) is emitted exactly once, with the right value
        if pairs:
            want = {
                (t, j): [ref[t, j], ref[t, j + P.seg_rows]]
                for t in range(n)
                for j in range(P.seg_rows)
            }
        else:
            want = {(t, r): [ref[t, r]] for t in range(n) for r in range(rows)}
        assert set(out) == set(want), f"n={n}"
        for key, vals in want.items():
            for got, w in zip(out[key], vals, strict=True):
                assert abs(got - float(w)) <= 1e-9 * (1 + abs(float(w))), (n, key)


# ---------------------------------------------------------------------------------------------
# compiles of the standalone kernel (fresh worker subprocesses, once per session and arch)
# ---------------------------------------------------------------------------------------------

PROVIDER = '''
"""Test provider: the MFMA GEMM phase alone, as a four-projection kernel."""
from mono_aot.kernels import mfma

import flydsl.compiler as flyc
import flydsl.expr as fx

KERNEL_NAMES = {"wide": mfma.STANDALONE_KERNEL, "perm": "k3_perm_probe"}


@flyc.kernel(known_block_size=[64, 1, 1])
def k3_perm_probe(out: fx.Int64):
    # constant operands: LLVM folds the v_perm_b32 and the ISA shows its result
    word = mfma.bf16_pair(fx.Int32(0x88776655), fx.Int32(0x44332211))
    fx.generic_store(fx.inttoptr(fx.Pointer[fx.Int32, fx.AddressSpace.Global, 4].ir_type, out), word)


@flyc.jit
def launch_perm(out: fx.Int64, stream: fx.Stream = fx.Stream(None)):
    k3_perm_probe(out).launch(grid=(1, 1, 1), block=(64, 1, 1), stream=stream)


def launcher_for(variant, layout, arch):
    return launch_perm if variant == "perm" else mfma.standalone_launcher(layout, arch)


def trace_args(variant, layout):
    return (0,) if variant == "perm" else mfma.standalone_trace_args(layout)
'''


def _standalone_kernargs():
    out, off = [], 0
    for name, kind in mfma.STANDALONE_ARGS:
        size = 8 if kind == "i64" else 4
        off = -(-off // size) * size
        out.append((name, off, size))
        off += size
    return tuple(out)


@pytest.fixture(scope="session")
def builds(tmp_path_factory):
    """{(arch, mode): CompileResult} for the standalone kernel (and the perm probe), compiled
    two at a time."""
    from mono_aot.compiler.compile import compile_kernel
    from mono_aot.compiler.inputs import directory_provider

    root = tmp_path_factory.mktemp("mfma-build")
    pdir = root / "provider"
    pdir.mkdir()
    (pdir / "k3_mfma_provider.py").write_text(PROVIDER)
    prov = directory_provider(pdir, "k3_mfma_provider")
    lay = resolve_layout(LAYOUT)
    jobs = [(arch, "compile") for arch in ARCH_LIST] + [("gfx942", "perm")]

    def run(job):
        arch, mode = job
        if mode == "perm":
            return compile_kernel(prov, "perm", lay, arch, root / "perm")
        return compile_kernel(prov, "wide", lay, arch, root / arch)

    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(jobs, pool.map(run, jobs), strict=True))
    # one compile gives the code object and its ISA: the "isa" builds are the same results
    done.update({(arch, "isa"): done[(arch, "compile")] for arch in ARCH_LIST})
    return done


def _expected_counts(layout, arch):
    """Loads and MFMAs the standalone kernel must contain: every version of every projection
    (token tiles from min to max), each chunk's loads exactly once."""
    w_loads = x_loads = mfmas = 0
    for p in mfma.wide_plans(layout, arch).values():
        steps = mfma.LANE_K // (p.mfma_k // 4)
        for nt in range(p.min_token_tiles, p.token_tiles + 1):
            w_loads += p.chunks_per_wave * p.row_tiles
            x_loads += p.chunks_per_wave * 2 * nt
            mfmas += p.chunks_per_wave * p.row_tiles * nt * steps
    return w_loads, x_loads, mfmas


@pytest.mark.parametrize("arch", ARCH_LIST)
def test_standalone_compiles_and_passes_the_publish_rules(builds, layout, arch):
    from mono_aot.compiler.checks import Expectation, check

    r = builds[(arch, "compile")]
    assert "error:" not in r.stderr
    exp = Expectation(
        kernel=mfma.STANDALONE_KERNEL + "_0",
        arch=arch,
        ctas=layout.ctas(arch),
        threads=layout.kernel.threads,
        kernargs=_standalone_kernargs(),
    )
    violations = check(exp, r.code_object, r.metadata, r.stderr, r.worker["launches"])
    assert violations == [], [str(v) for v in violations]
    k = r.metadata.kernels[0]
    assert k.scratch == 0 and k.vgpr_spill == 0 and k.sgpr_spill == 0
    assert k.vgpr + k.agpr <= 256  # 8 waves = 2 per SIMD: at most 256 registers per lane
    lds = max(p.lds_bytes for p in mfma.wide_plans(layout, arch).values())
    assert k.lds == lds <= 64 * 1024
    assert k.max_flat_workgroup_size >= layout.kernel.threads
    # ~2000 MFMAs and ~800 loads straight-line: tens of KB, not an emptied kernel
    assert 20_000 < r.metadata.text_bytes < 400_000


@pytest.mark.parametrize("arch", ARCH_LIST)
def test_standalone_isa_has_what_the_design_relies_on(builds, layout, arch):
    isa = builds[(arch, "isa")].isa
    ops = Counter(ln.split()[0] for ln in isa.splitlines() if ln.startswith("\t") and ln.strip())
    w_loads, x_loads, mfmas = _expected_counts(layout, arch)
    mfma_op = {"gfx942": "v_mfma_f32_16x16x16_bf16", "gfx950": "v_mfma_f32_16x16x32_bf16"}[arch]
    assert ops[mfma_op] == mfmas
    assert sum(v for op, v in ops.items() if op.startswith("v_mfma")) == mfmas
    # every weight and activation load is one 16-byte global load, none split or duplicated
    assert ops["global_load_dwordx4"] == w_loads + x_loads
    nt_loads = sum(
        1 for ln in isa.splitlines() if "global_load_dwordx4" in ln and ln.rstrip().endswith(" nt")
    )
    assert nt_loads == w_loads  # weights streamed non-temporally, activations cached
    # fp8 -> f32 in hardware (4 fp8 per i32: 2 cvts), f32 pairs -> bf16 pairs by byte permute
    assert ops["v_cvt_pk_f32_fp8_e32"] + ops["v_cvt_pk_f32_fp8_sdwa"] == 8 * w_loads
    assert ops["v_perm_b32"] >= 8 * w_loads
    # the reduction parks partials with 16-byte LDS stores; no scratch, no flat access
    assert ops["ds_write_b128"] > 0
    assert not [op for op in ops if op.startswith(("scratch_", "flat_", "buffer_store"))]


def test_bf16_pair_packs_the_high_halves_low_first(builds):
    """The compiler's own semantics of the one v_perm_b32 the fp8 -> bf16 conversion uses:
    bf16_pair(0x88776655, 0x44332211) = 0x4433 << 16 | 0x8877 (folded to a constant)."""
    isa = builds[("gfx942", "perm")].isa
    assert "0x44338877" in isa
    assert "v_perm_b32" not in isa


# ---------------------------------------------------------------------------------------------
# on a GPU: the standalone kernel against torch (run in a fresh interpreter: this file as a
# script, with a private FlyDSL cache)
# ---------------------------------------------------------------------------------------------

GPU_NS = (1, 8, 17, 24, 40, 64)  # below the wide minimum, each version, its edges, the max
GPU_LAYERS, GPU_LAYER = 2, 1  # stacked weights; the kernel must pick layer 1's


def _device_arch() -> str:
    from mono_aot.spec.arch import base_arch

    return base_arch(torch.cuda.get_device_properties(0).gcnArchName)


def _check_report(report: dict, arch: str, ns: tuple[int, ...]) -> None:
    assert report["arch"] == arch
    assert [(r["n"], r["proj"]) for r in report["results"]] == [
        (n, p) for n in ns for p in mfma.PROJECTIONS
    ]
    for r in report["results"]:
        what = f"{r['proj']} n={r['n']}"
        assert r["nan_in_output"] == 0, what  # every (token < n, row) was written
        assert r["touched_past_n"] == 0, what  # and nothing else
        assert r["rel_error"] <= 1e-5, (what, r["rel_error"])
        assert r["max_bound_ratio"] <= 1.0, (what, r["max_bound_ratio"])


@pytest.mark.rocm
def test_standalone_matches_torch_on_gpu(tmp_path):
    arch = _device_arch()
    if arch not in ARCH_LIST:
        pytest.skip(f"the device is {arch}; the kernels target {', '.join(ARCH_LIST)}")
    dst = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYDSL_")}
    env["FLYDSL_RUNTIME_CACHE_DIR"] = str(tmp_path / "flydsl-cache")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), arch, str(dst)],
        env=env, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "error:" not in proc.stderr, proc.stderr[-3000:]
    _check_report(json.loads(dst.read_text()), arch, GPU_NS)


def _small_layout():
    """The small test layout (a ninth of the shipped one's weights) for the CPU dry run."""
    return resolve_layout("emulator-tiny-tp4")


def _stand_in(by_ptr: dict, fmt, wrong_layer: bool = False):
    """The kernel's contract computed by torch on the CPU, from the same argument values."""
    from mono_aot.reference.weights import dequantize_rows

    def launch(*args, stream=None):
        t = dict(zip((a for a, _ in mfma.STANDALONE_ARGS), args, strict=True))
        layer, n = (0 if wrong_layer else t["layer"]), t["n"]
        for w, sc, x, out in (
            ("qkv_w", "qkv_s", "h", "out_qkv"),
            ("o_w", "o_s", "attn", "out_o"),
            ("gu_w", "gu_s", "h", "out_gu"),
            ("d_w", "d_s", "act", "out_d"),
        ):
            wd = dequantize_rows(by_ptr[t[w]][layer], by_ptr[t[sc]][layer], fmt, torch.float32)
            by_ptr[t[out]][:n] = by_ptr[t[x]][:n].float() @ wd.T

    return launch


@pytest.mark.parametrize("wrong", [False, True], ids=["right", "wrong-layer"])
def test_gpu_harness_dry_run_on_cpu(tmp_path, wrong):
    """The ROCm test's own code (inputs, poison, reference, report, checks) run on the CPU
    with a torch stand-in for the kernel: it passes a right one and catches a wrong one."""
    dst = tmp_path / "report.json"
    ns = (1, 17)
    _gpu_main("gfx942", str(dst), layout=_small_layout(), ns=ns, device="cpu", stand_in=wrong)
    if wrong:
        with pytest.raises(AssertionError):
            _check_report(json.loads(dst.read_text()), "gfx942", ns)
    else:
        _check_report(json.loads(dst.read_text()), "gfx942", ns)


def _random_codes(shape, fmt, gen):
    """Uniform over every finite code of ``fmt`` (subnormals, both zeros, +-max included)."""
    codes = torch.randint(0, 256, shape, generator=gen, dtype=torch.int32).to(torch.uint8)
    nan = [0x7F, 0xFF] if fmt.name == "e4m3fn" else [0x80]
    for c in nan:
        codes[codes == c] = 0x3A
    return codes


def _gpu_main(arch, dst, layout=None, ns=GPU_NS, device="cuda", stand_in=None) -> None:
    """Run the standalone kernel (or, with ``stand_in`` not None, a torch stand-in: False a
    right one, True one that reads the wrong layer) for every n and write the report."""
    from mono_aot.reference.weights import dequantize_rows

    lay = layout or resolve_layout(LAYOUT)
    fmt = fp8.format_for_arch(arch)
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(20240)
    plans = mfma.wide_plans(lay, arch)
    T = lay.variant_tokens("wide")
    w, s = {}, {}
    for name, p in plans.items():
        w[name] = _random_codes((GPU_LAYERS, p.rows, p.cols), fmt, gen).to(dev)
        s[name] = (torch.rand(GPU_LAYERS, p.rows, generator=gen) * 1e-3 + 1e-3).to(dev)
    xs = {
        "h": torch.randn(T, lay.model.hidden, generator=gen),
        "attn": torch.randn(T, lay.o_cols_per_rank, generator=gen),
        "act": torch.randn(T, lay.mlp_per_rank, generator=gen),
    }
    src = {"qkv": "h", "o": "attn", "gu": "h", "down": "act"}
    wd = {k: dequantize_rows(w[k][GPU_LAYER], s[k][GPU_LAYER], fmt, torch.float64) for k in plans}
    by_ptr = {}
    if stand_in is None:
        launch = mfma.standalone_launcher(lay, arch)
        stream = torch.cuda.current_stream()
    else:
        launch, stream = _stand_in(by_ptr, fmt, wrong_layer=stand_in), None
    results = []
    for n in ns:
        # tokens past n are NaN: a kernel that mixed them into a valid output would show it
        x_dev = {}
        for k, v in xs.items():
            t = v.to(torch.bfloat16).to(dev)
            t[n:] = float("nan")
            x_dev[k] = t
        outs = {k: torch.full((T, p.rows), float("nan"), device=dev) for k, p in plans.items()}
        args = [
            w["qkv"], s["qkv"], w["o"], s["o"], w["gu"], s["gu"], w["down"], s["down"],
            x_dev["h"], x_dev["attn"], x_dev["act"],
            outs["qkv"], outs["o"], outs["gu"], outs["down"],
        ]  # fmt: skip
        by_ptr.update({a.data_ptr(): a for a in args})
        launch(*[a.data_ptr() for a in args], GPU_LAYER, n, stream=stream)
        if stand_in is None:
            torch.cuda.synchronize()
        for name in mfma.PROJECTIONS:
            x = x_dev[src[name]][:n].to(torch.float64)
            ref = x @ wd[name].T  # gu: gate columns then up columns, as the kernel stores them
            bound = 1e-4 * (x.abs() @ wd[name].abs().T) + 1e-30
            got = outs[name][:n].to(torch.float64)
            results.append(
                {
                    "proj": name,
                    "n": n,
                    "nan_in_output": int(torch.isnan(got).sum()),
                    "touched_past_n": int((~torch.isnan(outs[name][n:])).sum()),
                    "rel_error": float((got - ref).norm() / ref.norm()),
                    "max_bound_ratio": float(((got - ref).abs() / bound).max()),
                }
            )
    Path(dst).write_text(json.dumps({"arch": arch, "results": results}, indent=1))


if __name__ == "__main__":
    _gpu_main(sys.argv[1], sys.argv[2])
