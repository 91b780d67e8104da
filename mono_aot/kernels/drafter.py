"""The drafter megakernel: a whole draft step of one TP rank in one persistent launch.

One code path serves both variants; a variant only fixes ``n_max`` (its most tokens: scratch
sizes, unrolled token loops) and which GEMV phase runs the projections (VALU ``gemv_rows`` for
the narrow kernel, K3's MFMA ``mfma_gemm`` for the wide one). Grid = the layout's CTA count,
one 512-thread workgroup per CU, all co-resident; phases are separated by grid barriers:

    embed: x = f32(x_in), h = bf16(x (1 + w_in[0])), ss_in[0]          | barrier
    per layer l:
      qkv  = rstd * (W_qkv h) (VALU or MFMA)                             | barrier
      attention prep: q/k norms, rotary, fp8 K/V to the paged cache (K2) | barrier
      attention partial (K2)                                             | barrier
      attention combine (K2) -> attn bf16                                | barrier
      o = W_o attn -> push to the 4 mailboxes; receive own rows:
          x += sum of the 4 partials, h = bf16(x (1 + w_post)), ss        | barrier
      act = SwiGLU(rstd * W_gu h)                                        | barrier
      down = W_d act -> push; receive: x += sum, h = bf16(x (1 + w_in[l+1]
          or final_norm)), ss                                            | barrier
    out = bf16(x * rstd * (1 + final_norm))

That is 1 + 7 * layers grid barriers and 2 * layers all-reduces per launch. Every wait is
bounded (``sync``) and a failure skips all later work without an early return.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr

from mono_aot.kernels import allreduce, attention, gemv, pointwise, sync
from mono_aot.kernels.common import KernelCtx, gptr, publish
from mono_aot.kernels.names import KERNEL_NAMES
from mono_aot.spec import abi
from mono_aot.spec.errors import BadInput, MonoUnsupported
from mono_aot.spec.layouts import Layout, Variant
from mono_aot.spec.plans import (  # noqa: F401 (default_gemm: re-exported)
    GEMMS,
    SUPPORTED_TP,
    default_gemm,
    lds_arena,
    projection_plans,
)

_ARG_TYPES = {"i64": fx.Int64, "i32": fx.Int32}


def contract_signature(tp: int, *, stream: bool = False) -> Callable[[Any], Any]:
    """Give a ``**kw`` function the contract's parameter list (``abi.kernel_args(tp)``, in
    order, ``fx.Int64``/``fx.Int32`` annotations), plus the launcher's trailing ``stream``.

    FlyDSL reads a kernel's and a launcher's parameters through ``inspect.signature`` (which
    honours ``__signature__``) and calls the body with keyword arguments, so the argument list
    is written once, in the contract, and the kernargs follow it."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [
        inspect.Parameter(a.name, kind, annotation=_ARG_TYPES[a.kind]) for a in abi.kernel_args(tp)
    ]
    if stream:
        params.append(
            inspect.Parameter("stream", kind, default=fx.Stream(None), annotation=fx.Stream)
        )
    sig = inspect.Signature(params)

    def apply(fn: Any) -> Any:
        fn.__signature__ = sig
        return fn

    return apply


@dataclass(frozen=True)
class Projections:
    """The four projections of a layer: plans plus the function that runs them."""

    qkv: Any
    o: Any
    gu: Any
    down: Any
    run: Any
    name: str

    @property
    def lds_bytes(self) -> int:
        return max(p.lds_bytes for p in (self.qkv, self.o, self.gu, self.down))


def projections(layout: Layout, arch: str, variant: Variant, gemm: str) -> Projections:
    if gemm not in GEMMS:
        raise BadInput(f"unknown GEMV phase {gemm!r}; expected one of {', '.join(GEMMS)}")
    plans = projection_plans(layout, arch, variant, gemm)
    if gemm == "mfma":
        from mono_aot.kernels import mfma

        return Projections(**plans, run=mfma.mfma_gemm, name="mfma")
    return Projections(**plans, run=gemv.gemv_rows, name="valu")


@dataclass(frozen=True)
class KernelSpec:
    """Everything one kernel build is specialised on."""

    layout: Layout
    arch: str
    variant: Variant
    wait_ticks: int
    gemm: str

    @property
    def name(self) -> str:
        return KERNEL_NAMES[self.variant]


def _check(layout: Layout, variant: str, wait_ticks: int) -> None:
    if variant not in KERNEL_NAMES:
        raise BadInput(f"unknown variant {variant!r}; expected one of {', '.join(KERNEL_NAMES)}")
    if variant not in layout.variants():
        raise BadInput(f"layout {layout.name} has no {variant} kernel (wide_base is 1)")
    if layout.parallel.tp != SUPPORTED_TP:
        raise MonoUnsupported(
            f"layout {layout.name}: tp={layout.parallel.tp}; the kernels are written for tp=4"
        )
    if not isinstance(wait_ticks, int) or not 0 < wait_ticks < (1 << 62):
        raise BadInput(f"wait_ticks={wait_ticks!r} must be a positive integer")


