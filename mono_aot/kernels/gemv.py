"""The VALU fp8 GEMV phase: fp8 weight rows times bf16 activations, fp32 accumulation.

``out[t, r] = s[r] * sum_k decode(W[r, k]) * x[t, k]`` (mxfp8: ``sum_k decode(W[r, k]) *
s[r, k // block] * x[t, k]``, each lane scaling its 16-input partial sums by their block's
E8M0 scale, read once per tile as one aligned word), the same contract and signature as the
MFMA phase (``mono_aot.kernels.mfma.mfma_gemm``), so the kernel body can use either:
rows split balanced across workgroups (workgroup c owns ``[c*R//ctas, (c+1)*R//ctas)``; pair
plans the same run of gate rows and of up rows), ``emit(tok, row, value)`` (pairs: ``emit(tok,
j, gate, up)``) called only for tokens < n and owned rows with the row scale applied, a
workgroup barrier at the end.

Layout of the work: the workgroup's rows (or row pairs) are dealt to its waves round robin;
a wave keeps all of its rows in registers and its 64 lanes split K, lane ``l`` covering the 16
bytes ``16 l .. 16 l + 15`` of every 1024-wide K tile: one ``global_load_dwordx4`` per row and
tile, so every weight byte is read once per call (per token group, see below), decoded by
``v_cvt_pk_f32_fp8``. The activations of up to 16 tokens are staged per K tile in LDS (16-byte
loads and stores) and read back by every wave (the rows of a wave share them from
registers). The 64 lane partials of every (row, token) are reduced by a halving butterfly
(each step sends half of the values a lane holds), after which each lane holds one finished
sum and emits it: one emit per lane instead of one per value.

Launches with more than 16 tokens (the wide variant without MFMA) run the K loop once per
16-token group, reading the weights again for each group (from L2 when they still fit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr, rocdl
from flydsl.expr.typing import T

from mono_aot.kernels.common import (
    bf16_hi,
    bf16_lo,
    e8m0_to_f32,
    fn_as_fnuz,
    fp8x4_to_f32,
    gptr,
    scale_byte,
)
from mono_aot.spec.plans import (  # noqa: F401 (GemvPlan, PlanError: re-exported)
    GEMV_KT,
    GEMV_LANE_K,
    GEMV_MAX_GROUP,
    GemvPlan,
    PlanError,
)
from mono_aot.spec.util import ceil_div

WAVE = 64
LANE_K = GEMV_LANE_K  # K positions (bytes of fp8) one lane covers per tile: one 16-byte load
KT = GEMV_KT  # K of one tile
MAX_GROUP = GEMV_MAX_GROUP  # tokens whose activations one K pass stages
SUB = 8  # tokens per guarded block inside a group (the request size of the runner)


def _halves(P: GemvPlan) -> int:
    return 2 if P.pairs else 1


def _halving_sum(lists: list[list[Any]], lane: Any) -> list[Any]:
    """Reduce each list (same power-of-two length V) over the 64 lanes; afterwards lane ``l``
    holds element ``l >> (6 - log2 V)`` of each list's lane-sum."""
    offs = [32, 16, 8, 4, 2, 1]
    cur = [list(x) for x in lists]
    for o in offs:
        if len(cur[0]) > 1:
            half = len(cur[0]) // 2
            up = (lane & o) != 0
            nxt = []
            for vals in cur:
                lo, hi = vals[:half], vals[half:]
                keep = [up.select(h, l_) for l_, h in zip(lo, hi, strict=True)]
                send = [up.select(l_, h) for l_, h in zip(lo, hi, strict=True)]
                nxt.append(
                    [kk + fx.shuffle_xor(ss, o, WAVE) for kk, ss in zip(keep, send, strict=True)]
                )
            cur = nxt
        else:
            cur = [[v[0] + fx.shuffle_xor(v[0], o, WAVE)] for v in cur]
    return [v[0] for v in cur]


