"""MFMA GEMM phase of the wide drafter kernel: fp8 weight rows times bf16 activations.

``out[t, r] = s[r] * sum_k decode(W[r, k]) * x[t, k]`` for the n (<= 64) tokens of a wide launch.
Output rows are split evenly across the workgroups (one contiguous run of ceil(rows / ctas) or
floor(rows / ctas) rows each); the K dimension is split across the workgroup's waves; the waves'
partial tiles are summed through LDS and handed, one scaled fp32 value at a time, to an
``emit`` callback (``store_f32`` writes an fp32 ``[n, rows]`` matrix; K1's kernel may pass its
own, e.g. the SwiGLU of a gate/up pair or an all-reduce mailbox push).

Per wave and per 64-wide K chunk, lane ``l`` owns MFMA row ``l % 16`` and K group ``l // 16``:
one ``global_load_dwordx4`` brings the 16 fp8 weights ``k0 + 16 * (l // 16) + [0, 16)`` of its
row, ``v_cvt_pk_f32_fp8`` + ``v_perm_b32`` turn them into 8 bf16 pairs (exact: every e4m3
value is a bf16 value, so taking the f32's high half is the conversion), and two 16-byte loads
bring the same 16 K positions of token ``l % 16`` of each 16-token tile. Per (row tile, token
tile) four ``v_mfma_f32_16x16x16_bf16`` (gfx942) or two ``v_mfma_f32_16x16x32_bf16`` (gfx950)
consume them: an MFMA sums over (lane group, element) pairs and A and B map those to the same
K positions, so any such assignment gives the full dot product. Every weight byte is loaded by
exactly one load instruction per call; fp32 accumulation; the row scale is applied at the end.

Rows past a workgroup's last row (a tile is 16 rows, a workgroup has ~8-24) and tokens past n
load a clamped address (the last valid row / token: bytes another lane of the same instruction
loads, or token n - 1) instead of branching or selecting zeros; MFMA rows and columns are
independent, so those lanes only fill output positions that are never emitted. The number of
token tiles is chosen at run time among straight-line versions (one per tile count from the
plan's fewest to most tokens), each behind a workgroup-uniform branch.

Nothing here reads ``grid_dim`` or calls device libraries; the only LDS is the caller's
``red`` buffer of ``GemmPlan.lds_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr, rocdl
from flydsl.expr.typing import T

from mono_aot.kernels.common import e8m0_to_f32, fn_as_fnuz, opaque, scale_byte
from mono_aot.spec.layouts import Layout, Variant
from mono_aot.spec.plans import (  # noqa: F401 (GemmPlan, PlanError, MFMA_K: re-exported)
    CHUNK,
    DEFAULT_LDS_BUDGET,
    LANE_K,
    MFMA_K,
    PREFETCH_VGPRS,
    TILE,
    GemmPlan,
    PlanError,
    gemm_plans,
)
from mono_aot.spec.util import ceil_div

WAVE = 64
BF16_PAIR_FROM_F32_HIGH_HALVES = (
    0x07060302  # v_perm_b32 selector: hi16(src_lo) | hi16(src_hi) << 16
)

# The projections of one decoder layer as the wide kernel runs them (see ``wide_plans``).
PROJECTIONS: tuple[str, ...] = ("qkv", "o", "gu", "down")


def plans_for(
    layout: Layout, arch: str, variant: Variant = "wide", lds_budget: int | None = None
) -> dict[str, GemmPlan]:
    """The four projections of a layer as MFMA GEMMs (``mono_aot.spec.plans.gemm_plans``;
    ``lds_budget`` None: the budgets the kernel uses, ``lds_budgets``)."""
    return gemm_plans(layout, arch, variant, lds_budget)


def wide_plans(layout: Layout, arch: str, lds_budget: int | None = None) -> dict[str, GemmPlan]:
    """``plans_for(layout, arch, "wide", lds_budget)``."""
    return plans_for(layout, arch, "wide", lds_budget)


# ---------------------------------------------------------------------------------------------
# Index math: the one definition of who loads, multiplies, parks and emits what. Written with
# operators only (plus ``_imin``/``_imax``), so the kernel runs it on DSL Int32 values and the
# host-side emulator in the tests runs the very same functions on Python ints.
# ---------------------------------------------------------------------------------------------


def _imin(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return fx.min(
        fx.Int32(a) if isinstance(a, int) else a, fx.Int32(b) if isinstance(b, int) else b
    )


def _imax(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return fx.max(
        fx.Int32(a) if isinstance(a, int) else a, fx.Int32(b) if isinstance(b, int) else b
    )


def cta_run(P: GemmPlan, wg: Any) -> tuple[Any, Any]:
    """(first row (pair) r0, count) of workgroup ``wg``'s run; count >= 1."""
    r0 = (wg * P.seg_rows) // P.ctas
    return r0, ((wg + 1) * P.seg_rows) // P.ctas - r0


