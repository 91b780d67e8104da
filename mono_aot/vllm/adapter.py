"""Everything mono-aot reads from vLLM, in one place (vLLM 0.34.0; README, "vLLM").

The attribute paths and functions used here are the contract with vLLM; a vLLM release that moves
one of them breaks exactly one function below, and its error names what moved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mono_aot.spec.errors import MonoUnsupported

if TYPE_CHECKING:
    from mono_aot.runtime.runner import AttentionContext, TPGroup


@dataclass(frozen=True)
class ForwardState:
    """What one forward pass looks like from vLLM's forward context."""

    has_context: bool  # inside vLLM's set_forward_context
    has_metadata: bool  # attention metadata present (None in profiling and dummy runs)
    piecewise: bool  # this forward runs under a PIECEWISE CUDA graph


def forward_state() -> ForwardState:
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return ForwardState(False, False, False)
    ctx = get_forward_context()
    md = ctx.attn_metadata
    has_md = md is not None and not (isinstance(md, dict | list) and len(md) == 0)
    return ForwardState(True, has_md, ctx.cudagraph_runtime_mode == CUDAGraphMode.PIECEWISE)


def graph_mode_problem() -> str | None:
    """Why the configured CUDA graph mode cannot run a persistent megakernel, or None.

    FULL graphs (FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE) capture the whole launch; no graph
    at all (NONE, eager) launches it directly. A PIECEWISE-only mode splits the forward at
    attention and would cut the persistent launch in pieces.
    """
    from vllm.config import CUDAGraphMode, get_current_vllm_config_or_none

    cfg = get_current_vllm_config_or_none()
    if cfg is None:
        return None
    mode = cfg.compilation_config.cudagraph_mode
    if mode is None or mode == CUDAGraphMode.NONE or mode.has_full_cudagraphs():
        return None
    return f"cudagraph_mode {mode.name}: PIECEWISE graphs would cut the persistent launch"


def tp_group() -> TPGroup:
    """vLLM's tensor-parallel group of this process."""
    from vllm.distributed import parallel_state as ps

    from mono_aot.runtime.runner import TPGroup

    try:
        group = ps.get_tp_group()
    except AssertionError as e:  # vLLM asserts the group exists
        raise MonoUnsupported(f"vLLM's tensor-parallel group is not initialised ({e})") from None
    return TPGroup(group.world_size, group.rank_in_group, group.cpu_group)


def capturing() -> bool:
    """A CUDA/HIP graph capture is in progress on the current stream (never on a CPU torch)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def attention_context(layer_name: str) -> AttentionContext:
    """The draft step's block table, sequence lengths and slots from vLLM's forward context
    (``get_attention_context``), as the user's runner reads them."""
    from vllm.model_executor.layers.attention.attention import get_attention_context

    from mono_aot.runtime.runner import AttentionContext

    md, _, _, slots = get_attention_context(layer_name)
    if md is None:
        raise MonoUnsupported(f"no attention metadata for {layer_name}")
    for name in ("block_table", "seq_lens"):
        if getattr(md, name, None) is None:
            raise MonoUnsupported(
                f"the attention metadata of {layer_name} ({type(md).__name__}) has no {name}"
            )
    return AttentionContext(block_table=md.block_table, seq_lens=md.seq_lens, slots=slots)


def current_stream() -> Any:
    """The stream vLLM launches on (torch's current stream), or None without a GPU."""
    import torch

    return torch.cuda.current_stream() if torch.cuda.is_available() else None


def gather(obj: Any, group: Any) -> list[Any]:
    """Every TP rank's ``obj``, over the TP group's CPU (gloo) group."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out
