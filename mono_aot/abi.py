"""The kernel contract: argument list, pointer-table slots and buffer plans.

Shared by the kernels (which compile against it), the build checks (which compare the code
object's kernarg metadata with it), the torch reference and the runtime (which packs arguments
and allocates buffers by it). Plain Python: importing it never imports FlyDSL.
"""

from __future__ import annotations

from dataclasses import dataclass

from mono_aot.layouts import Layout, Variant, align_up


@dataclass(frozen=True)
class KernelArg:
    name: str
    kind: str  # "i64" (an address or 64-bit value) or "i32"

    @property
    def size(self) -> int:
        return 8 if self.kind == "i64" else 4


def kernel_args(tp: int) -> tuple[KernelArg, ...]:
    """The user's runner's ``_launch`` argument list, in order (DESIGN.md, kernel contract)."""
    addrs = [
        "x", "out", "tab",
        "qkv_w", "qkv_s", "o_w", "o_s", "gu_w", "gu_s", "d_w", "d_s",
        "final_norm", "cos_sin", "bt", "pos", "slots", "seq_lens", "scratch",
        "peer_local",
        *[f"pe{r}" for r in range(tp)],
        "step", "health",
    ]  # fmt: skip
    return (
        *(KernelArg(a, "i64") for a in addrs),
        KernelArg("rank", "i32"),
        KernelArg("bt_stride", "i32"),
        KernelArg("n", "i32"),
    )


def kernarg_layout(tp: int) -> list[tuple[str, int, int]]:
    """(name, offset, size) of each by-value kernel argument, naturally aligned."""
    out, off = [], 0
    for a in kernel_args(tp):
        off = align_up(off, a.size)
        out.append((a.name, off, a.size))
        off += a.size
    return out


# Per-layer pointer table ``tab[layer, slot]`` (int64, TABLE_SLOTS columns): norm weights,
# the layer's K/V scales (fp32 scalars), its paged cache and the cache's block count.
TABLE_SLOTS = 16
T_W_IN = 0  # input norm weight, bf16 [hidden]
T_W_POST = 1  # post-attention norm weight, bf16 [hidden]
T_W_Q = 2  # per-head q norm weight, bf16 [head_dim]
T_W_K = 3  # k norm weight, bf16 [head_dim]
T_K_SCALE = 4  # fp32 scalar: cached K = k / k_scale
T_V_SCALE = 5  # fp32 scalar: cached V = v / v_scale
T_CACHE = 6  # the layer's paged KV cache, uint8 [blocks, 1, kv_block, 2 * head_dim]
T_NBLK = 7  # blocks in that cache (bounds every block-table entry)
NORM_SLOTS = {"w_in": T_W_IN, "w_post": T_W_POST, "w_q": T_W_Q, "w_k": T_W_K}
SCALE_SLOTS = {"k_scale": T_K_SCALE, "v_scale": T_V_SCALE}

# Health words (int32 [4]) the kernels write when a bounded wait times out.
HEALTH_WORDS = 4
H_STATUS = 0  # 0 ok; otherwise a code below
H_WHAT = 1  # which wait: layer * 16 + phase
H_PEER = 2  # the rank (or barrier generation) it waited for
H_STEP = 3  # the step counter at the time
STATUS_OK = 0
STATUS_PEER_TIMEOUT = 1
STATUS_BARRIER_TIMEOUT = 2
STATUS_BAD_BLOCK = 3  # a block-table entry outside [0, T_NBLK)

REGION_ALIGN = 256


@dataclass(frozen=True)
class BufferPlan:
    """Named byte regions of one device buffer; offsets are REGION_ALIGN-aligned."""

    regions: tuple[tuple[str, int, int], ...]  # (name, offset, bytes)

    @property
    def total(self) -> int:
        if not self.regions:
            return 0
        name, off, size = self.regions[-1]
        return align_up(off + size, REGION_ALIGN)

    def offset(self, name: str) -> int:
        for n, off, _ in self.regions:
            if n == name:
                return off
        raise KeyError(name)

    def size(self, name: str) -> int:
        for n, _, size in self.regions:
            if n == name:
                return size
        raise KeyError(name)


def _plan(items: list[tuple[str, int]]) -> BufferPlan:
    off, out = 0, []
    for name, size in items:
        out.append((name, off, size))
        off = align_up(off + size, REGION_ALIGN)
    return BufferPlan(tuple(out))


# Attention splits a long context into partitions of this many positions per task.
ATTN_PARTITION = 256


def attn_splits(layout: Layout, max_context: int = 1 << 17) -> int:
    """Context partitions per (token, head) the combine step merges."""
    return -(-max_context // ATTN_PARTITION)


def attn_partial_slots(layout: Layout, variant: Variant) -> int:
    """Partial-result slots the attention split needs (mono_aot.kernels.attention).

    A launch's partition length is at least ceil(total context / CTAs), so its requests split
    into at most CTAs + requests partitions; the largest CTA count over the layout's targets
    sizes the buffer for every arch.
    """
    return max(t.ctas for t in layout.targets.values()) + layout.variant_reqs(variant)[1]


def scratch_plan(layout: Layout, variant: Variant) -> BufferPlan:
    """The per-launch scratch buffer: every region holds the variant's most tokens."""
    t = layout.variant_tokens(variant)
    h = layout.model.hidden
    rows = layout.serving.qpr * layout.q_heads_per_rank  # query rows of one request
    return _plan(
        [
            ("barrier", REGION_ALIGN),  # grid barrier: arrive counter, generation
            ("x", t * h * 4),  # fp32 residual stream
            ("h", t * h * 2),  # bf16 normed activations (GEMV input)
            ("qkv", t * layout.qkv_rows_per_rank * 4),  # fp32 projection output
            ("attn", t * layout.q_rows_per_rank * 2),  # bf16 attention output (o input)
            ("act", t * layout.mlp_per_rank * 2),  # bf16 SwiGLU output (down input)
            # attention split partials: per slot, every query row's unnormalised fp32 output
            # and its (running max, sum) pair, merged by the combine phase
            ("attn_part", attn_partial_slots(layout, variant) * rows * layout.model.head_dim * 4),
            ("attn_ml", attn_partial_slots(layout, variant) * rows * 8),
        ]
    )


def peer_plan(layout: Layout) -> BufferPlan:
    """Each rank's mailbox buffer: (value, epoch tag) fp32+u32 pairs per element.

    Two regions (attention and MLP all-reduce) x two parities (layer % 2, so no rank overwrites
    a peer's unread data) x one slot per source rank x the largest launch's tokens x hidden.
    """
    t = max(layout.variant_tokens(v) for v in layout.variants())
    pairs = layout.parallel.tp * t * layout.model.hidden
    return _plan([(f"{r}{p}", pairs * 8) for r in ("attn", "mlp") for p in (0, 1)])