def _plus(base: Any, v: Any) -> Any:
    """``base + v``, emitting nothing for the single pass's base 0."""
    return v if isinstance(base, int) and base == 0 else base + v


def pass_base(P: GemmPlan, p: Any) -> Any:
    """First run row (pair) of row pass ``p``."""
    return p * (P.seg_tiles * TILE)


def lane_row(P: GemmPlan, r0: Any, cnt: Any, m: int, lr: Any, base: Any = 0) -> Any:
    """Matrix row lane ``lr`` (0..15) of row tile ``m`` of the row pass starting at run row
    ``base`` loads: past the run's end it repeats the run's last row (same bytes as a valid
    lane of the same load; never emitted)."""
    local = _imin(_plus(base, (m % P.seg_tiles) * TILE + lr), cnt - 1)
    return r0 + local + (P.seg_rows if m >= P.seg_tiles else 0)


def lane_k(P: GemmPlan, wave: Any, grp: Any, q: int) -> Any:
    """First of the 16 K positions a lane of K group ``grp`` (0..3) of ``wave`` covers in its
    chunk ``q``: the waves' chunks interleave, so the workgroup sweeps each row left to right."""
    return (q * P.waves + wave) * CHUNK + grp * LANE_K


def lane_tok(t: int, lr: Any, n: Any) -> Any:
    """Token lane ``lr`` of token tile ``t`` loads: past n it repeats token n - 1 (or 0)."""
    return _imin(t * TILE + lr, _imax(n - 1, 0))


def version_tiles(P: GemmPlan, n: int) -> int:
    """Token tiles of the version that runs for n tokens (host mirror of ``_phase_versions``)."""
    return min(P.token_tiles, max(P.min_token_tiles, ceil_div(n, TILE)))


def round_tiles(P: GemmPlan, nt: int) -> list[list[int]]:
    """The token tiles of each reduction round when ``nt`` tiles were computed."""
    tpr = P.tiles_per_round
    return [list(range(t, min(t + tpr, nt))) for t in range(0, nt, tpr)]


def red_park(P: GemmPlan, tr: int, wave: Any, m: int, lane: Any) -> Any:
    """Float offset in ``red`` of a lane's 4 accumulators of (round tile tr, row tile m)."""
    return ((tr * P.waves + wave) * P.row_tiles + m) * (TILE * TILE) + lane * 4


