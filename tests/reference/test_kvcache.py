"""The paged fp8 KV cache: slot arithmetic, writes, reads, scales, and the errors."""

from __future__ import annotations

import pytest
import torch

from mono_aot.reference.fp8 import E4M3FN, E4M3FNUZ, decode, encode
from mono_aot.reference.kvcache import (
    cache_shape,
    encode_kv,
    gather_codes,
    new_cache,
    read_kv,
    slots_of,
    write_codes,
    write_kv,
)
from mono_aot.spec.errors import BadInput
from tests.reference.helpers import shipped_one_layer, small_layout

LAY = small_layout(model={"heads": 16, "kv_heads": 8})  # two KV heads per rank
B = LAY.serving.kv_block
D = LAY.model.head_dim
H = LAY.kv_heads_per_rank


def _table(gen: torch.Generator, blocks_per_req: list[int], total: int) -> torch.Tensor:
    """A random block table as a non-contiguous view (a column slice of a wider tensor)."""
    perm = torch.randperm(total, generator=gen)
    wide = torch.full((len(blocks_per_req) + 1, max(blocks_per_req) + 4), 10**6, dtype=torch.int32)
    bt = wide[:, 2 : 2 + max(blocks_per_req)]
    at = 0
    for i, nb in enumerate(blocks_per_req):
        bt[i, :nb] = perm[at : at + nb].to(torch.int32)
        at += nb
    assert not bt.is_contiguous()
    return bt


def test_shapes():
    assert cache_shape(LAY, 5) == (5, 2, B, 2 * D)
    assert cache_shape(shipped_one_layer(), 7) == (7, 1, 128, 256)
    c = new_cache(LAY, 3, fill=0x7F)
    assert c.dtype == torch.uint8 and bool((c == 0x7F).all())
    with pytest.raises(BadInput, match="at least one block"):
        new_cache(LAY, 0)


def test_slots_follow_the_block_table():
    bt = torch.tensor([[5, 2, 9], [0, 7, 1]], dtype=torch.int32)
    pos = torch.tensor([0, 7, 8, 15, 16, 23])
    assert slots_of(bt, 0, pos, B).tolist() == [40, 47, 16, 23, 72, 79]
    assert slots_of(bt, 1, pos, B).tolist() == [0, 7, 56, 63, 8, 15]


