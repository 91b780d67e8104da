"""The drafter step as a torch custom op: torch.compile treats it as opaque (its fake returns the
output's shape), and a CUDA graph captures the kernel launches it makes."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch

_HOOKS: dict[int, Any] = {}
_IDS = itertools.count(1)
_LOCK = threading.Lock()


def register_hook(hook: Any) -> int:
    """A handle the op finds ``hook`` by (an int: custom ops take no Python objects)."""
    with _LOCK:
        handle = next(_IDS)
        _HOOKS[handle] = hook
    return handle


def unregister_hook(handle: int) -> None:
    with _LOCK:
        _HOOKS.pop(handle, None)


@torch.library.custom_op("mono_aot::drafter_step", mutates_args=())
def drafter_step(positions: torch.Tensor, inputs_embeds: torch.Tensor, handle: int) -> torch.Tensor:
    """The layers and final norm of a draft step through the hook's runner (the kernels also
    write the draft KV caches, which vLLM reads only through later attention launches)."""
    return _HOOKS[handle].run_kernels(positions, inputs_embeds)


@drafter_step.register_fake
def _(positions: torch.Tensor, inputs_embeds: torch.Tensor, handle: int) -> torch.Tensor:
    return torch.empty_like(inputs_embeds)