def red_elem(P: GemmPlan, e: Any) -> tuple[Any, Any, Any, Any]:
    """Output element ``e`` of a round -> (round tile tr, token j in the tile, row (pair) r in
    the run, float offset f within one parked (wave, row tile) block of the row's MFMA tile).

    Consecutive e walk consecutive rows of one token (coalesced emits). The accumulator of
    D[row i][col j] lives in lane ``j + 16 * (i // 4)``, item ``i % 4`` (MFMA 16x16 D layout).
    """
    seg_w = P.seg_tiles * TILE
    tr = e // (TILE * seg_w)
    rem = e % (TILE * seg_w)
    j = rem // seg_w
    r = rem % seg_w
    rr = r % TILE
    f = (j + (rr // 4) * TILE) * 4 + rr % 4
    return tr, j, r, f


def red_read(P: GemmPlan, tr: Any, wv: int, m: Any, f: Any) -> Any:
    """Float offset in ``red`` of wave ``wv``'s partial at ``f`` of (round tile tr, row tile m)."""
    return ((tr * P.waves + wv) * P.row_tiles + m) * (TILE * TILE) + f


# ---------------------------------------------------------------------------------------------
# Device code
# ---------------------------------------------------------------------------------------------


def _gptr(dtype: Any, addr: Any, align: int) -> Any:
    return fx.inttoptr(fx.Pointer[dtype, fx.AddressSpace.Global, align].ir_type, addr)


def _load16(addr: Any, *, stream: bool = False) -> Any:
    """One global_load_dwordx4 at a 16-byte aligned Int64 address -> vector<4xi32>."""
    return fx.generic_load(_gptr(fx.Int32, addr, 16), count=4, nontemporal=stream)


def _fp8x4_to_bf16x4(word: Any) -> tuple[Any, Any]:
    """Four fp8 codes of one i32 (byte i = element i) -> two i32 of bf16 pairs (elements 0,1 | 2,3).

    v_cvt_pk_f32_fp8 decodes in the arch's format; an e4m3 value has 3 mantissa bits and an
    exponent inside bf16's range, so its f32 has 16 zero low bits and the high half is exact.
    """
    out = []
    for hi in (False, True):
        f2 = fx.Vector(rocdl.cvt_pk_f32_fp8(T.f32x2, word, hi))
        out.append(bf16_pair(f2[0].bitcast(fx.Int32), f2[1].bitcast(fx.Int32)))
    return out[0], out[1]


def _mx_to_bf16x4(word: Any, sc: Any, fnuz: bool) -> tuple[Any, Any]:
    """``_fp8x4_to_bf16x4`` of mxfp8 codes times their block's scale ``sc`` (a power of two):
    the f32 product is exact, and its high half too while it stays inside bf16's normal range
    (scale bytes 3..246, the runner's bound)."""
    w = fn_as_fnuz(word) if fnuz else fx.Int32(word)
    out = []
    for hi in (False, True):
        f2 = fx.Vector(rocdl.cvt_pk_f32_fp8(T.f32x2, w, hi))
        out.append(bf16_pair((f2[0] * sc).bitcast(fx.Int32), (f2[1] * sc).bitcast(fx.Int32)))
    return out[0], out[1]


def bf16_pair(lo_bits: Any, hi_bits: Any) -> Any:
    """The high halves of two f32 bit patterns packed into one i32, ``lo``'s in bits 0..15
    (one v_perm_b32): the bf16 pair when the low halves are zero."""
    return fx.Int32(rocdl.perm_b32(hi_bits, lo_bits, fx.Int32(BF16_PAIR_FROM_F32_HIGH_HALVES)))


def _operand(words: list[Any]) -> Any:
    """i32 words of bf16 pairs -> an MFMA bf16 operand (2 words: vector<4xi16> for the 16x16x16
    MFMA; 4 words: vector<8xbf16> for gfx950's 16x16x32)."""
    v = fx.Vector.from_elements(words, fx.Int32)
    return v.bitcast(fx.Int16) if len(words) == 2 else v.bitcast(fx.BFloat16)


def _mfma(a: Any, b: Any, c: Any, k: int) -> Any:
    if k == 32:
        return fx.Vector(rocdl.mfma_f32_16x16x32_bf16(T.vec(4, T.f32), [a, b, c]))
    return fx.Vector(rocdl.mfma_f32_16x16x16bf16_1k(T.vec(4, T.f32), [a, b, c]))


def _f32_shared(red: Any) -> Any:
    """The caller's LDS buffer (a shared pointer of any element type, or an ``fx.Array``) as a
    16-byte aligned fp32 shared pointer."""
    ptr = red if isinstance(red, fx.Pointer) else red.ptr
    return fx.recast_iter(fx.Pointer[fx.Float32, fx.AddressSpace.Shared, 16].ir_type, ptr)


def store_f32(out: Any, stride: int) -> Callable[..., None]:
    """``emit`` for plain plans writing ``out[tok, row]`` (fp32, row stride ``stride`` elements)."""

    def emit(tok: Any, row: Any, value: Any) -> None:
        base = fx.Int64(tok) * stride + fx.Int64(row)
        fx.generic_store(_gptr(fx.Float32, out + base * 4, 4), value)

    return emit


def store_pairs_f32(out: Any, stride: int, half: int) -> Callable[..., None]:
    """``emit`` for pair plans writing gate to ``out[tok, j]`` and up to ``out[tok, half + j]``."""

    def emit(tok: Any, j: Any, gate: Any, up: Any) -> None:
        base = fx.Int64(tok) * stride + fx.Int64(j)
        fx.generic_store(_gptr(fx.Float32, out + base * 4, 4), gate)
        fx.generic_store(_gptr(fx.Float32, out + (base + half) * 4, 4), up)

    return emit


@flyc.jit
def mfma_gemm(wg, tid, w, s, x, n, red, plan: GemmPlan, emit):
    """One GEMM phase for workgroup ``wg`` (Int32), thread ``tid`` (Int32) of ``plan.threads``.

    ``w``: Int64 address of this layer's fp8 matrix ``[rows, cols]``; ``s``: its fp32 scales
    ``[rows]``; ``x``: bf16 activations ``[n, x_stride]`` (16-byte aligned); ``n``: Int32 token
    count, ``0 <= n <= plan.max_tokens``; ``red``: LDS ``fx.Array`` of at least
    ``plan.lds_floats`` fp32, 16-byte aligned, free for the duration of the call; ``emit``:
    ``emit(tok, row, value)`` (``emit(tok, j, gate, up)`` for pair plans), called only for
    ``tok < n`` and rows this workgroup owns, with the per-row scale applied; it runs inside a
    divergent branch, so it must not synchronise. Ends with a workgroup barrier, so ``red`` may be
    reused right after. Never calls the grid barrier.
    """
    P = plan
    if const_expr(P.passes == 1):
        _phase_versions(_setup(P, emit, s, red, wg, tid, n, x, w))
    else:
        for p in range(P.passes, unroll=1):  # row passes: each a K sweep over its own rows
            _row_pass(P, emit, s, red, wg, tid, n, x, w, pass_base(P, fx.Int32(p)))


def _setup(P, emit, s, red, wg, tid, n, x, w, base=0):
    """The call's per-lane state for the row pass starting at run row ``base``: ids, the run,
    the activation lanes of every token tile and (knowing ``base``) the weight lanes."""
    NT = P.token_tiles
    XS = P.xs
    c = SimpleNamespace(P=P, emit=emit, s=s, red=_f32_shared(red))
    c.tid = fx.Int32(tid)
    c.n = fx.Int32(n)
    c.lane = c.tid % WAVE
    c.wave = fx.Int32(rocdl.readfirstlane(T.i32, c.tid // WAVE))
    lr = c.lane % TILE  # MFMA row (A) / token (B) of this lane
    grp = c.lane // TILE  # K group of this lane
    c.r0, c.cnt = cta_run(P, fx.Int32(wg))
    c.base = base
    c.w_lane = _w_lanes(c, w, lr, grp)
    c.grp = grp
    if const_expr(P.mx_block):  # each row tile's row of E8M0 bytes
        c.s_row = [
            s + fx.Int64(lane_row(P, c.r0, c.cnt, m, lr, c.base)) * P.scale_row_bytes
            for m in range(P.row_tiles)
        ]
    c.x_lane = []
    for t in range_constexpr(NT):
        tok = lane_tok(t, lr, c.n)
        c.x_lane.append(x + (fx.Int64(tok) * XS + fx.Int64(lane_k(P, c.wave, grp, 0))) * 2)
    return c


def _w_lanes(c, w, lr, grp):
    """Per row tile of the pass at ``c.base``: the lane's weight address of chunk 0 (chunk q
    of row tile m is at ``w_lane[m] + (lane_k(.., q) - lane_k(.., 0))``)."""
    P = c.P
    out = []
    for m in range_constexpr(P.row_tiles):
        row = lane_row(P, c.r0, c.cnt, m, lr, c.base)
        out.append(w + fx.Int64(row) * P.cols + fx.Int64(lane_k(P, c.wave, grp, 0)))
    return out


@flyc.jit
def _row_pass(P, emit, s, red, wg, tid, n, x, w, base):
    """One row pass, set up from opaque copies of the ids, ``n`` and the addresses: everything
    a pass derives from them (the lanes' weight and activation addresses of every chunk) is
    computed inside the pass loop. From plain values LLVM hoists the loop-invariant activation
    addresses of every chunk and token tile out of the loop, and the ~100 VGPRs they hold
    stay live across every pass's K loop: 74-196 VGPRs spilled, and plans were held to one
    pass (wide from 192 CTAs up) until each pass set itself up this way."""
    c = _setup(
        P, emit, s, red,
        opaque(fx.Int32(wg)), opaque(fx.Int32(tid), sgpr=False), opaque(fx.Int32(n)),
        opaque(fx.Int64(x)), opaque(fx.Int64(w)), base,
    )  # fmt: skip
    _phase_versions(c)


def _phase_versions(c):
    """Run the phase with the fewest token tiles that cover n. Each tile count is its own
    straight-line version (K loop and reduction) in its own branch-free region behind a
    workgroup-uniform ``if`` with no ``else`` (so no load sits in a branch, and the CFG
    structurizer has nothing to merge: no value lives across two versions)."""
    lo, hi = c.P.min_token_tiles, c.P.token_tiles
    if const_expr(lo == hi):
        _phase(c, hi)
    else:
        for nt in range_constexpr(lo, hi + 1):  # version nt: (nt - 1) * 16 < n <= nt * 16
            if const_expr(nt == lo):
                _phase_if(c.n <= nt * TILE, c, nt)
            elif const_expr(nt == hi):
                _phase_if(c.n > (nt - 1) * TILE, c, nt)
            else:
                _phase_if((c.n > (nt - 1) * TILE) & (c.n <= nt * TILE), c, nt)


@flyc.jit
def _phase_if(run, c, nt: int):
    if run:
        _phase(c, nt)


def _phase(c, nt):
    acc = _kloop(c, nt)
    for tiles in round_tiles(c.P, nt):
        # a round's first tile is known active unless this is the catch-all smallest version
        if tiles[0] == 0 or nt > c.P.min_token_tiles:
            _reduce_round(c, acc, tiles)
        else:
            _reduce_round_if(c.n > tiles[0] * TILE, c, acc, tiles)


@flyc.jit
def _reduce_round_if(active, c, acc, tiles):
    if active:
        _reduce_round(c, acc, tiles)


def _load_chunk(c, nt, q):
    """Chunk q's loads: one 16-byte weight load per row tile (non-temporal: streamed once, kept
    out of the way of the L2-resident activations), two 16-byte activation loads per token tile
    -> ([vector<4xi32>] per row tile, [8 x i32] per token tile)."""
    w_step = lane_k(c.P, 0, 0, 1)  # K positions between a wave's consecutive chunks
    x_step = w_step * 2  # bf16 bytes
    ws = [_load16(wa + q * w_step, stream=True) for wa in c.w_lane]
    if const_expr(c.P.mx_block):  # with each weight load, the aligned word of its scale byte
        blk = lane_k(c.P, c.wave, c.grp, q) // c.P.mx_block
        shift = (blk & 3) * 8
        sw = [_gptr(fx.Int32, sa + fx.Int64(blk & ~3), 4).load() for sa in c.s_row]
        ws = [(v, sw[m], shift) for m, v in enumerate(ws)]
    xs = []
    for xa in c.x_lane[:nt]:
        a = _load16(xa + q * x_step)
        b = _load16(xa + (q * x_step + 16))
        xs.append([a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]])
    return ws, xs


def _kloop(c, nt):
    """The wave's K chunks for the first ``nt`` token tiles, straight-line, loads ``prefetch``
    chunks ahead, issued in the order they are consumed (the vmcnt counter is in order).
    -> acc[m][t] (vector<4xf32>, MFMA D layout) for t < nt."""
    P = c.P
    MT, CPW, MK = P.row_tiles, P.chunks_per_wave, P.mfma_k
    lane_k = MK // (WAVE // TILE)  # K positions of one lane in one MFMA: 4 or 8
    wpm = lane_k // 2  # i32 words (bf16 pairs) per operand
    steps = LANE_K // lane_k  # MFMAs per (row tile, token tile) per chunk: 4 or 2
    D = P.prefetch_for(nt)
    zero4 = fx.Vector.filled((4,), 0.0, fx.Float32)
    acc = [[zero4 for _ in range(nt)] for _ in range(MT)]
    inflight = [_load_chunk(c, nt, q) for q in range(min(D, CPW))]
    for q in range(CPW):
        if q + D < CPW:
            inflight.append(_load_chunk(c, nt, q + D))
        # keep the machine scheduler from mixing chunks: a conversion or MFMA of a later chunk
        # hoisted here would wait (in-order vmcnt) for every load issued before its data
        rocdl.sched_barrier(0)
        ws, xs = inflight[q]
        inflight[q] = None
        a_ops = []  # a_ops[m][i]: A operand of K step i (the lane's positions i*lane_k ...)
        for m in range(MT):
            words = []
            if P.mx_block:
                wv, sw, shift = ws[m]
                sc = e8m0_to_f32(scale_byte(sw, shift), P.fnuz)
                for d in range(4):
                    words.extend(_mx_to_bf16x4(wv[d], sc, P.fnuz))
            else:
                for d in range(4):
                    words.extend(_fp8x4_to_bf16x4(ws[m][d]))
            a_ops.append([_operand(words[i * wpm : (i + 1) * wpm]) for i in range(steps)])
        for t in range(nt):
            b_ops = [_operand(xs[t][i * wpm : (i + 1) * wpm]) for i in range(steps)]
            for i in range(steps):
                for m in range(MT):
                    acc[m][t] = _mfma(a_ops[m][i], b_ops[i], acc[m][t], MK)
        rocdl.sched_barrier(0)
    return acc


def _reduce_round(c, acc, tiles):
    """Sum the waves' partials of ``tiles`` (token tiles) through LDS and emit them."""
    P = c.P
    MT, HT, NW = P.row_tiles, P.seg_tiles, P.waves
    # 1. every wave parks its partial tiles (16-byte LDS stores)
    for tr, t in enumerate(tiles):
        for m in range(MT):
            fx.generic_store(fx.add_offset(c.red, red_park(P, tr, c.wave, m, c.lane)), acc[m][t])
    fx.gpu.barrier()
    # 2. each thread sums the waves' partials of its output elements and emits them
    elems = len(tiles) * TILE * HT * TILE
    for k in range(ceil_div(elems, P.threads)):
        e = c.tid + k * P.threads
        ragged = k * P.threads + P.threads > elems  # the last pass has idle threads
        tr, j, r, f = red_elem(P, _imin(e, elems - 1) if ragged else e)
        tok = fx.Int32(tiles[0] * TILE) + tr * TILE + j
        rr = _plus(c.base, r)  # the row (pair) in the run
        valid = (rr < c.cnt) & (tok < c.n)
        if ragged:
            valid = valid & (e < elems)
        sums = []
        for seg in range(2 if P.pairs else 1):
            tot = fx.Float32(0.0)
            for wv in range(NW):
                tot = tot + c.red[red_read(P, tr, wv, seg * HT + r // TILE, f)]
            sums.append(tot)
        _emit_scaled_if(valid, c.emit, c.s, tok, c.r0 + rr, sums, P.seg_rows, P.pairs, P.mx_block)
    fx.gpu.barrier()


@flyc.jit
def _emit_scaled_if(valid, emit, s, tok, row, sums, seg_rows: int, pairs: bool, mx: int):
    """Emit with the row scale applied (fp8-row; mxfp8's scales are in the weights)."""
    if valid:
        if const_expr(mx):
            emit(tok, row, *sums)
        else:
            sp = _gptr(fx.Float32, s, 4)
            vals = [sums[0] * fx.generic_load(fx.add_offset(sp, row))]
            if const_expr(pairs):
                vals.append(sums[1] * fx.generic_load(fx.add_offset(sp, row + seg_rows)))
            emit(tok, row, *vals)


# ---------------------------------------------------------------------------------------------
# Standalone test kernel: the four projections of one layer, each from its own inputs
# ---------------------------------------------------------------------------------------------

STANDALONE_KERNEL = "mfma_standalone"
STANDALONE_ARGS: tuple[tuple[str, str], ...] = (
    *((name, "i64") for name in (
        "qkv_w", "qkv_s", "o_w", "o_s", "gu_w", "gu_s", "d_w", "d_s",
        "h", "attn", "act", "out_qkv", "out_o", "out_gu", "out_d",
    )),
    ("layer", "i32"),
    ("n", "i32"),
)  # fmt: skip


def standalone_launcher(layout: Layout, arch: str, lds_budget: int | None = None) -> Any:
    """A launcher running every wide projection of layer ``layer`` once, independently.

    Stacked weights ``[layers, rows, cols]`` and scales ``[layers, rows]`` as the runner packs
    them; activations ``h [n, hidden]`` (qkv and gu), ``attn [n, o_cols]`` (o), ``act [n, mlp]``
    (down); fp32 outputs ``[n, rows]`` (gu: gate in columns ``[0, mlp)``, up after). No phase
    reads another's output, so no grid barrier is needed.
    """
    plans = wide_plans(layout, arch, lds_budget)
    ctas, threads = layout.ctas(arch), layout.kernel.threads
    lds_floats = max(p.lds_floats for p in plans.values())

    @flyc.kernel(known_block_size=[threads, 1, 1])
    def mfma_standalone(
        qkv_w: fx.Int64, qkv_s: fx.Int64, o_w: fx.Int64, o_s: fx.Int64,
        gu_w: fx.Int64, gu_s: fx.Int64, d_w: fx.Int64, d_s: fx.Int64,
        h: fx.Int64, attn: fx.Int64, act: fx.Int64,
        out_qkv: fx.Int64, out_o: fx.Int64, out_gu: fx.Int64, out_d: fx.Int64,
        layer: fx.Int32, n: fx.Int32,
    ):  # fmt: skip
        wg = fx.Int32(fx.block_idx.x)
        tid = fx.Int32(fx.thread_idx.x)
        # one arena, its pointer handed to the phase, as the drafter kernel body does
        red = fx.SharedAllocator().allocate(fx.Array[fx.Int32, lds_floats, 16]).peek().ptr
        lay = fx.Int64(layer)
        for name, w, s, x, out in (
            ("qkv", qkv_w, qkv_s, h, out_qkv),
            ("o", o_w, o_s, attn, out_o),
            ("gu", gu_w, gu_s, h, out_gu),
            ("down", d_w, d_s, act, out_d),
        ):
            p = plans[name]
            w_l = w + lay * (p.rows * p.cols)
            s_l = s + lay * p.scale_layer_bytes
            if const_expr(p.pairs):
                emit = store_pairs_f32(out, p.rows, p.seg_rows)
            else:
                emit = store_f32(out, p.rows)
            mfma_gemm(wg, tid, w_l, s_l, x, n, red, p, emit)

    @flyc.jit
    def launch_mfma_standalone(
        qkv_w: fx.Int64, qkv_s: fx.Int64, o_w: fx.Int64, o_s: fx.Int64,
        gu_w: fx.Int64, gu_s: fx.Int64, d_w: fx.Int64, d_s: fx.Int64,
        h: fx.Int64, attn: fx.Int64, act: fx.Int64,
        out_qkv: fx.Int64, out_o: fx.Int64, out_gu: fx.Int64, out_d: fx.Int64,
        layer: fx.Int32, n: fx.Int32, stream: fx.Stream = fx.Stream(None),  # noqa: B008
    ):  # fmt: skip
        mfma_standalone(
            qkv_w, qkv_s, o_w, o_s, gu_w, gu_s, d_w, d_s, h, attn, act,
            out_qkv, out_o, out_gu, out_d, layer, n,
        ).launch(grid=(ctas, 1, 1), block=(threads, 1, 1), stream=stream)  # fmt: skip

    return launch_mfma_standalone


def standalone_trace_args(layout: Layout) -> tuple[int, ...]:
    """Placeholder values for tracing the standalone launcher under COMPILE_ONLY=1."""
    return tuple(0 if kind == "i64" else 1 for _, kind in STANDALONE_ARGS)
