"""The 4-rank sharded, paged float64 reference against the independent dense model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mono_aot.reference import RequestSpec, make_problem, max_rel_error, run_tp, step_rank
from mono_aot.reference.dense import apply_partial_rope, rms_norm
from mono_aot.reference.fp8 import boundary_distance, encode
from mono_aot.reference.step import StepInputs, kv_agreement, norm_rel_error, rank_step
from mono_aot.reference.weights import dequantize_rows
from mono_aot.spec.errors import BadInput
from tests.reference.helpers import small_layout

LAY = small_layout()
QPR, B = LAY.serving.qpr, LAY.serving.kv_block
F, T = False, True

# several requests in one chunk: a context shorter than one block, one spanning many blocks,
# pad slots at the tail (not attended) and in the middle (stale pre-step K/V attended), a
# request that writes nothing, one with no context at all
MIXED = [
    RequestSpec(3),
    RequestSpec(150),
    RequestSpec(37, (T, T, F, F), seq_len=39),
    RequestSpec(20, (F, F, F, F)),
    RequestSpec(0),
    RequestSpec(9, (T, F, T, T)),
]


@pytest.fixture(scope="module", params=["gfx942", "gfx950"])
def mixed(request):
    p = make_problem(LAY, request.param, MIXED, seed=11)
    caches = p.caches()
    res = run_tp(LAY, p.fmt, p.ranks, caches, p.inputs)
    return p, caches, res


def test_scenario_is_what_it_claims(mixed):
    p, _, _ = mixed
    bt = p.inputs.block_table
    assert not bt.is_contiguous() and bt.stride(0) != bt.shape[1]
    assert bt.shape[0] > len(MIXED) and p.inputs.seq_lens.shape[0] > len(MIXED)
    assert p.inputs.positions.shape[0] > len(MIXED) * QPR
    lens = [r.seq_len for r in p.requests]
    assert min(lens) < B and max(lens) > 10 * B
    assert int((p.inputs.slots[: len(MIXED) * QPR] == -1).sum()) == 7
    # blocks are scattered, not consecutive
    blocks = p.requests[1].blocks
    assert blocks != sorted(blocks)


def test_reference_equals_dense_model(mixed):
    p, _, res = mixed
    want = p.dense()
    assert res.out.dtype == torch.float64 and res.out.shape == (len(MIXED) * QPR, LAY.model.hidden)
    assert bool(torch.isfinite(res.out).all())
    err = max_rel_error(res.out, want)
    assert err < 1e-10, err
    # every rank computes the same output
    for r in res.ranks[1:]:
        assert torch.equal(r.out, res.out)


def test_cache_holds_exactly_the_written_bytes(mixed):
    p, caches, res = mixed
    initial = p.caches()
    n = len(MIXED) * QPR
    slots = p.inputs.slots[:n]
    written = slots != -1
    s = slots[written]
    for rank in range(LAY.parallel.tp):
        r = res.ranks[rank]
        assert torch.equal(r.written, written)
        for li in range(LAY.model.layers):
            expect = initial[rank][li].clone()
            expect[s // B, :, s % B, :] = r.kv[li][written]
            assert torch.equal(caches[rank][li], expect), (rank, li)
            assert torch.equal(r.kv[li], encode(r.kv_prequant[li], p.fmt, saturate=True))


def test_one_rank_against_given_partials_matches_the_driver(mixed):
    p, _, res = mixed
    for rank in (0, 3):
        caches = p.caches()[rank]
        alone = step_rank(LAY, p.fmt, rank, p.ranks[rank], caches, p.inputs, res.partials)
        mine = res.ranks[rank]
        assert torch.equal(alone.out, mine.out)
        assert torch.equal(alone.kv, mine.kv)
        assert torch.equal(alone.partials, mine.partials)
        assert torch.equal(res.partials[:, :, rank], mine.partials)


def test_the_comparison_can_fail(mixed):
    """The dense check is sensitive to what it is meant to catch."""
    p, _, res = mixed
    want = p.dense()
    # ranks' weights swapped: another sharding than the dense model's
    swapped = [p.ranks[1], p.ranks[0], *p.ranks[2:]]
    bad = run_tp(LAY, p.fmt, swapped, p.caches(), p.inputs)
    assert max_rel_error(bad.out, want) > 1e-3
    # one context byte changed (request 1, position 100, rank 2's KV head, layer 0)
    caches = p.caches()
    r = p.requests[1]
    caches[2][0][r.blocks[100 // B], 0, 100 % B, 5] ^= 0x08
    bad = run_tp(LAY, p.fmt, p.ranks, caches, p.inputs)
    assert max_rel_error(bad.out, want) > 1e-9
    # the dense model without the fp8 round trip of the draft K/V: the reference really
    # attends to the bytes it wrote
    from mono_aot.reference.dense import DenseConfig, DenseDrafter

    plain = DenseDrafter(DenseConfig.from_layout(LAY), p.layers, p.final_norm).forward(
        p.inputs.x, p.inputs.positions, p.inputs.cos_sin, p.dense_requests()
    )
    assert max_rel_error(res.out, plain) > 1e-4


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_full_chunk_and_odd_requests(arch):
    reqs = [
        RequestSpec(0, (F, F, F, F), seq_len=0),  # nothing attended: zeros from attention
        RequestSpec(5, (T, T, T, T), seq_len=3),  # writes past what it attends
        RequestSpec(64),  # context of exactly whole blocks
        RequestSpec(7, (F, T, F, T)),
        RequestSpec(31),
        RequestSpec(2, (T, T, F, T), seq_len=5),
        RequestSpec(90),
        RequestSpec(16, (F, F, T, T), seq_len=20),
    ]
    assert len(reqs) == LAY.serving.chunk_reqs
    p = make_problem(LAY, arch, reqs, seed=12)
    res = run_tp(LAY, p.fmt, p.ranks, p.caches(), p.inputs)
    assert max_rel_error(res.out, p.dense()) < 1e-10


def test_two_kv_heads_per_rank():
    lay = small_layout(model={"heads": 16, "kv_heads": 8, "layers": 1})
    assert lay.kv_heads_per_rank == 2
    p = make_problem(
        lay, "gfx942", [RequestSpec(13), RequestSpec(40, (T, F, T, F), seq_len=43)], seed=13
    )
    res = run_tp(lay, p.fmt, p.ranks, p.caches(), p.inputs)
    assert max_rel_error(res.out, p.dense()) < 1e-10


def test_kernel_numerics(mixed):
    p, _, res = mixed
    caches = p.caches()
    kres = run_tp(LAY, p.fmt, p.ranks, caches, p.inputs, numerics="kernel")
    assert kres.out.dtype == torch.bfloat16
    # the storage roundings move the output by bf16-level amounts only
    err = max_rel_error(kres.out, res.out)
    assert 1e-4 < err < 2e-2, err
    for r in kres.ranks:
        pre = r.kv_prequant
        assert torch.equal(pre, pre.float().double())  # fp32 values, as the kernel holds them
        assert torch.equal(r.kv, encode(pre, p.fmt, saturate=True))
        assert torch.equal(r.partials, r.partials.to(torch.bfloat16).double())  # mailbox dtype
    # the kernel-mode layer-0 K of rank 0, recomputed here from the documented storage points
    w, m = p.ranks[0].layer(0), LAY.model
    x32 = p.inputs.x.float().double()
    one_w = (1.0 + w["w_in"].double()).float().double()
    hp = (x32 * one_w).float().to(torch.bfloat16).double()
    rstd = torch.rsqrt(x32.square().mean(-1, keepdim=True) + m.norm_eps)
    qkv = ((hp @ dequantize_rows(w["qkv_w"], w["qkv_s"], p.fmt).T) * rstd).float().double()
    qr, D = LAY.q_rows_per_rank, m.head_dim
    n = x32.shape[0]
    k = qkv[:, qr : qr + D].reshape(n, 1, D)
    rope = p.inputs.cos_sin.double()[p.inputs.positions[:n]]
    k = (
        apply_partial_rope(rms_norm(k, w["w_k"].double(), m.norm_eps), rope, m.rotary_dim)
        .float()
        .double()
    )
    pre_k = (k / float(w["k_scale"])).float().double()
    got = kres.ranks[0].kv_prequant[0][..., :D]
    assert (got - pre_k).abs().max() <= 1e-6 * pre_k.abs().max()
    # bytes agree exactly wherever the values are not within 1e-5 of an fp8 rounding midpoint
    safe = boundary_distance(pre_k, p.fmt) > 1e-5
    assert float(safe.double().mean()) > 0.99
    assert torch.equal(
        encode(pre_k, p.fmt, saturate=True)[safe], kres.ranks[0].kv[0][..., :D][safe]
    )


def _inputs(p, **changes) -> StepInputs:
    return dataclasses.replace(p.inputs, **changes)


def test_bad_inputs_are_named(mixed):
    p, _, _ = mixed
    f, w, c = p.fmt, p.ranks[0], p.caches()[0]

    def run(inputs=None, caches=None, numerics="float64", rank=0):
        g = rank_step(
            LAY, f, rank, w, caches if caches is not None else c, inputs or p.inputs, numerics
        )
        next(g)

    with pytest.raises(BadInput, match="multiple of qpr=4"):
        run(_inputs(p, x=p.inputs.x[:5]))
    with pytest.raises(BadInput, match="positions: torch.int32"):
        run(_inputs(p, positions=p.inputs.positions.int()))
    with pytest.raises(BadInput, match="block_table: torch.int64"):
        run(_inputs(p, block_table=p.inputs.block_table.long()))
    with pytest.raises(BadInput, match="seq_lens: 2 rows"):
        run(_inputs(p, seq_lens=p.inputs.seq_lens[:2]))
    with pytest.raises(BadInput, match="cos_sin"):
        run(_inputs(p, cos_sin=p.inputs.cos_sin.float()))
    with pytest.raises(BadInput, match="positions: must lie in"):
        run(_inputs(p, cos_sin=p.inputs.cos_sin[:100]))
    with pytest.raises(BadInput, match="caches: 1 given"):
        run(caches=c[:1])
    with pytest.raises(BadInput, match="numerics 'fast'"):
        run(numerics="fast")
    with pytest.raises(BadInput, match="rank 4"):
        run(rank=4)
    slots = p.inputs.slots.clone()
    slots[0] = p.num_blocks * B
    with pytest.raises(BadInput, match=r"slots\[0\]"):
        run(_inputs(p, slots=slots))
    # a needed block-table entry out of range (request 1's 3rd block)
    wide = p.inputs.block_table.clone()
    wide[1, 2] = p.num_blocks + 3
    with pytest.raises(BadInput, match=r"block_table\[1, 2\]"):
        run(_inputs(p, block_table=wide))
    seq = p.inputs.seq_lens.clone()
    seq[0] = 10_000
    with pytest.raises(BadInput, match="needs block-table column"):
        run(_inputs(p, seq_lens=seq))
    with pytest.raises(BadInput, match="peer_partials: shape"):
        step_rank(LAY, f, 0, w, c, p.inputs, torch.zeros(1))


def test_forced_kv_and_the_agreement_report():
    """What a kernel test does with the bytes a kernel wrote: force them, then compare."""
    lay = small_layout(model={"layers": 3})
    p = make_problem(lay, "gfx942", MIXED[:4], seed=14)
    ref = run_tp(lay, p.fmt, p.ranks, p.caches(), p.inputs, numerics="kernel")
    # forcing the reference's own bytes changes nothing
    same = run_tp(lay, p.fmt, p.ranks, p.caches(), p.inputs, "kernel", [r.kv for r in ref.ranks])
    assert torch.equal(same.out, ref.out)
    rep = kv_agreement(ref.ranks[1].kv, ref.ranks[1], p.fmt)
    assert [(a.exact, a.max_steps, a.value_err, a.unexplained) for a in rep] == [
        (1.0, 0, 0.0, 0)
    ] * 3
    # a stand-in "kernel": the same step with K scales one part in 1e6 off (fp32-level noise)
    other = [
        dataclasses.replace(r, k_scale=(r.k_scale.double() * (1 + 1e-6)).float()) for r in p.ranks
    ]
    caches = p.caches()
    kern = run_tp(lay, p.fmt, other, caches, p.inputs, numerics="kernel")
    n = len(MIXED[:4]) * QPR
    slots = p.inputs.slots[:n]
    w = slots != -1
    # read its bytes back out of its caches at the step's slots, as a kernel test would
    got = torch.zeros_like(ref.ranks[0].kv)
    got[:, w] = torch.stack([caches[0][li][slots[w] // B, :, slots[w] % B, :] for li in range(3)])
    forced = run_tp(lay, p.fmt, p.ranks, p.caches(), p.inputs, "kernel", [r.kv for r in kern.ranks])
    rep = kv_agreement(got, forced.ranks[0], p.fmt, rtol=1e-5)
    assert rep[0].unexplained == 0 and rep[0].max_steps <= 1
    assert all(a.exact > 0.95 and a.value_err < 1 / 16 for a in rep), rep
    assert norm_rel_error(kern.out, forced.out) < 2e-2
    # a wrong byte is reported
    got[0, 0, 0, 3] ^= 0x10
    assert kv_agreement(got, forced.ranks[0], p.fmt)[0].unexplained >= 1
    with pytest.raises(BadInput, match="force_kv"):
        run_tp(lay, p.fmt, p.ranks, p.caches(), p.inputs, "kernel", [r.kv[:1] for r in kern.ranks])
