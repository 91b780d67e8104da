"""A draft model with vLLM's attribute paths and CPU tensors of the shipped shapes.

The fp8 tensors are zeros (lazily allocated): the runner's tests check shapes, addresses and
launches, never values (the ``rocm`` tests judge values against the float64 reference).
"""

from __future__ import annotations

from types import SimpleNamespace as NS

import torch

from mono_aot.spec.layouts import Layout


def draft_model(lay: Layout, blocks: int = 64) -> NS:
    m = lay.model
    hid, hd = m.hidden, m.head_dim

    def proj(rows: int, cols: int) -> NS:
        if lay.weights.format == "mxfp8":  # e4m3fn codes, E8M0 bytes (127: a scale of 1)
            return NS(
                weight=torch.zeros(rows, cols, dtype=torch.float8_e4m3fn),
                weight_scale=torch.full((rows, cols // lay.weights.block), 127, dtype=torch.uint8),
            )
        return NS(
            weight=torch.zeros(rows, cols, dtype=torch.float8_e4m3fnuz),
            weight_scale=torch.ones(rows, dtype=torch.float32),
        )

    def bf16(n: int) -> NS:
        return NS(weight=torch.zeros(n, dtype=torch.bfloat16))

    layers = []
    for i in range(m.layers):
        attn = NS(
            kv_cache=[torch.zeros(blocks, 1, lay.serving.kv_block, 2 * hd, dtype=torch.uint8)],
            layer_name=f"model.layers.{i}.self_attn.attn",
            _k_scale=torch.ones(1, dtype=torch.float32),
            _v_scale=torch.ones(1, dtype=torch.float32),
        )
        layers.append(
            NS(
                input_layernorm=bf16(hid),
                post_attention_layernorm=bf16(hid),
                self_attn=NS(
                    q_norm=bf16(hd),
                    k_norm=bf16(hd),
                    qkv_proj=proj(lay.qkv_rows_per_rank, hid),
                    o_proj=proj(hid, lay.o_cols_per_rank),
                    attn=attn,
                ),
                mlp=NS(
                    gate_up_proj=proj(lay.gu_rows_per_rank, hid),
                    down_proj=proj(hid, lay.mlp_per_rank),
                ),
            )
        )
    return NS(
        layers=layers,
        norm=bf16(hid),
        _rope_cos_sin_cache=torch.zeros(4096, m.rotary_dim, dtype=torch.bfloat16),
    )
