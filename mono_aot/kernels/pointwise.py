"""Elementwise parts of the drafter kernels: residual updates, RMSNorm pieces, SwiGLU, output.

Every workgroup owns the same hidden rows (columns of the residual ``x``) in every elementwise
phase as in the o and down projections (the balanced split ``[c*H//ctas, (c+1)*H//ctas)``),
so a workgroup updates exactly the rows it reduced from the peers.

RMSNorm is split in two so it needs no phase of its own: where ``x`` is updated, the
workgroup writes ``h = bf16(x * (1 + w))`` and adds its rows' ``sum(x^2)`` per token to a
global fp32 sum (a fixed-order sum inside the workgroup, then one agent-scope atomic add per
workgroup and token: the order of those adds varies, so the last bits of a norm scale may
differ between runs and ranks; a fixed-point sum would be order-independent but cannot span
the dynamic range of residual streams, from embeddings to outlier channels). The GEMV that
consumes ``h`` multiplies each token's result by ``rstd = rsqrt(ss / hidden + eps)``, which
factors out of the dot product.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir.dialects import llvm
from flydsl.expr import const_expr, range_constexpr
from flydsl.expr.typing import T

from mono_aot.kernels.common import AGENT, KernelCtx, gptr
from mono_aot.spec import abi
from mono_aot.spec.util import ceil_div

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class HiddenSplit:
    """The hidden rows a workgroup owns in the elementwise and all-reduce phases."""

    hidden: int
    ctas: int
    stride: int  # row stride of the per-workgroup tiles (abi.mbox_rows: >= the most rows owned)

    def r0(self, bid: Any) -> Any:
        return (fx.Int32(bid) * self.hidden) // self.ctas

    def count(self, bid: Any) -> Any:
        return ((fx.Int32(bid) + 1) * self.hidden) // self.ctas - self.r0(bid)


def hidden_split(k: KernelCtx) -> HiddenSplit:
    hs = HiddenSplit(k.lay.model.hidden, k.nwg, abi.mbox_rows(k.lay))
    if ceil_div(hs.hidden, hs.ctas) > hs.stride:
        raise ValueError("mailbox row stride smaller than the rows a workgroup owns")
    return hs


def exp2(x: Any) -> Any:
    """``v_exp_f32`` (no device library)."""
    return fx.Float32(
        llvm.call_intrinsic(T.f32, "llvm.amdgcn.exp2.f32", [fx.Float32(x).ir_value()], [], [])
    )


def swiglu(k: KernelCtx, gate: Any, up: Any) -> Any:
    """Clamped SwiGLU: ``g * sigmoid(alpha * g) * (u + 1)``, g clamped above at ``limit``, u to
    ``[-limit, limit]`` (README, "The draft step in torch")."""
    lim = float(k.lay.model.swiglu_limit)
    alpha = float(k.lay.model.swiglu_alpha)
    g = fx.Float32(gate)
    g = (g > lim).select(fx.Float32(lim), g)
    u = fx.Float32(up)
    u = (u > lim).select(fx.Float32(lim), u)
    u = (u < -lim).select(fx.Float32(-lim), u)
    sig = 1.0 / (exp2(g * (-alpha * LOG2E)) + 1.0)
    return g * sig * (u + 1.0)


def bf16_round(v: Any) -> Any:
    """An f32 value as bf16 (round to nearest even)."""
    return fx.Float32(v).to(fx.BFloat16)


def store_bf16(addr: Any, v: Any) -> None:
    gptr(fx.BFloat16, addr, 2).store(bf16_round(v))


def load_bf16(addr: Any) -> Any:
    return gptr(fx.BFloat16, addr, 2).load().to(fx.Float32)


def rstd_of(k: KernelCtx, ss: Any) -> Any:
    """``rsqrt(mean(x^2) + eps)`` from the sum of squares over hidden."""
    return fx.math.rsqrt(fx.Float32(ss) * (1.0 / k.lay.model.hidden) + float(k.lay.model.norm_eps))


def ss_addr(k: KernelCtx, slot: Any) -> Any:
    """Int64 address of norm sum ``slot`` (0 .. 2L) of this launch's parity (``k.par``)."""
    per = abi.ss_slots(k.lay) * k.n_max * 4
    return k.scr("ss") + fx.Int64(k.par) * per + fx.Int64(slot) * (k.n_max * 4)


