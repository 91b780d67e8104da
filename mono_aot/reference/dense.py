"""The same 5-layer draft block written plainly, as a training framework would: the check on
the sharded reference.

No tensor parallelism, no paging, no packed layouts, no fp8: full ``[out, in]`` weight matrices
(``mono_aot.reference.weights.LayerWeights``), grouped-query attention with ``repeat_interleave``,
rotate-half RoPE, everything float64. Each request is given its context K/V as dense tensors.

Comparing it with ``mono_aot.reference.step`` to 1e-10 is meaningful because the reference
caches this step's own K/V in fp8 and attention reads them back: that rounding is part of the
defined step. The dense model therefore accepts ``kv_transform``, applied to the draft tokens'
own K/V before attention (identity by default); the comparison passes the fp8 store-then-load
round trip ``decode(encode(k / k_scale)) * k_scale``. The comparison stays independent: the
dense model never sees the paged cache, block table, slots, per-rank row order, codes or
scales; the shared piece is the elementwise fp8 codec, which is itself checked bit for bit
against torch's float8 dtypes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from mono_aot.reference.weights import LayerWeights
from mono_aot.spec.layouts import Layout

KVTransform = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class DenseConfig:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    mlp: int
    eps: float
    alpha: float
    limit: float
    window: int = 0  # 0: the whole context
    causal: bool = False

    @classmethod
    def from_layout(cls, layout: Layout) -> DenseConfig:
        m = layout.model
        return cls(
            hidden=m.hidden,
            heads=m.heads,
            kv_heads=m.kv_heads,
            head_dim=m.head_dim,
            rotary_dim=m.rotary_dim,
            mlp=m.mlp,
            eps=m.norm_eps,
            alpha=m.swiglu_alpha,
            limit=m.swiglu_limit,
            window=m.window,
            causal=m.causal,
        )


@dataclass(frozen=True)
class DenseRequest:
    """One request of the batch.

    ``rows``: its token rows of ``x``. ``context_k``/``context_v``: per layer, the K/V (float,
    ``[len, kv_heads, head_dim]``, already dequantized) of every attended position this step
    does not write, at ``context_positions`` (int ``[len]``). ``own_visible``: bool
    ``[len(rows)]``, which of its tokens' own K/V are attended (those written into an attended
    position). Which query sees which of these keys is the model's window and causality.
    """

    rows: slice
    context_k: Sequence[torch.Tensor]
    context_v: Sequence[torch.Tensor]
    own_visible: torch.Tensor
    context_positions: torch.Tensor


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma RMSNorm: the weight is stored as an offset from one."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return x / torch.sqrt(variance + eps) * (1.0 + weight)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def apply_partial_rope(
    x: torch.Tensor, cos_sin_rows: torch.Tensor, rotary_dim: int
) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; cos_sin_rows: [tokens, rotary_dim] (cos half, sin half)."""
    cos, sin = cos_sin_rows.chunk(2, dim=-1)
    cos = torch.cat((cos, cos), dim=-1).unsqueeze(1)
    sin = torch.cat((sin, sin), dim=-1).unsqueeze(1)
    rot, keep = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, keep), dim=-1)


class DenseDrafter:
    """The draft model's decoder layers and final norm, one process, float64."""

    def __init__(
        self, config: DenseConfig, layers: Sequence[LayerWeights], final_norm: torch.Tensor
    ) -> None:
        self.cfg = config
        f64 = torch.float64
        # matrices stay in their given dtype (widened per use: the shipped geometry's are GBs)
        self.layers = [
            {
                **{n: getattr(w, n) for n in ("q", "k", "v", "o", "gate", "up", "down")},
                **{n: getattr(w, n).to(f64) for n in ("w_in", "w_post", "w_q", "w_k")},
            }
            for w in layers
        ]
        self.final_norm = final_norm.to(f64)

    @staticmethod
    def _linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x @ weight.to(torch.float64).t()

    def _attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        allowed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q: [t, heads, d]; k, v: [s, kv_heads, d]; allowed: bool [t, s] (None: all)
        -> [t, heads * d]; a query that may see no key gets zeros."""
        c = self.cfg
        t = q.shape[0]
        if k.shape[0] == 0:
            return q.new_zeros(t, c.heads * c.head_dim)
        group = c.heads // c.kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        probs = self._probs(q, k, allowed)
        return torch.einsum("hts,shd->thd", probs, v).reshape(t, c.heads * c.head_dim)

    def _probs(
        self, q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q: [t, heads, d]; k: [s, heads, d] -> the attention's probabilities [heads, t, s]
        (its own method so that a test can look at them, ``tests/reference/test_problem.py``)."""
        scores = torch.einsum("thd,shd->hts", q, k) / (self.cfg.head_dim**0.5)
        if allowed is None:
            return scores.softmax(dim=-1)
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = scores.softmax(dim=-1)
        return torch.where(allowed.any(dim=-1, keepdim=True), probs, 0.0)

    def _allowed(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
        """bool [t, s]: a query at position p sees a key at j when j > p - window (if the
        model has a window) and j <= p (if causal)."""
        c = self.cfg
        p, j = query_pos.long()[:, None], key_pos.long()[None, :]
        ok = torch.ones(p.shape[0], j.shape[1], dtype=torch.bool)
        if c.window:
            ok = ok & (j > p - c.window)
        if c.causal:
            ok = ok & (j <= p)
        return ok

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        requests: Sequence[DenseRequest],
        kv_transform: KVTransform | None = None,
    ) -> torch.Tensor:
        c = self.cfg
        n = x.shape[0]
        hidden = x.to(torch.float64)
        rope = cos_sin[positions[:n].long()].to(torch.float64)
        for li, w in enumerate(self.layers):
            # --- attention block ---
            normed = rms_norm(hidden, w["w_in"], c.eps)
            q = self._linear(normed, w["q"]).view(n, c.heads, c.head_dim)
            k = self._linear(normed, w["k"]).view(n, c.kv_heads, c.head_dim)
            v = self._linear(normed, w["v"]).view(n, c.kv_heads, c.head_dim)
            q = apply_partial_rope(rms_norm(q, w["w_q"], c.eps), rope, c.rotary_dim)
            k = apply_partial_rope(rms_norm(k, w["w_k"], c.eps), rope, c.rotary_dim)
            if kv_transform is not None:
                k, v = kv_transform(li, k, v)
            attn_out = torch.empty(n, c.heads * c.head_dim, dtype=torch.float64)
            for req in requests:
                mine = req.own_visible.to(torch.bool)
                keys = torch.cat((req.context_k[li].to(torch.float64), k[req.rows][mine]))
                values = torch.cat((req.context_v[li].to(torch.float64), v[req.rows][mine]))
                own = positions[req.rows]
                key_pos = torch.cat((req.context_positions.long(), own[mine].long()))
                allowed = self._allowed(own, key_pos)
                attn_out[req.rows] = self._attention(q[req.rows], keys, values, allowed)
            hidden = hidden + self._linear(attn_out, w["o"])
            # --- MLP block ---
            normed = rms_norm(hidden, w["w_post"], c.eps)
            gate = self._linear(normed, w["gate"]).clamp(max=c.limit)
            up = self._linear(normed, w["up"]).clamp(min=-c.limit, max=c.limit)
            act = gate * torch.sigmoid(c.alpha * gate) * (up + 1.0)
            hidden = hidden + self._linear(act, w["down"])
        return rms_norm(hidden, self.final_norm, c.eps)


__all__ = [
    "DenseConfig",
    "DenseDrafter",
    "DenseRequest",
    "apply_partial_rope",
    "rms_norm",
    "rotate_half",
]
