"""The attention part of a drafter layer as FlyDSL device phases (README, "The drafter megakernels", Attention).

Between "the fused qkv projection is in scratch" (fp32 ``[n, qkv_rows_per_rank]``) and "the
attention output is in scratch" (bf16 ``[n, q_rows_per_rank]``) a layer runs three phases, each
separated from the next by the kernel's grid barrier:

1. ``prep`` — per-head Gemma RMSNorm of the 16 q heads (``w_q``) and the K head (``w_k``),
   NeoX rotary on the first ``rotary_dim`` dims of q and k (``cos_sin`` at each token's
   position); q goes back into the qkv scratch rows in place (fp32), k and v are divided by the
   layer's K/V scale, saturated to the arch's fp8 range, encoded with ``v_cvt_pk_fp8_f32`` and
   written to the paged cache row of the token's slot (slot -1 writes nothing). One wave per
   task: two q heads (a half wave each), or the token's K and V (the whole 256-byte cache row,
   one dword per lane).
2. ``partial`` — non-causal paged attention split over (request, KV partition); with a
   sliding window (``model.window``) a request's partitions start at its first query's window
   start and each query row masks the positions below its own. A task loads
   every K/V byte of its partition once from the cache (16-byte loads, staged through LDS in
   chunks of ``threads / 8`` positions) and serves all ``qpr x heads`` = 128 query rows of its
   request (the 16 q heads share the rank's one KV head), wave w holding rows 16w..16w+15. Both
   products run on the bf16 MFMA (``v_mfma_f32_16x16x16_bf16``; gfx950's 32-deep
   ``v_mfma_f32_16x16x32_bf16``, half as many): ``S^T = K Q^T`` (K rows are the A operand as
   stored, 32 contiguous bytes a lane), then ``O^T = V^T P^T`` (P comes straight out of S's
   accumulator layout, V is transposed by choosing which dims a lane's operand holds); fp8 is
   exact in bf16, q and P are rounded to it; fp32 accumulation and online softmax in the exp2
   domain. A request whose context fits one partition writes its
   bf16 output directly; otherwise the task stores its unnormalised fp32 output and its
   (max, sum) per row into the ``attn_part`` / ``attn_ml`` scratch regions.
3. ``combine`` — the log-sum-exp merge of a split request's partials into the bf16 output.

The partition length is chosen at run time from the launch's total context, never below
``abi.ATTN_PARTITION`` positions and never so short that the partitions outnumber
``CTAs + requests`` (``abi.attn_partial_slots``), so any context length is served and tasks
loop over the workgroups with a stride of the CTA count.

Data conventions are the reference's (``mono_aot.reference``): fp8 codes as bytes in the arch's
format, ``cache[slot // kv_block, 0, slot % kv_block, :128]`` = K, ``[128:]`` = V.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir.dialects import llvm
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import T

from mono_aot.spec import abi
from mono_aot.spec.layouts import Layout, Variant
from mono_aot.spec.plans import MFMA_N, AttnGeometry, attention_split  # noqa: F401 (re-export)
from mono_aot.spec.util import ceil_div

WAVE = 64
LOG2E = 1.4426950408889634
NEG_BIG = -1.0e30  # the running max before any position (finite: exp2(NEG_BIG - m) is 0)
CACHE_ROW = 256  # bytes of one cached token of one KV head: K 0..127, V 128..255
PAD_SLOT = -1  # vLLM's padding slot: the token writes nothing (any other slot outside the
# cache is recorded as a bad block)

# health word H_WHAT for the attention phases: layer * 16 + one of these
WHAT_KV_WRITE = 8
WHAT_ATTENTION = 9

G = fx.AddressSpace.Global
S = fx.AddressSpace.Shared


# ---------------------------------------------------------------- device helpers (no control flow)


def _gptr(dt, addr, align):
    return fx.inttoptr(fx.Pointer[dt, G, align].ir_type, addr)


def _ld(dt, addr, count=None):
    """A global load of ``count`` elements of ``dt`` at byte address ``addr`` (naturally aligned
    to the whole access, so 16-byte accesses become ``global_load_dwordx4``)."""
    n = count or 1
    return fx.generic_load(_gptr(dt, addr, dt.width // 8 * n), count=count)


def _st(dt, addr, value, count=1):
    fx.generic_store(_gptr(dt, addr, dt.width // 8 * count), value)


def _lds(ptr, align):
    return fx.recast_iter(fx.Pointer[fx.Int32, S, align].ir_type, ptr)


def _uniform(v):
    """An Int32 every lane holds alike, moved to a scalar register (so the task loops and the
    barriers inside them are scalar branches)."""
    return fx.Int32(rocdl.readfirstlane(T.i32, fx.Int32(v).ir_value()))


def _f32_intrinsic(name, x):
    return fx.Float32(llvm.call_intrinsic(T.f32, name, [fx.Float32(x).ir_value()], [], []))


def _exp2(x):
    """``v_exp_f32`` (FlyDSL's math.exp2 needs the device library)."""
    return _f32_intrinsic("llvm.amdgcn.exp2.f32", x)


def _rsq(x):
    return _f32_intrinsic("llvm.amdgcn.rsq.f32", x)


def _maxf(a, b):
    """max that is one ``v_max_f32`` (no NaN propagation needed: scores are finite or -inf)."""
    return fx.Float32(fx.arith.maxnumf(fx.Float32(a), fx.Float32(b)))


def _xor_sum(v, offsets):
    for off in offsets:
        v = v + fx.shuffle_xor(v, off, WAVE)
    return v


def _xor_max(v, offsets):
    for off in offsets:
        v = _maxf(v, fx.shuffle_xor(v, off, WAVE))
    return v


def _fp8x4_to_f32(word):
    """The 4 fp8 codes of an i32 word (byte 0 first) as 4 fp32, in the arch's format."""
    lo = fx.Vector(rocdl.cvt_pk_f32_fp8(T.f32x2, word, False))
    hi = fx.Vector(rocdl.cvt_pk_f32_fp8(T.f32x2, word, True))
    return [lo[0], lo[1], hi[0], hi[1]]


def _bf16_pair_exact(a, b):
    """(bf16(a), bf16(b)) in one word by dropping the low halves: exact for fp8 values."""
    return fx.Int32(
        rocdl.perm_b32(
            fx.Float32(b).bitcast(fx.Int32), fx.Float32(a).bitcast(fx.Int32), fx.Int32(0x07060302)
        )
    )


def _fp8x4_to_bf16_words(word, arch):
    """The 4 fp8 codes of an i32 word as 2 words of bf16 pairs (exact; byte 0 first): one
    ``v_cvt_scalef32_pk_bf16_fp8`` a pair on gfx950, ``v_cvt_pk_f32_fp8`` and a ``v_perm_b32``
    a pair on gfx942."""
    if arch == "gfx942":
        f = _fp8x4_to_f32(word)
        return [_bf16_pair_exact(f[0], f[1]), _bf16_pair_exact(f[2], f[3])]
    one = fx.Float32(1.0).ir_value()
    w = fx.Int32(word).ir_value()
    return [
        fx.Vector(rocdl.cvt_scalef32_pk_bf16_fp8(T.vec(2, T.bf16), w, one, hi)).bitcast(fx.Int32)[0]
        for hi in (False, True)
    ]


def _bf16_bits_rne(x):
    """The fp32 bits of ``x`` rounded to nearest even at bf16 precision (high half); finite
    inputs only (probabilities and scaled q: no NaN handling needed)."""
    b = fx.Float32(x).bitcast(fx.Int32)
    return b + ((b >> 16) & 1) + 0x7FFF


def _bf16_round_words(vals, arch):
    """fp32 values (an even count) -> words of bf16 pairs, round to nearest even:
    ``v_cvt_pk_bf16_f32`` on gfx950, two integer ops a value and one ``v_perm_b32`` a pair where
    that does not exist."""
    if arch == "gfx942":
        r = [_bf16_bits_rne(v) for v in vals]
        return [
            fx.Int32(rocdl.perm_b32(r[i + 1], r[i], fx.Int32(0x07060302)))
            for i in range(0, len(r), 2)
        ]
    v = fx.Vector.from_elements(list(vals), fx.Float32).to(fx.BFloat16).bitcast(fx.Int32)
    return [v[i] for i in range(len(vals) // 2)]


def _mfma(a_words, b_words, c):
    """D = A B + C on 16x16 fp32 tiles from bf16 operands given as words of pairs: 2 words a
    lane -> ``v_mfma_f32_16x16x16_bf16`` (k = 16), 4 words -> ``v_mfma_f32_16x16x32_bf16``
    (k = 32, gfx950)."""
    if len(a_words) == 2:
        a = fx.Vector.from_elements(list(a_words), fx.Int32).bitcast(fx.Int16)
        b = fx.Vector.from_elements(list(b_words), fx.Int32).bitcast(fx.Int16)
        return fx.Vector(rocdl.mfma_f32_16x16x16bf16_1k(T.vec(4, T.f32), [a, b, c]))
    a = fx.Vector.from_elements(list(a_words), fx.Int32).bitcast(fx.BFloat16)
    b = fx.Vector.from_elements(list(b_words), fx.Int32).bitcast(fx.BFloat16)
    return fx.Vector(rocdl.mfma_f32_16x16x32_bf16(T.vec(4, T.f32), [a, b, c]))


def _sat(x, lim):
    """Clamp to +-lim, keeping NaN (the reference's saturating encode)."""
    x = (x > lim).select(fx.Float32(lim), x)
    return (x < -lim).select(fx.Float32(-lim), x)


def _fp8x4(vals):
    lo = fx.Int32(rocdl.cvt_pk_fp8_f32(T.i32, vals[0], vals[1], fx.Int32(0), False))
    return fx.Int32(rocdl.cvt_pk_fp8_f32(T.i32, vals[2], vals[3], lo, True))


def _bf16x4_to_f32(addr):
    w = fx.Vector(_ld(fx.Int32, addr, 2))
    v = w.bitcast(fx.BFloat16).to(fx.Float32)
    return [v[j] for j in range(4)]


def _tab_i64(tab, layer, slot):
    return fx.Int64(_ld(fx.Int64, tab + (fx.Int64(layer) * abi.TABLE_SLOTS + slot) * 8))


# ---------------------------------------------------------------- the phases


@dataclass(frozen=True)
class AttentionPhases:
    """The three device phases for one (layout, arch, variant), plus what they need from the
    kernel around them: an LDS buffer of ``lds_bytes`` (16-byte aligned, ``lds_words`` int32)
    and two grid barriers (after ``prep``, after ``partial``)."""

    geometry: AttnGeometry
    prep: object
    partial: object
    combine: object

    @property
    def lds_bytes(self) -> int:
        return self.geometry.lds_bytes

    @property
    def lds_words(self) -> int:
        return self.geometry.lds_bytes // 4


def attention_phases(layout: Layout, arch: str, variant: Variant) -> AttentionPhases:
    """Build the phase functions (``@flyc.jit``, inlined into the caller's kernel).

    Calling convention (all runtime values are DSL values of the kernel):

    - ``prep(bid, tid, layer, n, tab, scratch, cos_sin, pos, slots, health, step)``
    - ``partial(bid, tid, lds, layer, n, bt_stride, tab, scratch, bt, seq_lens, pos, health,
      step)``
    - ``combine(bid, tid, n, scratch, seq_lens, pos)``

    ``bid``/``tid``: workgroup and thread id; ``lds``: an LDS pointer (``.ptr`` of an
    ``fx.Array[fx.Int32, lds_words, 16]`` allocation); ``layer``, ``n`` (tokens), ``bt_stride``:
    Int32; the rest Int64 addresses as in the kernel contract (``scratch`` is the buffer's base:
    the regions' offsets come from ``abi.scratch_plan``).
    """
    g = AttnGeometry.build(layout, arch, variant)
    D, H, QPR, R = g.head_dim, g.heads, g.qpr, g.rows
    ROT, ROT2 = g.rotary, g.rotary // 2
    WAVES, CTAS, KB = g.waves, g.ctas, g.kv_block
    QKV, QR = g.qkv_rows, g.q_rows
    TPT = g.prep_tasks_per_token
    CHUNK = g.chunk
    MAXR = g.max_reqs
    FP8_MAX = g.fp8_max
    EPS = g.eps
    INV_D = 1.0 / D
    Q_SCALE = LOG2E / math.sqrt(D)
    TILES = CHUNK // MFMA_N
    TPW = ceil_div(g.slots, CTAS)  # attention tasks one workgroup may get (2: slots < 2 CTAs)
    ITEMS = ceil_div(g.max_reqs * QPR * H, (CTAS * WAVES))  # combine rows one wave may get
    ARCH = g.arch
    WINDOW = layout.model.window  # 0: the whole context
    # words of bf16 pairs a lane feeds one MFMA: 2 (16x16x16) or 4 (16x16x32 on gfx950)
    KW = g.mfma_words

    # ---- the split plan: the same numbers in every workgroup and in both attention phases

    def split_plan(n, seq_lens, pos):
        """(partition length, per request: (length, first task, tasks, first position), total
        tasks). With a window, a request's positions start at its first query's window start
        ``max(0, pos - (WINDOW - 1))``: the blocks below it are never read."""
        reqs = n // QPR
        lens = []
        starts = []
        for i in range_constexpr(MAXR):
            idx = fx.Int32(i) < reqs
            at = idx.select(fx.Int32(i), fx.Int32(0))
            s = _uniform(_ld(fx.Int32, seq_lens + fx.Int64(at) * 4))
            s = (s > 0).select(s, fx.Int32(0))
            lo = fx.Int32(0)
            if WINDOW:
                # the low word of the int64 position of the request's first query
                p = _uniform(_ld(fx.Int32, pos + fx.Int64(at * QPR) * 8))
                lo = p - (WINDOW - 1)
                lo = (lo > 0).select(lo, fx.Int32(0))
                lo = (lo < s).select(lo, s)
            starts.append(lo)
            lens.append(idx.select(s - lo, fx.Int32(0)))
        total = lens[0]
        for i in range_constexpr(1, MAXR):
            total = total + lens[i]
        per_cta = (total + (CTAS - 1)) // CTAS
        part = ((per_cta + (CHUNK - 1)) // CHUNK) * CHUNK
        part = (part > g.min_partition).select(part, fx.Int32(g.min_partition))
        reqs_info = []
        start = fx.Int32(0)
        for i in range_constexpr(MAXR):
            k = (lens[i] + part - 1) // part
            k = (k > 1).select(k, fx.Int32(1))
            k = (fx.Int32(i) < reqs).select(k, fx.Int32(0))
            reqs_info.append((lens[i], start, k, starts[i]))
            start = start + k
        return part, reqs_info, start

    def pick(options, idx):
        """``options[idx]`` (lists of DSL values, ``idx`` a runtime index) by selects."""
        out = list(options[0])
        for k in range_constexpr(1, len(options)):
            sel = idx == k
            out = [sel.select(a, b) for a, b in zip(options[k], out, strict=True)]
        return out

    def task_of(reqs_info, tau):
        """[request, its length, its first task, its tasks, its first position] of task
        ``tau``: the request is
        the number of requests whose tasks end at or before tau."""
        req = fx.Int32(0)
        for k in range_constexpr(MAXR - 1):
            end = reqs_info[k][1] + reqs_info[k][2]
            req = req + (tau >= end).select(fx.Int32(1), fx.Int32(0))
        return [req, *pick(reqs_info, req)]

    @flyc.jit
    def flag_bad_block(health, step, layer, what, block):
        """Record STATUS_BAD_BLOCK once (the first failure wins; a timeout already recorded
        stays)."""
        hp = _gptr(fx.Int32, health, 4)
        _, won = fx.atomic_cas(
            hp,
            fx.Int32(abi.STATUS_OK),
            fx.Int32(abi.STATUS_BAD_BLOCK),
            syncscope=rocdl.SyncScope.Agent,
        )
        if won:
            _st(fx.Int32, health + abi.H_WHAT * 4, fx.Int32(layer) * 16 + what)
            _st(fx.Int32, health + abi.H_PEER * 4, fx.Int32(block))
            _st(fx.Int32, health + abi.H_STEP * 4, fx.Int32(_ld(fx.Int32, step)))

    # ---- phase 1: q/k norms, rotary, fp8 K/V into the cache

    @flyc.jit
    def prep(bid, tid, layer, n, tab, scratch, cos_sin, pos, slots, health, step):
        lane = tid % WAVE
        wave = tid // WAVE
        half = lane // 32
        d0 = (lane % 32) * 4  # this lane's 4 dims of its head
        w_q = _tab_i64(tab, layer, abi.T_W_Q)
        w_k = _tab_i64(tab, layer, abi.T_W_K)
        k_scale = fx.Float32(_ld(fx.Float32, _tab_i64(tab, layer, abi.T_K_SCALE)))
        v_scale = fx.Float32(_ld(fx.Float32, _tab_i64(tab, layer, abi.T_V_SCALE)))
        cache = _tab_i64(tab, layer, abi.T_CACHE)
        nblk = _tab_i64(tab, layer, abi.T_NBLK)
        qkv = scratch + g.off_qkv
        # rotary bookkeeping of this lane's dims (the same for every head)
        in_rot = d0 < ROT
        first = d0 < ROT2
        pd0 = first.select(d0 + ROT2, d0 - ROT2)
        pd0 = in_rot.select(pd0, d0)
        cidx = first.select(d0, d0 - ROT2)
        cidx = in_rot.select(cidx, fx.Int32(0))
        tau = bid * WAVES + wave
        while tau < n * TPT:
            t = tau // TPT
            j = tau % TPT
            is_q = j < (H // 2)
            is_v = (~is_q) & (half == 1)
            col = is_q.select((j * 2 + half) * D, (half + H) * D)
            row = qkv + fx.Int64(t) * (QKV * 4)
            x = fx.Vector(_ld(fx.Float32, row + fx.Int64(col + d0) * 4, 4))
            xp = fx.Vector(_ld(fx.Float32, row + fx.Int64(col + pd0) * 4, 4))
            wbase = is_q.select(w_q, w_k)
            w = _bf16x4_to_f32(wbase + fx.Int64(d0) * 2)
            wp = _bf16x4_to_f32(wbase + fx.Int64(pd0) * 2)
            ss = x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3]
            ss = _xor_sum(ss, (1, 2, 4, 8, 16))  # the 32 lanes of this half wave = one head
            rstd = _rsq(ss * INV_D + EPS)
            p = fx.Int32(_ld(fx.Int32, pos + fx.Int64(t) * 8))  # low word of the int64 position
            cs = cos_sin + fx.Int64(p) * (ROT * 2)
            c = _bf16x4_to_f32(cs + fx.Int64(cidx) * 2)
            sn = _bf16x4_to_f32(cs + fx.Int64(cidx + ROT2) * 2)
            y = []
            for e in range_constexpr(4):
                yn = x[e] * rstd * (w[e] + 1.0)
                ypn = xp[e] * rstd * (wp[e] + 1.0)
                rot = first.select(yn * c[e] - ypn * sn[e], yn * c[e] + ypn * sn[e])
                yn = in_rot.select(rot, yn)
                y.append(is_v.select(x[e], yn))
            if is_q:
                _st(
                    fx.Float32,
                    row + fx.Int64(col + d0) * 4,
                    fx.Vector.from_elements(y, fx.Float32),
                    4,
                )
            else:
                scale = is_v.select(v_scale, k_scale)
                code = _fp8x4([_sat(y[e] / scale, FP8_MAX) for e in range(4)])
                slot = fx.Int64(_ld(fx.Int64, slots + fx.Int64(t) * 8))
                if slot != PAD_SLOT:
                    if (slot >= 0) & (slot < nblk * KB):
                        _st(fx.Int32, cache + slot * CACHE_ROW + fx.Int64(half * D + d0), code)
                    else:
                        if lane == 0:
                            flag_bad_block(health, step, layer, WHAT_KV_WRITE, fx.Int32(slot // KB))
            tau = tau + CTAS * WAVES

    # ---- phase 2: partial attention per (request, partition)

    def block_of(c0, p1, req, bt_stride, bt, srow):
        """The block id holding position c0 + srow (block-table column 0's for a position past
        p1: an entry inside the table, maybe garbage below a window, never dereferenced)."""
        pos = c0 + srow
        bidx = (pos < p1).select(pos // KB, fx.Int32(0))
        addr = bt + (fx.Int64(req) * fx.Int64(bt_stride) + fx.Int64(bidx)) * 4
        return fx.Int32(_ld(fx.Int32, addr))

    @flyc.jit
    def stage_load(c0, p1, blk, cache, nblk, srow, seg, health, step, layer):
        """This thread's 32 bytes of the cache row of position c0 + srow in block ``blk``
        (zeros past p1 or for a block outside the cache, which is never dereferenced)."""
        pos = c0 + srow
        valid = pos < p1
        good = valid & (blk >= 0) & (fx.Int64(blk) < nblk)
        safe = good.select(blk, fx.Int32(0))
        addr = cache + (fx.Int64(safe) * KB + fx.Int64(pos % KB)) * CACHE_ROW + fx.Int64(seg * 32)
        v0 = fx.Vector(_ld(fx.Int32, addr, 4))
        v1 = fx.Vector(_ld(fx.Int32, addr + 16, 4))
        if valid & (~good):
            flag_bad_block(health, step, layer, WHAT_ATTENTION, blk)
        # the caller zeroes a row that is not ``good`` when it stores it, one iteration later:
        # a select here would make the math wait for the loads it is meant to overlap
        return v0, v1, good.select(fx.Int32(1), fx.Int32(0))

    def chunk_math(lds, c0, p1, qlo, nn, grp, qw, acc, m, lsum):
        """One staged chunk: scores, online softmax update, P V; returns (acc, m, lsum).

        ``qw``: the lane's 16 words of bf16 q pairs (dims 32 grp .. 32 grp + 31 in order);
        ``qlo``: with a window, the first position the lane's query row sees."""
        lk = _lds(lds, 16)
        lv = _lds(lds, 8)
        sc = []
        for tile in range_constexpr(TILES):
            kw = g.k_frag_word(tile, nn, grp)  # int32 words
            k0 = fx.Vector(fx.generic_load(lk + kw, count=4))
            k1 = fx.Vector(fx.generic_load(lk + (kw + 4), count=4))
            kb = []
            for w in (k0[0], k0[1], k0[2], k0[3], k1[0], k1[1], k1[2], k1[3]):
                kb += _fp8x4_to_bf16_words(w, ARCH)
            s = fx.Vector.filled((4,), 0.0, fx.Float32)
            for st in range_constexpr(16 // KW):  # k-steps over the 128 dims
                ops = slice(st * KW, st * KW + KW)
                s = _mfma(kb[ops], qw[ops], s)
            for j in range_constexpr(4):
                kp = c0 + g.score_pos(tile, grp, j)
                ok = kp < p1
                if WINDOW:
                    ok = ok & (kp >= qlo)
                sc.append(ok.select(s[j], fx.Float32(-math.inf)))
        mx = sc[0]
        for e in range_constexpr(1, len(sc)):
            mx = _maxf(mx, sc[e])
        mx = _xor_max(mx, (16, 32))
        m_new = _maxf(m, mx)
        alpha = _exp2(m - m_new)
        pr = [_exp2(v - m_new) for v in sc]
        ps = pr[0]
        for e in range_constexpr(1, len(pr)):
            ps = ps + pr[e]
        lsum = lsum * alpha + ps
        acc = [a * alpha for a in acc]
        # PV steps of KW * 8 positions (KW // 2 score tiles each)
        per = KW // 2
        for grp_t in range_constexpr(TILES // per):
            pw = _bf16_round_words(pr[grp_t * 4 * per : (grp_t + 1) * 4 * per], ARCH)
            vals = []  # [element][t]: V dim v_dim(nn, t) at the element's position
            for e in range_constexpr(4 * per):
                vw = g.v_frag_word(g.pv_pos(grp_t, grp, e), nn)
                v = fx.Vector(fx.generic_load(lv + vw, count=2))
                vals.append(_fp8x4_to_f32(v[0]) + _fp8x4_to_f32(v[1]))
            acc = [
                _mfma(
                    [_bf16_pair_exact(vals[e][t], vals[e + 1][t]) for e in range(0, 4 * per, 2)],
                    pw,
                    acc[t],
                )
                for t in range(8)
            ]
        return acc, m_new, lsum

    @flyc.jit
    def partial(bid, tid, lds, layer, n, bt_stride, tab, scratch, bt, seq_lens, pos, health, step):
        lane = tid % WAVE
        wave = tid // WAVE
        nn = lane % MFMA_N  # the query row of this lane within its wave's 16
        grp = lane // MFMA_N  # which quarter of the dims / positions
        part, reqs_info, ntasks = split_plan(n, seq_lens, pos)
        cache = _tab_i64(tab, layer, abi.T_CACHE)
        nblk = _tab_i64(tab, layer, abi.T_NBLK)
        k_scale = fx.Float32(_ld(fx.Float32, _tab_i64(tab, layer, abi.T_K_SCALE)))
        v_scale = fx.Float32(_ld(fx.Float32, _tab_i64(tab, layer, abi.T_V_SCALE)))
        q_scale = k_scale * Q_SCALE  # scores in log2 units, K's scale folded in
        srow = tid // 8  # staging: this thread's row of the chunk and 32-byte segment
        seg = tid % 8
        st_word = (seg < 4).select(g.stage_k_word(srow, seg), g.stage_v_word(srow, seg))
        lst = _lds(lds, 16)
        r = wave * MFMA_N + nn  # query row of the request
        # rows past the request's qpr x heads (an idle wave when they do not fill the
        # workgroup, e.g. 7 x 16 of 8 x 16) compute a copy of the last token's and store nothing
        live = r < R
        tok_in_req = fx.min(r // H, fx.Int32(QPR - 1))
        head = r % H
        # the (at most TPW) tasks of this workgroup, decoded before the loop so the per-request
        # plan is dead inside it (it would hold 3 scalar registers a request)
        mine = [task_of(reqs_info, bid + k * CTAS) for k in range(TPW)]
        tau = bid
        while tau < ntasks:
            req, length, first, tasks, lo = pick(mine, (tau - bid) // CTAS)
            p0 = lo + (tau - first) * part
            p1 = p0 + part
            p1 = (p1 < lo + length).select(p1, lo + length)
            tok = req * QPR + tok_in_req
            qlo = fx.Int32(0)
            if WINDOW:  # this lane's query sees positions above its own minus the window
                qlo = fx.Int32(_ld(fx.Int32, pos + fx.Int64(tok) * 8)) - (WINDOW - 1)
            # q of this lane's row, dims 32*grp .. +32, scaled, as 8 bf16x4 MFMA operands
            qa = (
                scratch
                + g.off_qkv
                + (fx.Int64(tok) * QKV + fx.Int64(head * D + g.qk_dim(grp, 0, 0))) * 4
            )
            qf = []
            for u in range_constexpr(8):
                v = fx.Vector(_ld(fx.Float32, qa + u * 16, 4))
                qf += [v[0] * q_scale, v[1] * q_scale, v[2] * q_scale, v[3] * q_scale]
            qw = _bf16_round_words(qf, ARCH)
            acc = [fx.Vector.filled((4,), 0.0, fx.Float32) for _ in range(8)]
            m = fx.Float32(NEG_BIG)
            lsum = fx.Float32(0.0)
            # software pipeline: chunk c0 in LDS, c0 + CHUNK in registers, the block id of
            # c0 + 2 CHUNK in flight, so neither load's latency waits on the math
            c0 = p0
            blk = block_of(c0, p1, req, bt_stride, bt, srow)
            pre0, pre1, ok = stage_load(c0, p1, blk, cache, nblk, srow, seg, health, step, layer)
            blk = block_of(c0 + CHUNK, p1, req, bt_stride, bt, srow)
            zero = fx.Vector.filled((4,), 0, fx.Int32)
            while c0 < p1:
                fx.gpu.barrier()  # the previous chunk (or task) is done with the LDS rows
                keep = ok != 0
                fx.generic_store(lst + st_word, keep.select(pre0, zero))
                fx.generic_store(lst + (st_word + 4), keep.select(pre1, zero))
                fx.gpu.barrier()
                pre0, pre1, ok = stage_load(
                    c0 + CHUNK, p1, blk, cache, nblk, srow, seg, health, step, layer
                )
                blk = block_of(c0 + 2 * CHUNK, p1, req, bt_stride, bt, srow)
                rocdl.sched_barrier(0)  # issue those loads before the math, not after it
                acc, m, lsum = chunk_math(lds, c0, p1, qlo, nn, grp, qw, acc, m, lsum)
                c0 = c0 + CHUNK
            ltot = _xor_sum(lsum, (16, 32))
            # lane holds O^T[dim 32*grp + 8*j + t][row r] in acc[t][j]
            # out[e] is head dim 32 grp + e: out_dim(grp, j, t) = 32 grp + 8 j + t
            out = [acc[e % 8][e // 8] * v_scale for e in range(32)]
            if live:
                if tasks == 1:
                    inv = (ltot > 0.0).select(1.0 / ltot, fx.Float32(0.0))
                    dst = (
                        scratch
                        + g.off_attn
                        + (fx.Int64(tok) * QR + fx.Int64(head * D + grp * 32)) * 2
                    )
                    for u in range_constexpr(4):
                        b = fx.Vector.from_elements(
                            [out[8 * u + e] * inv for e in range(8)], fx.Float32
                        )
                        _st(fx.Int32, dst + u * 16, b.to(fx.BFloat16).bitcast(fx.Int32), 4)
                else:
                    prow = fx.Int64(tau) * R + fx.Int64(r)
                    dst = scratch + g.off_part + (prow * D + fx.Int64(grp * 32)) * 4
                    for u in range_constexpr(8):
                        _st(
                            fx.Float32,
                            dst + u * 16,
                            fx.Vector.from_elements(out[4 * u : 4 * u + 4], fx.Float32),
                            4,
                        )
                    if grp == 0:
                        _st(
                            fx.Float32,
                            scratch + g.off_ml + prow * 8,
                            fx.Vector.from_elements([m, ltot], fx.Float32),
                            2,
                        )
            tau = tau + CTAS

    # ---- phase 3: merge the partitions of split requests

    @flyc.jit
    def combine(bid, tid, n, scratch, seq_lens, pos):
        lane = tid % WAVE
        wave = tid // WAVE
        part, reqs_info, ntasks = split_plan(n, seq_lens, pos)
        # one (token, head) row per wave item, 2 dims per lane; items decoded up front
        items = []
        for k in range_constexpr(ITEMS):
            kappa = bid * WAVES + wave + k * (CTAS * WAVES)
            tok = kappa // H
            req = tok // QPR
            req = (req < MAXR).select(req, fx.Int32(MAXR - 1))
            _, first, tasks, _ = pick(reqs_info, req)
            tasks = (kappa < n * H).select(tasks, fx.Int32(0))
            items.append([tok, kappa % H, first, tasks])
        it = fx.Int32(0)
        while it < ITEMS:
            tok, head, first, tasks = pick(items, it)
            r = (tok % QPR) * H + head
            if tasks > 1:
                m_run = fx.Float32(NEG_BIG)
                l_run = fx.Float32(0.0)
                a0 = fx.Float32(0.0)
                a1 = fx.Float32(0.0)
                q = fx.Int32(0)
                while q < tasks:
                    prow = fx.Int64(first + q) * R + fx.Int64(r)
                    ml = fx.Vector(_ld(fx.Float32, scratch + g.off_ml + prow * 8, 2))
                    o = fx.Vector(
                        _ld(
                            fx.Float32,
                            scratch + g.off_part + (prow * D + fx.Int64(lane * 2)) * 4,
                            2,
                        )
                    )
                    m_new = _maxf(m_run, ml[0])
                    wa = _exp2(m_run - m_new)
                    wb = _exp2(ml[0] - m_new)
                    a0 = a0 * wa + o[0] * wb
                    a1 = a1 * wa + o[1] * wb
                    l_run = l_run * wa + ml[1] * wb
                    m_run = m_new
                    q = q + 1
                inv = (l_run > 0.0).select(1.0 / l_run, fx.Float32(0.0))
                b = (
                    fx.Vector.from_elements([a0 * inv, a1 * inv], fx.Float32)
                    .to(fx.BFloat16)
                    .bitcast(fx.Int32)
                )
                _st(
                    fx.Int32,
                    scratch + g.off_attn + (fx.Int64(tok) * QR + fx.Int64(head * D + lane * 2)) * 2,
                    b[0],
                )
            it = it + 1

    return AttentionPhases(geometry=g, prep=prep, partial=partial, combine=combine)


# ---------------------------------------------------------------- standalone probe kernel

PROBE_KERNEL = "attn_probe"
# argument list of the standalone kernel (tests pack it by this order)
PROBE_ARGS = (
    "scratch", "tab", "cos_sin", "bt", "pos", "slots", "seq_lens", "step", "health",
    "layer", "bt_stride", "n", "phase",
)  # fmt: skip
PROBE_PHASES = {"prep": 0, "partial": 1, "combine": 2}
_CURRENT_STREAM = fx.Stream(None)  # the caller's current stream unless one is passed


def probe_launcher(layout: Layout, arch: str, variant: Variant):
    """A kernel that runs one attention phase per launch (``phase`` 0, 1, 2): launching the
    three in order on one stream puts a kernel boundary where the megakernel has its grid
    barriers. Used by the compile/ISA tests and the GPU test against the reference."""
    ph = attention_phases(layout, arch, variant)
    ctas, threads, words = ph.geometry.ctas, ph.geometry.threads, ph.lds_words

    @flyc.kernel(known_block_size=[threads, 1, 1])
    def attn_probe(
        scratch: fx.Int64, tab: fx.Int64, cos_sin: fx.Int64, bt: fx.Int64, pos: fx.Int64,
        slots: fx.Int64, seq_lens: fx.Int64, step: fx.Int64, health: fx.Int64,
        layer: fx.Int32, bt_stride: fx.Int32, n: fx.Int32, phase: fx.Int32,
    ):  # fmt: skip
        bid = fx.block_idx.x
        tid = fx.thread_idx.x
        lds = fx.SharedAllocator().allocate(fx.Array[fx.Int32, words, 16]).peek().ptr
        if phase == 0:
            ph.prep(bid, tid, layer, n, tab, scratch, cos_sin, pos, slots, health, step)
        if phase == 1:
            ph.partial(
                bid, tid, lds, layer, n, bt_stride, tab, scratch, bt, seq_lens, pos, health, step
            )
        if phase == 2:
            ph.combine(bid, tid, n, scratch, seq_lens, pos)

    @flyc.jit
    def launch_attn_probe(
        scratch: fx.Int64, tab: fx.Int64, cos_sin: fx.Int64, bt: fx.Int64, pos: fx.Int64,
        slots: fx.Int64, seq_lens: fx.Int64, step: fx.Int64, health: fx.Int64,
        layer: fx.Int32, bt_stride: fx.Int32, n: fx.Int32, phase: fx.Int32,
        stream: fx.Stream = _CURRENT_STREAM,
    ):  # fmt: skip
        attn_probe(
            scratch,
            tab,
            cos_sin,
            bt,
            pos,
            slots,
            seq_lens,
            step,
            health,
            layer,
            bt_stride,
            n,
            phase,
        ).launch(grid=(ctas, 1, 1), block=(threads, 1, 1), stream=stream)

    return launch_attn_probe


def probe_trace_args(layout: Layout, variant: Variant) -> tuple:
    """Placeholder values for COMPILE_ONLY tracing of the probe kernel."""
    return (0,) * 9 + (0, 1, layout.variant_tokens(variant), 0)
