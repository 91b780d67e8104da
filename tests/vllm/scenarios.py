"""What each TP rank does in the hook tests: vLLM's own TP group (gloo on the CPU), vLLM's plugin
loader and model registry, vLLM's forward context and cache binding, and the draft model of
``draft_model.py``. Each scenario returns what the hook decided, so the test can show that every
rank took the same path."""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path
from typing import Any

import torch

ARCH = "MiniMaxM3DSparkModel"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def _inputs(requests: int, seed: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    from tests.vllm.draft_model import LAYOUT

    n = requests * LAYOUT.serving.qpr
    gen = torch.Generator().manual_seed(seed)
    embeds = (torch.randn(n, LAYOUT.model.hidden, generator=gen) * 0.1).to(torch.bfloat16)
    return torch.arange(n, dtype=torch.int64), embeds


def _metadata(model: Any, requests: int) -> tuple[dict, dict]:
    """vLLM's per-layer attention metadata (the ROCm backend's class) and slot mapping."""
    from vllm.v1.attention.backends.rocm_attn import RocmAttentionMetadata

    from tests.vllm.draft_model import LAYOUT

    q = LAYOUT.serving.qpr
    n = requests * q
    md = RocmAttentionMetadata(
        num_actual_tokens=n,
        max_query_len=q,
        query_start_loc=torch.arange(0, n + 1, q, dtype=torch.int32),
        max_seq_len=64,
        seq_lens=torch.full((requests,), 64, dtype=torch.int32),
        block_table=torch.arange(requests * 4, dtype=torch.int32).reshape(requests, 4),
        slot_mapping=torch.arange(n, dtype=torch.int64),
    )
    names = [layer.self_attn.attn.layer_name for layer in model.layers]
    return {name: md for name in names}, {name: md.slot_mapping for name in names}


def _bind(model: Any, cfg: Any, blocks: int = 64) -> None:
    """vLLM's own binding of freshly allocated draft KV caches to the model's layers."""
    from vllm.v1.worker.utils import bind_kv_cache_to_layers

    from tests.vllm.draft_model import LAYOUT

    caches = {
        layer.self_attn.attn.layer_name: torch.zeros(
            blocks, 1, LAYOUT.serving.kv_block, LAYOUT.kv_entry_bytes, dtype=torch.uint8
        )
        for layer in model.layers
    }
    bind_kv_cache_to_layers(caches, cfg.compilation_config.static_forward_context)


def _forward(
    model: Any, cfg: Any, requests: int, with_metadata: bool = True, requests_tokens: int = 0
) -> dict:
    from vllm.forward_context import set_forward_context

    from tests.vllm.draft_model import DraftBackbone

    positions, embeds = _inputs(requests)
    if requests_tokens:  # a step whose token count is not whole requests
        positions, embeds = positions[:-requests_tokens], embeds[:-requests_tokens]
    md, slots = _metadata(model, requests) if with_metadata else (None, {})
    with set_forward_context(md, cfg, slot_mapping=slots):
        out = model(positions, embeds)
        hook = model._mono_aot_hook
        stock = None
        if hook.last != "kernels":  # the stock path must give the stock forward's exact output
            stock = bool(torch.equal(out, DraftBackbone.forward(model, positions, embeds)))
    return {"decision": hook.last, "off": hook.off_reason, "equal": stock, "builds": hook.builds}


def _standin_calls(call: str) -> int:
    """How many times this rank's process called ``call`` of the stand-in HIP library."""
    from tests.runtime.conftest import Calls

    log = os.environ.get("MONO_AOT_STANDIN_LOG")
    return len(Calls(Path(log)).of(call)) if log else 0


def _standin_launches() -> int:
    return _standin_calls("hipModuleLaunchKernel")


def _scenario(name: str, cls: Any, cfg: Any, rank: int) -> list[dict]:
    from vllm.config import CUDAGraphMode, VllmConfig, set_current_vllm_config

    import mono_aot.vllm.adapter as adapter

    model = cls(seed=rank, prefix=f"{name}.model")
    steps = []
    if name == "profiling":  # vLLM's profile run: attention metadata None, caches not bound
        steps.append(_forward(model, cfg, 2, with_metadata=False))
    elif name == "unbound":  # metadata, but this rank's caches are not bound yet
        steps.append(_forward(model, cfg, 2))
    elif name == "capture-before-build":
        _bind(model, cfg)
        real = adapter.capturing
        # stand-in for a HIP graph capture on the current stream (a CPU torch cannot capture)
        adapter.capturing = lambda: True
        try:
            steps.append(_forward(model, cfg, 2))
        finally:
            adapter.capturing = real
    elif name == "piecewise":
        _bind(model, cfg)
        pw = VllmConfig()
        pw.compilation_config.cudagraph_mode = CUDAGraphMode.PIECEWISE
        pw.compilation_config.static_forward_context = cfg.compilation_config.static_forward_context
        with set_current_vllm_config(pw):
            steps.append(_forward(model, pw, 2))
            steps.append(_forward(model, pw, 2))
    elif name == "build":  # every condition met: the runner is built (or fails) on every rank
        _bind(model, cfg)
        steps.append(_forward(model, cfg, 2))
        steps.append(_forward(model, cfg, 9))
        steps[-1]["launches"] = _standin_launches()
        steps.append(_forward(model, cfg, 2, with_metadata=False))
        _bind(model, cfg, blocks=32)  # vLLM re-binds the caches: the runner is stale
        steps.append(_forward(model, cfg, 3))
        steps[-1]["launches"] = _standin_launches()
        frees = _standin_calls("hipFree")
        del model  # the runner (its peer buffer) goes with the model
        gc.collect()
        steps.append({"freed_with_model": _standin_calls("hipFree") - frees})
    elif name == "bad-step":  # built, then a step that is not whole requests
        _bind(model, cfg)
        steps.append(_forward(model, cfg, 2))
        steps.append(_forward(model, cfg, 3, requests_tokens=3))
    elif name == "rank-2-fails":
        _bind(model, cfg)
        if rank == 2:
            os.environ["MONO_AOT_STANDIN_CUS"] = "228"  # the stand-in device: a 228-CU part
        try:
            steps.append(_forward(model, cfg, 2))
        finally:
            os.environ.pop("MONO_AOT_STANDIN_CUS", None)
    elif name == "strict":
        _bind(model, cfg)
        os.environ["MONO_AOT_STRICT"] = "1"
        try:
            steps.append(_forward(model, cfg, 2))
        except Exception as e:  # noqa: BLE001 - the point: strict mode raises
            steps.append({"raised": f"{type(e).__name__}: {e}"})
        finally:
            os.environ.pop("MONO_AOT_STRICT")
    else:
        raise ValueError(name)
    return steps


def run_rank(rank: int, world: int, group: Any, arg: dict) -> dict:
    """Join vLLM's TP group, load the plugins, register the draft model, run the scenarios."""
    from vllm import ModelRegistry
    from vllm.config import CUDAGraphMode, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.plugins import load_general_plugins

    records = _Records()
    logging.getLogger("vllm.mono_aot").addHandler(records)
    cfg = VllmConfig()
    # what a ROCm deployment's config says (vLLM's CPU platform would set NONE)
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode[arg["mode"]]
    out: dict[str, Any] = {}
    with set_current_vllm_config(cfg):
        ps.init_distributed_environment(world, rank, "env://", rank, "gloo")
        ps.initialize_model_parallel(tensor_model_parallel_size=world)
        load_general_plugins()  # vLLM's loader calls mono_aot.vllm:register
        # the user's registration comes after the plugin's (lazy, as vLLM recommends)
        ModelRegistry.register_model(ARCH, "tests.vllm.draft_model:DraftBackbone")
        cls = ModelRegistry._try_load_model_cls(ARCH)
        out["class"] = [cls.__name__, getattr(cls, "_mono_aot_wrapped", None) is not None]
        for name in arg["scenarios"]:
            out[name] = _scenario(name, cls, cfg, rank)
        ps.destroy_model_parallel()
    out["log"] = records.lines
    return out