def _stage(stage: Any, x: Any, vi: Any, t0: Any, last: Any, xs: int, kofs: Any, vrow: int) -> None:
    """Stage 16-byte vector ``vi`` of the group's tile (token ``t0 + vi // vrow``, clamped to
    the launch's last token) into LDS."""
    tok = fx.min(t0 + vi // vrow, last)
    src = x + (fx.Int64(tok) * xs + kofs) * 2 + fx.Int64(vi % vrow) * 16
    fx.generic_store(stage + vi * 4, fx.generic_load(gptr(fx.Int32, src, 16), count=4))


def _fma_tokens(
    acc: list[list[Any]],
    wf: list[list[Any]],
    hl: Any,
    lane: Any,
    t0: int,
    t1: int,
    sc: list[Any] | None = None,
) -> list[list[Any]]:
    """acc[m][t] += dot(wf[m], x[t]) for tokens t0..t1-1 of the staged tile; with mxfp8 block
    scales ``sc`` (per row m) acc[m][t] += sc[m] * dot(wf[m], x[t]): one more FMA per (row,
    token) and no register more than fp8-row (scaling the 16 weights first spilled 127-194
    VGPRs of the shipped narrow kernel)."""
    acc = [list(a) for a in acc]
    for t in range(t0, t1):
        base = t * (KT // 2) + lane * (LANE_K // 2)  # int32 words: bf16 pairs
        v0 = fx.generic_load(hl + base, count=4)
        v1 = fx.generic_load(hl + (base + 4), count=4)
        words = [v0[0], v0[1], v0[2], v0[3], v1[0], v1[1], v1[2], v1[3]]
        xf = []
        for w in words:
            xf.append(bf16_lo(w))
            xf.append(bf16_hi(w))
        for m in range(len(wf)):
            if sc is None:
                a = acc[m][t]
                for e in range(LANE_K):
                    a = fx.math.fma(wf[m][e], xf[e], a)
                acc[m][t] = a
            else:
                a = wf[m][0] * xf[0]
                for e in range(1, LANE_K):
                    a = fx.math.fma(wf[m][e], xf[e], a)
                acc[m][t] = fx.math.fma(a, sc[m], acc[m][t])
    return acc


@flyc.jit
def _fma_tokens_if(
    active: Any, acc: Any, wf: Any, hl: Any, lane: Any, t0: int, t1: int, sc: Any = None
) -> Any:
    out = acc
    if active:
        out = _fma_tokens(acc, wf, hl, lane, t0, t1, sc)
    return out


def _plus(base: Any, v: Any) -> Any:
    """``base + v``, emitting nothing for the single pass's base 0."""
    return v if isinstance(base, int) and base == 0 else base + v


@flyc.jit
def _rows_pass(base, g: int, lane, wave, r0, cnt, nloc, tid, w, s, x, n, red, P: GemvPlan) -> Any:
    """One row pass of one token group: the local rows ``base + wave + j * waves`` (j <
    ``pass_per_wave``) through the whole K loop, reduced into the LDS out tile (returned)."""
    G, NR, K, XS, NW, PW = P.group, P.seg_rows, P.cols, P.xs, P.waves, P.pass_per_wave
    # the wave's local rows; past nloc: load a valid row, never emitted
    w_lane = []
    s_lane = []  # mxfp8: byte offset of the aligned word holding each row's tile-0 scale
    if const_expr(P.mx_block):
        blk = (lane * LANE_K) // P.mx_block  # the block of the lane's 16 bytes in a tile
        sword = blk & ~3
        shift = (blk & 3) * 8
    for j in range_constexpr(PW):
        i = fx.min(_plus(base, wave + j * NW), nloc - 1)
        if const_expr(P.pairs):
            up = i >= cnt
            row = up.select(r0 + (i - cnt) + NR, r0 + i)
        else:
            row = r0 + i
        w_lane.append(w + fx.Int64(row) * K + fx.Int64(lane * LANE_K))
        if const_expr(P.mx_block):
            s_lane.append(row * P.scale_row_bytes + sword)
    stage = fx.recast_iter(fx.Pointer[fx.Int32, fx.AddressSpace.Shared, 16].ir_type, red)
    outt = (
        fx.recast_iter(fx.Pointer[fx.Float32, fx.AddressSpace.Shared, 16].ir_type, red)
        + P.stage_bytes // 4
    )
    VEC = G * KT * 2 // 16  # 16-byte vectors of the staging tile
    VROW = KT * 2 // 16  # per token
    last = fx.max(n - 1, fx.Int32(0))
    acc = [[fx.Float32(0.0) for _ in range(G)] for _ in range(PW)]
    for tile in range(P.tiles, unroll=1):
        kofs = fx.Int64(tile) * KT
        fx.gpu.barrier()  # the previous tile is consumed
        for q in range_constexpr(ceil_div(VEC, P.threads)):
            vi = tid + q * P.threads
            if const_expr((q + 1) * P.threads <= VEC):
                _stage(stage, x, vi, g * G, last, XS, kofs, VROW)
            elif vi < VEC:  # the tile's last vectors (a group of 7 or 14 tokens, say)
                _stage(stage, x, vi, g * G, last, XS, kofs, VROW)
        fx.gpu.barrier()
        wf = []
        sc = [] if P.mx_block else None
        for j in range_constexpr(PW):
            wv = fx.generic_load(gptr(fx.Int32, w_lane[j] + kofs, 16), count=4, nontemporal=True)
            f = []
            for e in range_constexpr(4):
                f += fp8x4_to_f32(fn_as_fnuz(wv[e]) if P.fnuz else wv[e])
            if const_expr(P.mx_block):  # the block's scale (a power of two)
                at = s + fx.Int64(s_lane[j] + tile * (KT // P.mx_block))
                sc.append(e8m0_to_f32(scale_byte(gptr(fx.Int32, at, 4).load(), shift), P.fnuz))
            wf.append(f)
        for b in range_constexpr(ceil_div(G, SUB)):
            t0, t1 = b * SUB, min(G, (b + 1) * SUB)
            if const_expr(g == 0 and b == 0):
                acc = _fma_tokens(acc, wf, stage, lane, t0, t1, sc)
            else:
                acc = _fma_tokens_if(n > g * G + t0, acc, wf, stage, lane, t0, t1, sc)
    # lane sums: value index v = j * G + t, padded to a power of two; lane l ends up with
    # index l >> shift, which goes to the out tile [local row][token]
    V = P.red_values
    vals = [acc[j][t] for j in range(PW) for t in range(G)]
    vals += [fx.Float32(0.0)] * (V - len(vals))
    total = _halving_sum([vals], lane)[0]
    shift = 6 - (V.bit_length() - 1)
    idx = lane >> shift
    jj = idx // G
    i = _plus(base, wave + jj * NW)
    if ((lane & ((1 << shift) - 1)) == 0) & (idx < PW * G) & (i < nloc):
        outt[i * G + idx % G] = total
    return outt


@flyc.jit
def _group(g: int, wg, tid, w, s, x, n, red, P: GemvPlan, emit: Callable[..., None]) -> None:
    """One token group: per row pass the whole K loop and the reduction into the LDS out
    tile, then the emits."""
    G, NR = P.group, P.seg_rows
    lane = tid % WAVE
    wave = fx.Int32(rocdl.readfirstlane(T.i32, tid // WAVE))
    r0 = (wg * NR) // P.ctas
    cnt = ((wg + 1) * NR) // P.ctas - r0
    nloc = cnt * _halves(P)  # local rows: [gate rows | up rows] for pair plans
    if const_expr(P.passes == 1):
        outt = _rows_pass(0, g, lane, wave, r0, cnt, nloc, tid, w, s, x, n, red, P)
    else:
        for p in range(P.passes, unroll=1):
            _rows_pass(fx.Int32(p) * P.pass_rows, g, lane, wave, r0, cnt, nloc, tid, w, s, x,
                       n, red, P)  # fmt: skip
        outt = (
            fx.recast_iter(fx.Pointer[fx.Float32, fx.AddressSpace.Shared, 16].ir_type, red)
            + P.stage_bytes // 4
        )
    fx.gpu.barrier()
    # emits: every thread takes (row or pair, token) items of the out tile
    e = tid
    while e < cnt * G:
        u = e // G
        t = e % G
        tok = g * G + t
        if tok < n:
            row = r0 + u
            v = outt[u * G + t]
            if const_expr(not P.mx_block):  # fp8-row: the row's scale (mxfp8's are applied)
                v = v * gptr(fx.Float32, s + fx.Int64(row) * 4).load()
            if const_expr(P.pairs):
                vu = outt[(cnt + u) * G + t]
                if const_expr(not P.mx_block):
                    vu = vu * gptr(fx.Float32, s + fx.Int64(row + NR) * 4).load()
                emit(tok, row, v, vu)
            else:
                emit(tok, row, v)
        e = e + P.threads
    fx.gpu.barrier()


@flyc.jit
def gemv_rows(wg, tid, w, s, x, n, red, plan: GemvPlan, emit: Callable[..., None]) -> None:
    """One GEMV phase for workgroup ``wg`` (Int32) and thread ``tid``. ``w``: Int64 address of
    this layer's fp8 matrix ``[rows, cols]``; ``s``: fp32 scales ``[rows]`` (mxfp8: E8M0
    bytes ``[rows, cols / block]``); ``x``: bf16
    activations ``[n, x_stride]`` (16-byte aligned rows); ``n``: Int32 tokens (at most
    ``plan.max_tokens``); ``red``: LDS pointer of at least ``plan.lds_bytes`` (16-byte aligned);
    ``emit`` as in the module docstring. Ends with a workgroup barrier."""
    wg = fx.Int32(wg)
    tid = fx.Int32(tid)
    n = fx.Int32(n)
    for g in range_constexpr(plan.groups):
        if const_expr(g == 0):
            _group(0, wg, tid, w, s, x, n, red, plan, emit)
        else:
            if n > g * plan.group:
                _group(g, wg, tid, w, s, x, n, red, plan, emit)