@pytest.mark.parametrize("f", [E4M3FNUZ, E4M3FN], ids=["fnuz", "fn"])
def test_write_then_read_roundtrips_codes_exactly(f):
    gen = torch.Generator().manual_seed(0)
    lens = [3, 8, 29]  # shorter than a block, exactly one, several
    nb = [-(-n // B) for n in lens]
    total = sum(nb) + 2
    bt = _table(gen, nb, total)
    cache = new_cache(LAY, total, fill=f.nan_code)
    want = []
    for i, n in enumerate(lens):
        codes = torch.randint(0, 256, (n, H, 2 * D), generator=gen, dtype=torch.uint8)
        slots = slots_of(bt, i, torch.arange(n), B, total)
        mask = write_codes(cache, slots, codes, LAY)
        assert bool(mask.all())
        want.append(codes)
    for i, n in enumerate(lens):
        assert torch.equal(gather_codes(cache, bt, i, n, LAY), want[i])
    # the bytes are where the layout says: block bt[i, j // B], offset j % B, K then V
    i, j = 2, 17
    blk = int(bt[i, j // B])
    assert torch.equal(cache[blk, :, j % B, :], want[i][j])
    # nothing else was touched: the two spare blocks and the tails of partial blocks are NaN codes
    used = sum(lens)
    assert int((cache != f.nan_code).any(dim=(1, 3)).sum()) == used


def test_pad_slots_write_nothing():
    cache = new_cache(LAY, 4, fill=0xAA)
    before = cache.clone()
    slots = torch.tensor([-1, 9, -1, 30], dtype=torch.int64)
    codes = (
        torch.arange(4 * H * 2 * D, dtype=torch.int64)
        .remainder(200)
        .to(torch.uint8)
        .reshape(4, H, 2 * D)
    )
    mask = write_codes(cache, slots, codes, LAY)
    assert mask.tolist() == [False, True, False, True]
    expect = before.clone()
    expect[1, :, 1, :] = codes[1]
    expect[3, :, 6, :] = codes[3]
    assert torch.equal(cache, expect)


@pytest.mark.parametrize("f", [E4M3FNUZ, E4M3FN], ids=["fnuz", "fn"])
def test_scales_are_applied_on_write_and_read(f):
    gen = torch.Generator().manual_seed(1)
    ks, vs = 0.037, 0.011
    n = 12
    bt = torch.tensor([[2, 0]], dtype=torch.int32)
    cache = new_cache(LAY, 3)
    # values that survive fp8 exactly: decode(code) * fp32 scale
    kc = torch.randint(0, 0x7F, (n, H, D), generator=gen, dtype=torch.uint8)
    vc = torch.randint(0, 0x7F, (n, H, D), generator=gen, dtype=torch.uint8)
    ks32 = float(torch.tensor(ks, dtype=torch.float32))
    vs32 = float(torch.tensor(vs, dtype=torch.float32))
    k = decode(kc, f, torch.float64) * ks32
    v = decode(vc, f, torch.float64) * vs32
    slots = slots_of(bt, 0, torch.arange(n), B, 3)
    codes = write_kv(cache, slots, k, v, ks, vs, LAY, f)
    assert torch.equal(codes[..., :D], kc) and torch.equal(codes[..., D:], vc)
    k2, v2 = read_kv(cache, bt, 0, n, ks, vs, LAY, f)
    assert torch.equal(k2, k) and torch.equal(v2, v)
    # arbitrary values: the code is encode(k / k_scale), the value read is decode * k_scale
    kr = torch.randn(n, H, D, generator=gen, dtype=torch.float64)
    vr = torch.randn(n, H, D, generator=gen, dtype=torch.float64)
    codes = write_kv(cache, slots, kr, vr, ks, vs, LAY, f)
    assert torch.equal(codes[..., :D], encode(kr / ks32, f, saturate=True))
    k3, v3 = read_kv(cache, bt, 0, n, ks, vs, LAY, f)
    assert torch.equal(k3, decode(encode(kr / ks32, f, saturate=True), f, torch.float64) * ks32)
    assert torch.equal(v3, decode(encode(vr / vs32, f, saturate=True), f, torch.float64) * vs32)


def test_writes_saturate_instead_of_nan():
    k = torch.full((1, H, D), 1e6, dtype=torch.float64)
    codes = encode_kv(k, -k, 1.0, 1.0, E4M3FNUZ)
    assert bool((codes[..., :D] == 0x7F).all()) and bool((codes[..., D:] == 0xFF).all())


def test_errors_name_the_problem():
    cache = new_cache(LAY, 2)
    codes = torch.zeros(2, H, 2 * D, dtype=torch.uint8)
    with pytest.raises(BadInput, match=r"slots\[1\] = 16: outside"):
        write_codes(cache, torch.tensor([0, 2 * B]), codes, LAY)
    with pytest.raises(BadInput, match=r"slots\[0\] = -2"):
        write_codes(cache, torch.tensor([-2, 0]), codes, LAY)
    with pytest.raises(BadInput, match="same slot"):
        write_codes(cache, torch.tensor([3, 3]), codes, LAY)
    with pytest.raises(BadInput, match="codes: "):
        write_codes(cache, torch.tensor([3, 4]), codes[:, :1], LAY)
    with pytest.raises(BadInput, match=r"cache: torch.float32"):
        write_codes(cache.float(), torch.tensor([3, 4]), codes, LAY)
    bt = torch.tensor([[1, 5]], dtype=torch.int32)
    with pytest.raises(BadInput, match=r"block_table\[0, 1\] = 5 is outside the cache's 2 blocks"):
        gather_codes(cache, bt, 0, B + 1, LAY)
    with pytest.raises(BadInput, match="needs block-table column 2"):
        gather_codes(cache, bt, 0, 2 * B + 1, LAY)
    # only the entries covering the positions read are looked at
    assert gather_codes(cache, bt, 0, B, LAY).shape == (B, H, 2 * D)
