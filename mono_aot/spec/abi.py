"""The kernel contract: argument list, pointer-table slots and buffer plans.

Shared by the kernels (which compile against it), the build checks (which compare the code
object's kernarg metadata with it), the torch reference and the runtime (which packs arguments
and allocates buffers by it). Plain Python: importing it never imports FlyDSL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mono_aot.spec.util import align_up, ceil_div

if TYPE_CHECKING:  # the layout calls into this module (scratch_bytes, peer_bytes): no cycle
    from mono_aot.spec.layouts import Layout, Variant


@dataclass(frozen=True)
class KernelArg:
    name: str
    kind: str  # "i64" (an address or 64-bit value) or "i32"

    @property
    def size(self) -> int:
        return 8 if self.kind == "i64" else 4


def kernel_args(tp: int) -> tuple[KernelArg, ...]:
    """The user's runner's ``_launch`` argument list, in order (README, "The drafter megakernels")."""
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

# Health words (int32 [4]) the kernels write when a bounded wait times out or an input is bad.
HEALTH_WORDS = 4
H_STATUS = 0  # 0 ok; otherwise a code below
H_WHAT = 1  # which wait: layer * 16 + phase
H_PEER = 2  # the rank (or barrier generation) it waited for; the bad block id or n
H_STEP = 3  # the step counter at the time
STATUS_OK = 0
STATUS_PEER_TIMEOUT = 1
STATUS_BARRIER_TIMEOUT = 2
STATUS_BAD_BLOCK = 3  # a block-table entry outside [0, T_NBLK)
# n (the launch's tokens) is 0, above the variant's token capacity or not a multiple of qpr:
# the launch wrote nothing (no scratch, peer buffer or out) and took no launch ticket, so the
# next launch on the same buffers runs as if this one never happened.
STATUS_BAD_N = 4
STATUS_NAMES = {
    STATUS_OK: "ok",
    STATUS_PEER_TIMEOUT: "timed out waiting for a peer rank's all-reduce partial",
    STATUS_BARRIER_TIMEOUT: "timed out in a grid barrier (a workgroup did not arrive)",
    STATUS_BAD_BLOCK: "a block-table entry outside the layer's KV cache",
    STATUS_BAD_N: "n is 0, above the kernel's token capacity or not a multiple of qpr "
    "(the launch wrote nothing)",
}

# H_WHAT = layer * 16 + one of these: the phase that ran (or whose barrier was waited on)
# when the failure was recorded. 8 and 9 are the attention phases' own codes.
PH_EMBED = 0  # input embeddings -> residual, first norm
PH_QKV = 1  # fused qkv projection
PH_PREP = 2  # q/k norms, rotary, K/V cache write (attention prep)
PH_PARTIAL = 3  # split attention
PH_COMBINE = 4  # attention combine
PH_O = 5  # o projection + push to the peers (attention all-reduce)
PH_AR_ATTN = 6  # attention all-reduce receive + residual + post-attention norm
PH_GU = 7  # gate/up projection + SwiGLU
PH_KV_WRITE = 8  # (attention.py) a bad slot in the K/V cache write
PH_ATTENTION = 9  # (attention.py) a bad block in the attention read
PH_DOWN = 10  # down projection + push to the peers (MLP all-reduce)
PH_AR_MLP = 11  # MLP all-reduce receive + residual + next norm
PH_FINAL = 12  # final norm -> out
PH_LAUNCH = 13  # the launch's arguments, checked before anything is written (STATUS_BAD_N)
PHASE_NAMES = {
    PH_EMBED: "embed", PH_QKV: "qkv", PH_PREP: "attention prep", PH_PARTIAL: "attention",
    PH_COMBINE: "attention combine", PH_O: "o projection", PH_AR_ATTN: "attention all-reduce",
    PH_GU: "gate/up", PH_KV_WRITE: "K/V cache write", PH_ATTENTION: "attention read",
    PH_DOWN: "down projection", PH_AR_MLP: "MLP all-reduce", PH_FINAL: "final norm",
    PH_LAUNCH: "launch arguments",
}  # fmt: skip


def describe_health(words: list[int] | tuple[int, ...]) -> str:
    """A health word quadruple as one sentence (what the runner raises)."""
    status, what, peer, step = (int(w) for w in words[:HEALTH_WORDS])
    if status == STATUS_OK:
        return "ok"
    reason = STATUS_NAMES.get(status, f"unknown status {status}")
    layer, phase = divmod(what, 16)
    where = f"layer {layer}, {PHASE_NAMES.get(phase, f'phase {phase}')}"
    extra = {
        STATUS_PEER_TIMEOUT: f"rank {peer}",
        STATUS_BARRIER_TIMEOUT: f"generation {peer}",
        STATUS_BAD_N: f"n={peer}",
    }
    detail = extra.get(status, f"block {peer}")
    return f"{reason} ({where}, {detail}, step {step})"


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


def attn_partial_slots(layout: Layout, variant: Variant) -> int:
    """Partial-result slots the attention split needs (mono_aot.kernels.attention).

    A launch's partition length is at least ceil(total context / CTAs), so its requests split
    into at most CTAs + requests partitions; the largest CTA count over the layout's targets
    sizes the buffer for every arch.
    """
    return max(t.ctas for t in layout.targets.values()) + layout.variant_reqs(variant)[1]


# Scratch "sync" region. Sync state belongs to a launch, never to "whoever reads the counter":
# every workgroup of every launch takes one ticket from the scratch's 64-bit ticket counter
# (SYNC_TICKET, one atomic add) before it touches anything else. Launches on one stream run one
# after the other and every workgroup of a launch takes exactly one ticket, so the tickets of a
# launch are [id * ctas, (id + 1) * ctas) and ``ticket // ctas`` is the launch's id in every
# workgroup, however late it was dispatched. Two parity halves of SYNC_HALF bytes (by id & 1),
# each holding the grid barrier's arrive counter, its generation and the launch's abort word on
# separate 128-byte lines: a launch works only in its own half and workgroup 0 zeroes the other
# half (and the other parity's norm sums), which the next launch on this scratch uses and which
# the previous launch, finished before this one started, can no longer touch. A late or aborted
# workgroup therefore only ever writes its own launch's half.
SYNC_LINE = 128
SYNC_COUNT = 0
SYNC_GEN = SYNC_LINE
SYNC_ABORT = 2 * SYNC_LINE
SYNC_HALF = 4 * SYNC_LINE
SYNC_TICKET = 2 * SYNC_HALF  # uint64: workgroup arrivals since the scratch was zeroed
SYNC_BYTES = SYNC_TICKET + SYNC_LINE


def launch_id(ticket: int, ctas: int) -> int:
    """The launch a workgroup's ticket belongs to (the kernel computes the same)."""
    return ticket // ctas


