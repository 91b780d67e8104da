"""What a rank runs in the vLLM hook's GPU test: vLLM's TP group over the selftest cluster's
group, the rank's reference weights in a draft backbone with vLLM's attribute paths (its own
forward must not run), ``accelerate``, and one draft step inside vLLM's forward context."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Backbone(nn.Module):
    """The selftest's draft model (``mono_aot.selftest.rank.draft_model``) as an ``nn.Module``;
    the stock forward raises, so a pass proves the step ran on the kernels."""

    def __init__(self, ns: Any) -> None:
        super().__init__()
        self.layers = ns.layers
        self.norm = ns.norm
        self._rope_cos_sin_cache = ns._rope_cos_sin_cache

    def forward(self, positions: torch.Tensor, inputs_embeds: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the hook served the stock forward on a GPU with the kernels built")


def hook_step(ctx: Any, msg: dict[str, Any]) -> dict[str, Any]:
    from vllm.config import CUDAGraphMode, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.forward_context import set_forward_context
    from vllm.v1.attention.backends.rocm_attn import RocmAttentionMetadata

    from mono_aot.selftest.rank import draft_model
    from mono_aot.vllm import accelerate

    dev = ctx.state["device"]
    torch.cuda.set_device(dev)
    w = torch.load(msg["weights"], weights_only=True)
    weights = {
        "packed": {k: t.to(dev) for k, t in w["packed"].items()},
        "norms": {k: t.to(dev) for k, t in w["norms"].items()},
        **{k: w[k].to(dev) for k in ("k_scale", "v_scale", "final_norm")},
    }
    pre = torch.load(msg["caches"], weights_only=True)
    caches = [c.to(dev).contiguous() for c in pre]
    case = torch.load(msg["case"], weights_only=True)
    rope = torch.load(msg["rope"], weights_only=True).to(dev)
    model = Backbone(draft_model(weights, caches, rope))
    cfg = VllmConfig()
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL
    names = [layer.self_attn.attn.layer_name for layer in model.layers]
    for layer in model.layers:
        cfg.compilation_config.static_forward_context[layer.self_attn.attn.layer_name] = (
            layer.self_attn.attn
        )
    x = case["x"].to(dev)
    base = case["bt_base"].to(dev)
    bt = base.as_strided(case["bt_shape"], case["bt_stride"], case["bt_offset"])
    slots = case["slots"].to(dev)
    seq_lens = case["seq_lens"].to(dev)
    n, q = x.shape[0], msg["qpr"]
    md = RocmAttentionMetadata(
        num_actual_tokens=n,
        max_query_len=q,
        query_start_loc=torch.arange(0, n + 1, q, dtype=torch.int32, device=dev),
        max_seq_len=int(seq_lens.max()),
        seq_lens=seq_lens,
        block_table=bt,
        slot_mapping=slots,
    )
    with set_current_vllm_config(cfg):
        if not ps.model_parallel_is_initialized():
            ps.init_distributed_environment(ctx.world, ctx.rank, "env://", ctx.rank, "gloo")
            ps.initialize_model_parallel(tensor_model_parallel_size=ctx.world)
        accelerate(model)
        with set_forward_context(
            {nm: md for nm in names}, cfg, slot_mapping={nm: slots for nm in names}
        ):
            out = model(case["positions"].to(dev), x)
        torch.cuda.synchronize()
        hook = model._mono_aot_hook
        return {
            "rank": ctx.rank,
            "decision": hook.last,
            "off": hook.off_reason,
            "out": out.cpu(),
            "caches": [kv.cpu() for kv in caches],
            "health": hook.runner.health.cpu().tolist() if hook.runner is not None else [-1] * 4,
        }
