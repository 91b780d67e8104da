"""The draft model's paged fp8 KV cache, as the user's runner binds it.

One cache per layer per rank: uint8 ``[blocks, kv_heads_per_rank, kv_block, 2 * head_dim]``
(``[blocks, 1, 16, 256]`` on the shipped layout). For each cached token of each of the rank's KV
heads, bytes ``0..head_dim-1`` are K's fp8 codes and ``head_dim..2*head_dim-1`` V's.

- A slot id ``s`` is block ``s // kv_block``, offset ``s % kv_block``; slot ``-1`` (vLLM's
  padding slot) writes nothing. Any other negative slot, or one past the cache, is an error.
- Request ``i``'s position ``j`` lives at slot ``block_table[i, j // kv_block] * kv_block +
  j % kv_block``; only the block-table entries covering the positions read are looked at.
- Scales: ``code = encode(k / k_scale)`` on write (saturating at the format's max, as the
  kernels do), ``k = decode(code) * k_scale`` on read; likewise V with ``v_scale``.

Imports only torch and mono_aot's plain modules: the runner may use it at serving time.
"""

from __future__ import annotations

import torch

from mono_aot.reference.fp8 import FP8Format, decode, encode, resolve_format
from mono_aot.spec.errors import BadInput
from mono_aot.spec.layouts import Layout

PAD_SLOT = -1


def cache_shape(layout: Layout, blocks: int) -> tuple[int, int, int, int]:
    """The shape of one layer's cache on one rank."""
    return (blocks, layout.kv_heads_per_rank, layout.serving.kv_block, layout.kv_entry_bytes)


