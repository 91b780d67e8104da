"""A draft backbone built from torch modules with vLLM's attribute paths and the shipped
layout's per-rank shapes, whose own forward is real (it is the "stock" forward the plugin must
leave unchanged). Its attention layers are vLLM ``AttentionLayerBase`` modules registered in
vLLM's static forward context, so vLLM's own ``bind_kv_cache_to_layers`` binds their caches and
``get_attention_context`` finds them.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.distributed import tensor_model_parallel_all_reduce
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

from mono_aot.spec.layouts import Layout, resolve_layout

LAYOUT = resolve_layout("minimax-m3.1-dspark-tp4")


class DraftAttention(AttentionLayerBase):
    """What the runner reads of vLLM's ``Attention``: the bound cache, the name, the scales."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.layer_name = prefix
        self.kv_cache = torch.tensor([])
        self._k_scale = torch.ones(1, dtype=torch.float32)
        self._v_scale = torch.ones(1, dtype=torch.float32)
        ctx = get_current_vllm_config().compilation_config.static_forward_context
        ctx[prefix] = self

    def get_attn_backend(self):  # the test never selects a backend
        raise RuntimeError("DraftAttention has no attention backend")

    def get_kv_cache_spec(self, vllm_config):
        return None


class Norm(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + LAYOUT.model.norm_eps)
        return x32 * rstd * (1 + self.weight.float())


# (seed, name) -> (fp8 codes, E8M0 bytes, their bf16 values): every model a test process builds
# with one seed shares its weights (400 MB of random codes per model would dominate the tests)
_WEIGHTS: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


class MxLinear(nn.Module):
    """MXFP8 as vLLM's linear layers hold a MiniMax-M3.1 checkpoint after loading: e4m3fn codes
    and one E8M0 byte per ``lay.weights.block`` inputs (``weight_scale``)."""

    EXPONENT = 121  # E8M0 byte of 2^-6: codes below 2 make weights below 1/32

    def __init__(
        self, rows: int, cols: int, block: int, gen: torch.Generator, key: tuple[int, str]
    ) -> None:
        super().__init__()
        if key not in _WEIGHTS:
            # random codes of magnitude below 2 (0x7F and 0xFF, the NaN codes, never drawn)
            codes = torch.randint(0, 0x40, (rows, cols), generator=gen, dtype=torch.uint8)
            codes |= torch.randint(0, 2, (rows, cols), generator=gen, dtype=torch.uint8) << 7
            scales = self.EXPONENT + torch.randint(
                0, 3, (rows, cols // block), generator=gen, dtype=torch.uint8
            )
            fp8 = codes.view(torch.float8_e4m3fn)
            step = torch.exp2(scales.float() - 127).repeat_interleave(block, dim=1)
            _WEIGHTS[key] = (fp8, scales, (fp8.float() * step).to(torch.bfloat16))
        fp8, scales, self._dense = _WEIGHTS[key]
        self.weight = nn.Parameter(fp8, requires_grad=False)
        self.weight_scale = nn.Parameter(scales, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(torch.bfloat16) @ self._dense.t()).float()


class SelfAttn(nn.Module):
    def __init__(self, lay: Layout, gen: torch.Generator, prefix: str, key: str, seed: int) -> None:
        super().__init__()
        hd, hid = lay.model.head_dim, lay.model.hidden
        self.qkv_proj = MxLinear(
            lay.qkv_rows_per_rank, hid, lay.weights.block, gen, (seed, f"{key}.qkv")
        )
        self.o_proj = MxLinear(hid, lay.o_cols_per_rank, lay.weights.block, gen, (seed, f"{key}.o"))
        self.q_norm = Norm(hd)
        self.k_norm = Norm(hd)
        self.attn = DraftAttention(f"{prefix}.attn")
        self.q_rows = lay.q_rows_per_rank

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q = self.qkv_proj(h)[:, : self.q_rows]  # the stand-in model attends to nothing
        return tensor_model_parallel_all_reduce(self.o_proj(q))


class Mlp(nn.Module):
    def __init__(self, lay: Layout, gen: torch.Generator, key: str, seed: int) -> None:
        super().__init__()
        hid = lay.model.hidden
        self.gate_up_proj = MxLinear(
            lay.gu_rows_per_rank, hid, lay.weights.block, gen, (seed, f"{key}.gu")
        )
        self.down_proj = MxLinear(
            lay.model.hidden, lay.mlp_per_rank, lay.weights.block, gen, (seed, f"{key}.d")
        )
        self.half = lay.mlp_per_rank

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        gu = self.gate_up_proj(h)
        a = torch.nn.functional.silu(gu[:, : self.half]) * gu[:, self.half :]
        return tensor_model_parallel_all_reduce(self.down_proj(a))


class DraftLayer(nn.Module):
    def __init__(self, lay: Layout, gen: torch.Generator, prefix: str, i: int, seed: int) -> None:
        super().__init__()
        self.input_layernorm = Norm(lay.model.hidden)
        self.post_attention_layernorm = Norm(lay.model.hidden)
        self.self_attn = SelfAttn(lay, gen, f"{prefix}.self_attn", f"layer{i}", seed)
        self.mlp = Mlp(lay, gen, f"layer{i}", seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class DraftBackbone(nn.Module):
    """``forward(positions, inputs_embeds)`` -> the final norm's output, bf16 [n, hidden]."""

    def __init__(self, seed: int = 0, lay: Layout = LAYOUT, prefix: str = "model") -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.layers = nn.ModuleList(
            DraftLayer(lay, gen, f"{prefix}.layers.{i}", i, seed) for i in range(lay.model.layers)
        )
        self.norm = Norm(lay.model.hidden)
        self.register_buffer(
            "_rope_cos_sin_cache",
            torch.zeros(4096, lay.model.rotary_dim, dtype=torch.bfloat16),
            persistent=False,
        )

    def forward(self, positions: torch.Tensor, inputs_embeds: torch.Tensor) -> torch.Tensor:
        x = inputs_embeds.float()
        for layer in self.layers:
            x = layer(x)
        return self.norm(x).to(torch.bfloat16)