def make_launcher(spec: KernelSpec) -> Any:
    """The ``@flyc.jit`` launcher of one kernel (the runner's ``_launch`` argument list)."""
    lay, arch, variant = spec.layout, spec.arch, spec.variant
    _check(lay, variant, spec.wait_ticks)
    L = lay.model.layers
    H = lay.model.hidden
    QKV = lay.qkv_rows_per_rank
    MLP = lay.mlp_per_rank
    nwg = lay.ctas(arch)
    threads = lay.kernel.threads
    n_max = lay.variant_tokens(variant)
    scratch = abi.scratch_plan(lay, variant)
    peer = abi.peer_plan(lay)
    proj = projections(lay, arch, variant, spec.gemm)
    attn = attention.attention_phases(lay, arch, variant)
    RS = abi.mbox_rows(lay)
    # LDS arena (mono_aot.spec.plans.LdsArena): [0, red) the GEMV's / attention's own use,
    # then rstd [n_max] f32, then the per-workgroup tile [n_max][RS] f32 (o/down partials; the
    # receive's squares); PlanError when it exceeds the CU's LDS
    lds_plan = lds_arena(lay, arch, variant, spec.gemm)
    off_rstd, off_tile, arena = lds_plan.off_rstd, lds_plan.off_tile, lds_plan.arena
    words, table_words = lds_plan.words, lds_plan.table_words
    run = proj.run
    ticks = spec.wait_ticks
    W_QKV, W_O, W_GU, W_D = QKV * H, H * lay.o_cols_per_rank, 2 * MLP * H, H * MLP

    # ---- the phases: each starts from fresh copies of ids and addresses (common.opaque) ----

    def views(k):
        return k.lds_ptr(fx.Float32, off_rstd, 16), k.lds_ptr(fx.Float32, off_tile, 16)

    @flyc.jit
    def ph_embed(k0):
        k = k0.fresh()
        pointwise.zero_other_parity(k)
        _, tile = views(k)
        r0 = pointwise.hidden_split(k).r0(k.bid)
        xin = k.x

        def embed_add(t, i0):
            # rows past the workgroup's count are ignored, but on an arch whose CTA count does
            # not divide hidden the last workgroup's group reaches past hidden: clamp the row so
            # the last token never reads past the end of x
            row = xin + fx.Int64(t) * (H * 2)
            cols = [fx.arith.min(r0 + i0 + j, fx.Int32(H - 1)) for j in range(8)]
            return [pointwise.load_bf16(row + fx.Int64(c) * 2) for c in cols]

        pointwise.absorb(k, k.n, embed_add, True, k.tab_at(0, abi.T_W_IN), 0, tile)

    @flyc.jit
    def ph_qkv(k0, layer):
        k = k0.fresh()
        rstd, _ = views(k)
        pointwise.load_rstd(k, layer * 2, k.n, rstd)
        qkv_a = k.scr("qkv")

        def emit(tok, row, v):
            gptr(fx.Float32, qkv_a + (fx.Int64(tok) * QKV + fx.Int64(row)) * 4).store(v * rstd[tok])

        run(k.bid, k.tid, k.stacked("qkv_w", layer, W_QKV), k.stacked("qkv_s", layer, proj.qkv.scale_layer_bytes),
            k.scr("h"), k.n, k.lds, proj.qkv, emit)  # fmt: skip

    @flyc.jit
    def ph_prep(k0, layer):
        k = k0.fresh()
        attn.prep(
            k.bid, k.tid, layer, k.n, k.tab, k.scratch, k.cos_sin, k.pos, k.slots, k.health, k.step
        )

    @flyc.jit
    def ph_partial(k0, layer):
        k = k0.fresh()
        attn.partial(k.bid, k.tid, k.lds, layer, k.n, k.bt_stride, k.tab, k.scratch, k.bt,
                     k.seq_lens, k.pos, k.health, k.step)  # fmt: skip

    @flyc.jit
    def ph_combine(k0):
        k = k0.fresh()
        attn.combine(k.bid, k.tid, k.n, k.scratch, k.seq_lens, k.pos)

    @flyc.jit
    def ph_row_parallel(k0, layer, kind: int):
        """o (kind 0) or down (kind 1): the GEMV into the LDS tile, then the push."""
        k = k0.fresh()
        _, tile = views(k)
        r0 = pointwise.hidden_split(k).r0(k.bid)

        def emit(tok, row, v):
            tile[tok * RS + (row - r0)] = v

        if const_expr(kind == 0):
            run(k.bid, k.tid, k.stacked("o_w", layer, W_O), k.stacked("o_s", layer, proj.o.scale_layer_bytes),
                k.scr("attn"), k.n, k.lds, proj.o, emit)  # fmt: skip
        else:
            run(k.bid, k.tid, k.stacked("d_w", layer, W_D), k.stacked("d_s", layer, proj.down.scale_layer_bytes),
                k.scr("act"), k.n, k.lds, proj.down, emit)  # fmt: skip
        allreduce.push(k, k.n, tile, layer, kind)

    @flyc.jit
    def ph_receive(k0, layer, kind: int, st):
        k = k0.fresh()
        _, tile = views(k)
        if const_expr(kind == 0):
            w_norm = k.tab_at(layer, abi.T_W_POST)
            phase = abi.PH_AR_ATTN
        else:
            nxt = layer + 1
            w_norm = (nxt < L).select(
                k.tab_at(fx.arith.min(nxt, fx.Int32(L - 1)), abi.T_W_IN), k.final_norm
            )
            phase = abi.PH_AR_MLP
        return allreduce.receive(k, k.n, layer, kind, phase, w_norm, layer * 2 + 1 + kind, tile, st)

    @flyc.jit
    def ph_gu(k0, layer):
        k = k0.fresh()
        rstd, _ = views(k)
        pointwise.load_rstd(k, layer * 2 + 1, k.n, rstd)
        act_a = k.scr("act")

        def emit(tok, j, gate, up):
            a = pointwise.swiglu(k, gate * rstd[tok], up * rstd[tok])
            pointwise.store_bf16(act_a + (fx.Int64(tok) * MLP + fx.Int64(j)) * 2, a)

        run(k.bid, k.tid, k.stacked("gu_w", layer, W_GU), k.stacked("gu_s", layer, proj.gu.scale_layer_bytes),
            k.scr("h"), k.n, k.lds, proj.gu, emit)  # fmt: skip

    @flyc.jit
    def ph_final(k0):
        k = k0.fresh()
        rstd, _ = views(k)
        pointwise.final_out(k, k.n, 2 * L, rstd)

    @flyc.jit
    def barrier(k0, st, what):
        return sync.grid_barrier(k0.fresh(), st, what)

    tp = lay.parallel.tp

    @flyc.kernel(name=spec.name + "_0", known_block_size=[threads, 1, 1])
    @contract_signature(tp)
    def drafter_kernel(**args):
        alloc = fx.SharedAllocator()
        lds = alloc.allocate(fx.Array[fx.Int32, words, 16]).peek().ptr
        sync_lds = alloc.allocate(fx.Array[fx.Int32, 4, 16]).peek()
        table = alloc.allocate(fx.Array[fx.Int32, table_words, 16]).peek()
        k = KernelCtx(lay, arch, variant, nwg, threads, n_max, scratch, peer, arena, ticks)
        k.addr.update({a.name: args[a.name] for a in abi.kernel_args(tp) if a.kind == "i64"})
        step, rank, bt_stride, n = (args[a] for a in ("step", "rank", "bt_stride", "n"))
        k.rt.update(
            bid=fx.block_idx.x, tid=fx.thread_idx.x, rank=rank, n=n, bt_stride=bt_stride,
            lds=lds, sync_lds=sync_lds, table=table, step_value=gptr(fx.Int32, step).load(),
        )  # fmt: skip
        # n is checked before anything is written; a bad n skips every phase and barrier
        n_ok = sync.n_valid(k, n)
        par, seq = sync.launch_start(k, n_ok)
        epoch = k.step_value * abi.EPOCH_SEQS + seq % abi.EPOCH_SEQS
        k.rt.update(par=par, seq=seq, epoch=epoch)
        publish(k)
        st = n_ok.select(fx.Int32(0), fx.Int32(abi.STATUS_BAD_N))
        if st == 0:
            ph_embed(k)
        st = barrier(k, st, abi.PH_EMBED)
        for layer_i in range(L, unroll=1):
            layer = fx.Int32(layer_i)
            what = layer * 16
            if st == 0:
                ph_qkv(k, layer)
            st = barrier(k, st, what + abi.PH_QKV)
            if st == 0:
                ph_prep(k, layer)
            st = barrier(k, st, what + abi.PH_PREP)
            if st == 0:
                ph_partial(k, layer)
            st = barrier(k, st, what + abi.PH_PARTIAL)
            if st == 0:
                ph_combine(k)
            st = barrier(k, st, what + abi.PH_COMBINE)
            if st == 0:
                ph_row_parallel(k, layer, 0)
            st = ph_receive(k, layer, 0, st)
            st = barrier(k, st, what + abi.PH_AR_ATTN)
            if st == 0:
                ph_gu(k, layer)
            st = barrier(k, st, what + abi.PH_GU)
            if st == 0:
                ph_row_parallel(k, layer, 1)
            st = ph_receive(k, layer, 1, st)
            st = barrier(k, st, what + abi.PH_AR_MLP)
        if st == 0:
            ph_final(k)

    @flyc.jit
    @contract_signature(tp, stream=True)
    def launch(**args):
        stream = args.pop("stream")
        drafter_kernel(**args).launch(grid=(nwg, 1, 1), block=(threads, 1, 1), stream=stream)

    return launch