def new_cache(
    layout: Layout, blocks: int, fill: int = 0, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A cache of ``blocks`` blocks with every byte ``fill``."""
    if blocks <= 0:
        raise BadInput(f"a KV cache needs at least one block, got {blocks}")
    return torch.full(cache_shape(layout, blocks), fill, dtype=torch.uint8, device=device)


def check_cache(cache: torch.Tensor, layout: Layout, what: str = "cache") -> int:
    """``BadInput`` unless ``cache`` is this layout's uint8 cache; returns its block count."""
    if not isinstance(cache, torch.Tensor):
        raise BadInput(f"{what}: expected a uint8 tensor, got {type(cache).__name__}")
    want = cache_shape(layout, 1)[1:]
    if cache.dtype != torch.uint8 or cache.dim() != 4 or tuple(cache.shape[1:]) != want:
        raise BadInput(
            f"{what}: {cache.dtype} {list(cache.shape)}, expected torch.uint8 [blocks, {', '.join(map(str, want))}]"
        )
    if cache.shape[0] == 0:
        raise BadInput(f"{what}: has no blocks")
    return int(cache.shape[0])


def slots_of(
    block_table: torch.Tensor,
    req: int,
    positions: torch.Tensor,
    kv_block: int,
    blocks: int | None = None,
) -> torch.Tensor:
    """Slot ids (int64) of request ``req``'s ``positions`` through its block-table row.

    ``blocks``, when given, bounds every block id looked up (``BadInput`` names the entry).
    """
    pos = positions.to(torch.int64)
    if pos.numel() and int(pos.min()) < 0:
        raise BadInput(f"request {req}: negative position {int(pos.min())}")
    cols = pos // kv_block
    row = block_table[req]
    if pos.numel() and int(cols.max()) >= row.shape[0]:
        raise BadInput(
            f"request {req}: position {int(pos.max())} needs block-table column {int(cols.max())}, "
            f"the table has {row.shape[0]}"
        )
    ids = row.to(torch.int64)[cols]
    if blocks is not None and ids.numel():
        bad = (ids < 0) | (ids >= blocks)
        if bool(bad.any()):
            k = int(torch.nonzero(bad)[0, 0])
            raise BadInput(
                f"block_table[{req}, {int(cols[k])}] = {int(ids[k])} is outside the cache's "
                f"{blocks} blocks (read for position {int(pos[k])})"
            )
    return ids * kv_block + pos % kv_block


def check_slots(
    slots: torch.Tensor, cache_blocks: int, kv_block: int, what: str = "slots"
) -> torch.Tensor:
    """The write mask (slot != -1), after checking every other slot is inside the cache and unique."""
    s = slots.to(torch.int64)
    valid = s != PAD_SLOT
    bad = (s < PAD_SLOT) | (s >= cache_blocks * kv_block)
    if bool(bad.any()):
        k = int(torch.nonzero(bad)[0, 0])
        raise BadInput(
            f"{what}[{k}] = {int(s[k])}: outside the cache's {cache_blocks} x {kv_block} slots "
            f"(and not the padding slot {PAD_SLOT})"
        )
    used = s[valid]
    if used.numel() != torch.unique(used).numel():
        raise BadInput(f"{what}: two tokens write the same slot")
    return valid


def fp32_scale(scale: float | torch.Tensor) -> torch.Tensor:
    """A K/V scale as the kernels hold it (an fp32 scalar), widened to a float64 0-d tensor."""
    return (
        torch.as_tensor(scale, dtype=torch.float64).to(torch.float32).to(torch.float64).reshape(())
    )


def encode_kv(
    k: torch.Tensor, v: torch.Tensor, k_scale: float, v_scale: float, fmt: FP8Format | str
) -> torch.Tensor:
    """Cache bytes ``[n, heads, 2 * head_dim]`` of K/V ``[n, heads, head_dim]`` (saturating)."""
    f = resolve_format(fmt)
    if k.shape != v.shape or k.dim() != 3:
        raise BadInput(f"K {list(k.shape)} and V {list(v.shape)} must both be [n, heads, head_dim]")
    ks, vs = fp32_scale(k_scale), fp32_scale(v_scale)
    return torch.cat(
        [
            encode(k.to(torch.float64) / ks, f, saturate=True),
            encode(v.to(torch.float64) / vs, f, saturate=True),
        ],
        dim=-1,
    )


def write_codes(
    cache: torch.Tensor, slots: torch.Tensor, codes: torch.Tensor, layout: Layout
) -> torch.Tensor:
    """Store ``codes`` ``[n, heads, 2*head_dim]`` at ``slots`` ``[n]`` in place; returns the write mask."""
    blocks = check_cache(cache, layout)
    B = layout.serving.kv_block
    want = (slots.shape[0], *cache.shape[1:2], cache.shape[3])
    if codes.dtype != torch.uint8 or tuple(codes.shape) != want:
        raise BadInput(
            f"codes: {codes.dtype} {list(codes.shape)}, expected torch.uint8 {list(want)}"
        )
    mask = check_slots(slots, blocks, B)
    s = slots.to(torch.int64)[mask]
    cache[s // B, :, s % B, :] = codes[mask]
    return mask


def write_kv(
    cache: torch.Tensor,
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: float,
    v_scale: float,
    layout: Layout,
    fmt: FP8Format | str,
) -> torch.Tensor:
    """Encode K/V with the layer's scales and store them at ``slots``; returns the bytes encoded."""
    codes = encode_kv(k, v, k_scale, v_scale, fmt)
    write_codes(cache, slots, codes, layout)
    return codes


def gather_codes(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    req: int,
    length: int,
    layout: Layout,
    start: int = 0,
) -> torch.Tensor:
    """Cache bytes ``[length - start, heads, 2*head_dim]`` of request ``req``'s positions
    ``start..length-1`` (only the block-table entries of those positions are looked at)."""
    blocks = check_cache(cache, layout)
    B = layout.serving.kv_block
    pos = torch.arange(start, length, dtype=torch.int64)
    slots = slots_of(block_table, req, pos, B, blocks)
    return cache[slots // B, :, slots % B, :]


def read_kv(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    req: int,
    length: int,
    k_scale: float,
    v_scale: float,
    layout: Layout,
    fmt: FP8Format | str,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V ``[length, heads, head_dim]`` of request ``req``, dequantized with the scales."""
    f = resolve_format(fmt)
    codes = gather_codes(cache, block_table, req, length, layout)
    D = layout.model.head_dim
    k = decode(codes[..., :D], f, dtype) * fp32_scale(k_scale).to(dtype)
    v = decode(codes[..., D:], f, dtype) * fp32_scale(v_scale).to(dtype)
    return k, v


__all__ = [
    "PAD_SLOT",
    "cache_shape",
    "check_cache",
    "check_slots",
    "encode_kv",
    "fp32_scale",
    "gather_codes",
    "new_cache",
    "read_kv",
    "slots_of",
    "write_codes",
    "write_kv",
]