# Per-token sums of squares for the RMSNorms: fp32, one atomic add per workgroup and token.


def ss_slots(layout: Layout) -> int:
    """Norm sums per launch: before attention and before the MLP of every layer, and final."""
    return 2 * layout.model.layers + 1


def scratch_plan(layout: Layout, variant: Variant) -> BufferPlan:
    """The per-launch scratch buffer: every region holds the variant's most tokens."""
    t = layout.variant_tokens(variant)
    h = layout.model.hidden
    rows = layout.serving.qpr * layout.q_heads_per_rank  # query rows of one request
    return _plan(
        [
            ("sync", SYNC_BYTES),  # grid barrier, abort word, launch counter
            ("ss", 2 * ss_slots(layout) * t * 4),  # fp32 [2 parities][slots][tokens]
            ("x", t * h * 4),  # fp32 residual stream
            ("h", t * h * 2),  # bf16 x * (1 + w): GEMV input, normalised in its epilogue
            ("qkv", t * layout.qkv_rows_per_rank * 4),  # fp32 projection output
            ("attn", t * layout.q_rows_per_rank * 2),  # bf16 attention output (o input)
            ("act", t * layout.mlp_per_rank * 2),  # bf16 SwiGLU output (down input)
            # attention split partials: per slot, every query row's unnormalised fp32 output
            # and its (running max, sum) pair, merged by the combine phase
            ("attn_part", attn_partial_slots(layout, variant) * rows * layout.model.head_dim * 4),
            ("attn_ml", attn_partial_slots(layout, variant) * rows * 8),
        ]
    )


# Launches one step may hold (the epoch is step * EPOCH_SEQS + launch number in the step).
EPOCH_SEQS = 64
AR_KINDS = ("attn", "mlp")
# Peer-buffer header (this rank's own, never written by a peer): a uint64 ticket counter at
# HDR_TICKET with the same rule as SYNC_TICKET but shared by both variants (they share the
# peer buffer, not the scratch), then per parity of that launch id an int32 pair (step seen,
# launch number in that step) at HDR_SLOTS + 8 * parity. A launch reads its own parity's pair
# and workgroup 0 writes the other parity's pair for the next launch, so no workgroup of a
# launch can read a value another workgroup of the same launch wrote.
HDR_BYTES = 256
HDR_TICKET = 0
HDR_SLOTS = 16


def mbox_rows(layout: Layout) -> int:
    """Row stride of a mailbox block: the most hidden rows one workgroup owns in the balanced
    split over the layout's targets, rounded up to whole 16-byte vectors of bf16."""
    h = layout.model.hidden
    return align_up(max(ceil_div(h, t.ctas) for t in layout.targets.values()), 8)


def mbox_tokens(layout: Layout) -> int:
    """Token capacity of one mailbox block: the largest launch of any variant."""
    return max(layout.variant_tokens(v) for v in layout.variants())


def peer_plan(layout: Layout) -> BufferPlan:
    """Each rank's peer (all-reduce mailbox) buffer, the same for both variants.

    For each all-reduce kind (attention, MLP) x parity (layer % 2, so no rank overwrites a
    peer's unread data): flags int32 [ctas][tp] (the epoch tag a source rank's workgroup wrote
    after its block) and blocks bf16 [tp source][ctas][tokens][rows]: workgroup c's rows of the
    row-parallel partial for every token, contiguous (16-byte stores over the peer link).
    """
    tp = layout.parallel.tp
    ctas = max(t.ctas for t in layout.targets.values())
    block = mbox_tokens(layout) * mbox_rows(layout) * 2
    items: list[tuple[str, int]] = [("hdr", HDR_BYTES)]
    for k in AR_KINDS:
        for p in (0, 1):
            items.append((f"flags_{k}{p}", ctas * tp * 4))
            items.append((f"mbox_{k}{p}", tp * ctas * block))
    return _plan(items)
