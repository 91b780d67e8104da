"""Buffer sizing and the kernel argument list, against numbers worked out by hand here."""

from __future__ import annotations

import pytest

from mono_aot.spec import abi
from mono_aot.spec.layouts import resolve_layout
from tests.reference.helpers import small_layout

SHIPPED = resolve_layout("minimax-m3.1-dspark-tp4")


def _regions(plan: abi.BufferPlan) -> list[tuple[str, int, int]]:
    return [tuple(r) for r in plan.regions]


def test_shipped_scratch_narrow_by_hand():
    # narrow: 1..2 requests of 7 tokens -> 14 tokens; 5 layers -> 11 norm sums; 304 CTAs on
    # gfx942 + 2 requests -> 306 attention partial slots of 7 x 16 = 112 query rows
    t = 14
    want = [
        ("sync", 0, 2 * 4 * 128 + 128),  # two halves of 4 lines, then the launch counter
        ("ss", 1280, 2 * 11 * t * 4),  # 1152 rounded up to 256 -> 1280
        ("x", 2560, t * 6144 * 4),  # 1280 + 1232 = 2512 -> 2560
        ("h", 346624, t * 6144 * 2),
        ("qkv", 518656, t * 2304 * 4),
        ("attn", 647680, t * 2048 * 2),
        ("act", 705024, t * 3072 * 2),
        ("attn_part", 791040, 306 * 112 * 128 * 4),
        ("attn_ml", 18338304, 306 * 112 * 8),
    ]
    plan = abi.scratch_plan(SHIPPED, "narrow")
    assert _regions(plan) == want
    assert plan.total == 18612480 == SHIPPED.scratch_bytes("narrow")


def test_shipped_scratch_wide_by_hand():
    t = 56  # 3..8 requests of 7 tokens; 304 + 8 = 312 partial slots
    want = [
        ("sync", 0, 1152),
        ("ss", 1280, 2 * 11 * t * 4),
        ("x", 6400, t * 6144 * 4),  # 1280 + 4928 = 6208 -> 6400
        ("h", 1382656, t * 6144 * 2),
        ("qkv", 2070784, t * 2304 * 4),
        ("attn", 2586880, t * 2048 * 2),
        ("act", 2816256, t * 3072 * 2),
        ("attn_part", 3160320, 312 * 112 * 128 * 4),
        ("attn_ml", 21051648, 312 * 112 * 8),
    ]
    plan = abi.scratch_plan(SHIPPED, "wide")
    assert _regions(plan) == want
    assert plan.total == 21331200 == SHIPPED.scratch_bytes("wide")


def test_shipped_peer_buffer_by_hand():
    # 56 tokens (the wide launch); rows per workgroup: ceil(6144/304) = 21 (gfx942),
    # 6144/256 = 24 (gfx950) -> 24, already a multiple of 8; a block: 56 x 24 bf16 = 2688 B
    block = 56 * 24 * 2
    flags = 304 * 4 * 4  # int32 [ctas][tp], ctas = the larger count
    mbox = 4 * 304 * block
    want = [
        ("hdr", 0, 256),
        ("flags_attn0", 256, flags),
        ("mbox_attn0", 5120, mbox),
        ("flags_attn1", 3273728, flags),
        ("mbox_attn1", 3278592, mbox),
        ("flags_mlp0", 6547200, flags),
        ("mbox_mlp0", 6552064, mbox),
        ("flags_mlp1", 9820672, flags),
        ("mbox_mlp1", 9825536, mbox),
    ]
    plan = abi.peer_plan(SHIPPED)
    assert _regions(plan) == want
    assert plan.total == 13094144 == SHIPPED.peer_bytes
    assert abi.mbox_rows(SHIPPED) == 24 and abi.mbox_tokens(SHIPPED) == 56


def test_small_layout_by_hand():
    lay = small_layout()  # hidden 256, 2 q heads x 32 per rank, qkv rows 128, mlp 128, qpr 4
    narrow = {n: s for n, _, s in abi.scratch_plan(lay, "narrow").regions}
    assert narrow == {
        "sync": 1152,
        "ss": 2 * 5 * 8 * 4,
        "x": 8 * 256 * 4,
        "h": 8 * 256 * 2,
        "qkv": 8 * 128 * 4,
        "attn": 8 * 64 * 2,
        "act": 8 * 128 * 2,
        "attn_part": 306 * 8 * 32 * 4,
        "attn_ml": 306 * 8 * 8,
    }
    assert abi.scratch_plan(lay, "narrow").total == 354304  # attn_ml ends at 354176
    # wide: 32 tokens, ss 1280 B, x at 2560, ..., attn_part 312 * 8 * 32 * 4 at 80384
    assert abi.scratch_plan(lay, "wide").total == 80384 + 319488 + 312 * 8 * 8 == 419840
    assert abi.mbox_rows(lay) == 8  # ceil(256 / 304) = 1 -> one 16-byte vector of bf16
    assert abi.peer_plan(lay).total == 256 + 4 * (4864 + 4 * 304 * 32 * 8 * 2) == 2510080


@pytest.mark.parametrize("lay", [SHIPPED, small_layout()], ids=["shipped", "small"])
def test_plans_hold_what_the_reference_stores(lay):
    """Every region is aligned, disjoint and large enough for the step's stored values."""
    for plan in [abi.scratch_plan(lay, v) for v in lay.variants()] + [abi.peer_plan(lay)]:
        end = 0
        for _, off, size in plan.regions:
            assert off % abi.REGION_ALIGN == 0 and off >= end and size > 0
            end = off + size
        assert plan.total >= end and plan.total % abi.REGION_ALIGN == 0
    for v in lay.variants():
        t = lay.variant_tokens(v)
        p = abi.scratch_plan(lay, v)
        assert p.size("x") >= t * lay.model.hidden * 4  # fp32 residual
        assert p.size("h") >= t * lay.model.hidden * 2  # bf16 GEMV input
        assert p.size("qkv") >= t * lay.qkv_rows_per_rank * 4
        assert p.size("attn") >= t * lay.q_rows_per_rank * 2
        assert p.size("act") >= t * lay.mlp_per_rank * 2
        assert p.size("ss") >= 2 * (2 * lay.model.layers + 1) * t * 4
    # a mailbox holds every source rank's bf16 partial of the largest launch, and every
    # workgroup's rows of the balanced split fit its block on every target
    tp, h = lay.parallel.tp, lay.model.hidden
    t = max(lay.variant_tokens(v) for v in lay.variants())
    assert abi.peer_plan(lay).size("mbox_attn0") >= tp * t * h * 2
    for target in lay.targets.values():
        assert -(-h // target.ctas) <= abi.mbox_rows(lay)


def test_kernel_arguments_follow_the_runner():
    # the user's runner's _launch: 18 addresses, peers.local, pe[0..3], step, health, then
    # rank, bt.stride(0), n as 32-bit integers
    names = [
        *"x out tab qkv_w qkv_s o_w o_s gu_w gu_s d_w d_s final_norm cos_sin bt pos slots".split(),
        "seq_lens",
        "scratch",
        "peer_local",
        "pe0",
        "pe1",
        "pe2",
        "pe3",
        "step",
        "health",
    ]
    layout = abi.kernarg_layout(4)
    assert [n for n, _, _ in layout] == [*names, "rank", "bt_stride", "n"]
    assert [(off, size) for _, off, size in layout[:25]] == [(8 * i, 8) for i in range(25)]
    assert layout[25:] == [("rank", 200, 4), ("bt_stride", 204, 4), ("n", 208, 4)]