@flyc.jit
def zero_other_parity(k: KernelCtx) -> None:
    """Workgroup 0 at launch start: zero the ss sums and sync words of the other parity, which
    the next launch on this scratch uses."""
    if k.bid == 0:
        per = abi.ss_slots(k.lay) * k.n_max  # fp32 words of one parity
        other = 1 - k.par
        base = k.scr("ss") + fx.Int64(other) * (per * 4)
        i = k.tid
        while i < per:
            gptr(fx.Float32, base + fx.Int64(i) * 4).store(fx.Float32(0.0))
            i = i + k.threads
        if k.tid < abi.SYNC_HALF // 4:
            half = k.scr("sync") + fx.Int64(other) * abi.SYNC_HALF
            gptr(fx.Int32, half + fx.Int64(k.tid) * 4).store(fx.Int32(0))


@flyc.jit
def load_rstd(k: KernelCtx, slot: Any, n: Any, rstd_lds: Any) -> None:
    """Threads t < n_max: ``rstd_lds[t]`` = the norm scale of token t (0 past n); then a
    workgroup barrier."""
    t = k.tid
    if t < k.n_max:
        r = fx.Float32(0.0)
        if t < n:
            ss = gptr(fx.Float32, ss_addr(k, slot) + fx.Int64(t) * 4).load()
            r = rstd_of(k, ss)
        rstd_lds[t] = r
    fx.gpu.barrier()


@flyc.jit
def absorb(
    k: KernelCtx, n: Any, add_fn: Any, replace: bool, w_norm: Any, slot: Any, sq: Any
) -> None:
    """The workgroup's hidden rows of every token: ``x = add`` (``replace``) or ``x += add``,
    then ``h = bf16(x * (1 + w_norm))`` and the rows' ``sum(x^2)`` into norm sum ``slot``.

    Work goes in groups of 8 rows of one token (``stride`` is a multiple of 8, so a group
    never straddles two tokens): ``add_fn(t, i0)`` returns the 8 f32 to add for token t, local
    rows i0..i0+7 (rows past the workgroup's count are ignored). ``sq``: LDS f32
    [n_max * stride] scratch."""
    hs = hidden_split(k)
    H, RS = hs.hidden, hs.stride
    VPT = RS // 8
    r0 = hs.r0(k.bid)
    cnt = hs.count(k.bid)
    xs = k.scr("x")
    hb = k.scr("h")
    g = k.tid
    total = n * VPT
    while g < total:
        t = g // VPT
        i0 = (g % VPT) * 8
        adds = add_fn(t, i0)
        for j in range_constexpr(8):
            i = i0 + j
            v = fx.Float32(0.0)
            if i < cnt:
                col = fx.Int64(r0 + i)
                xa = xs + (fx.Int64(t) * H + col) * 4
                if const_expr(replace):
                    xn = fx.Float32(adds[j])
                else:
                    xn = gptr(fx.Float32, xa).load() + adds[j]
                gptr(fx.Float32, xa).store(xn)
                w = load_bf16(w_norm + col * 2)
                store_bf16(hb + (fx.Int64(t) * H + col) * 2, xn * (w + 1.0))
                v = xn * xn
            sq[t * RS + i] = v
        g = g + k.threads
    fx.gpu.barrier()
    t = k.tid
    if t < n:
        s = fx.Float32(0.0)
        for j in range_constexpr(RS):  # fixed order inside the workgroup
            s = s + sq[t * RS + j]
        fx.atomic_add(gptr(fx.Float32, ss_addr(k, slot) + fx.Int64(t) * 4), s, syncscope=AGENT)
    fx.gpu.barrier()


@flyc.jit
def final_out(k: KernelCtx, n: Any, slot: Any, rstd_lds: Any) -> None:
    """``out = bf16(x * rstd * (1 + final_norm))`` for the workgroup's hidden rows."""
    load_rstd(k, slot, n, rstd_lds)
    hs = hidden_split(k)
    H, RS = hs.hidden, hs.stride
    r0 = hs.r0(k.bid)
    cnt = hs.count(k.bid)
    xs = k.scr("x")
    e = k.tid
    total = n * RS
    while e < total:
        t = e // RS
        i = e % RS
        if i < cnt:
            col = fx.Int64(r0 + i)
            off = fx.Int64(t) * H + col
            x = gptr(fx.Float32, xs + off * 4).load()
            w = load_bf16(k.final_norm + col * 2)
            store_bf16(k.out + off * 2, x * rstd_lds[t] * (w + 1.0))
        e = e + k.threads
