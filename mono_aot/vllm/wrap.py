"""The hook on a model: ``accelerate`` (an instance) and ``accelerated`` (a class)."""

from __future__ import annotations

import inspect
import types
from typing import Any, TypeVar

T = TypeVar("T")


def _backbone_of(model: Any) -> Any:
    """The module with ``layers`` and ``norm``: the model itself, or its ``.model`` (a
    ForCausalLM-style wrapper). Its ``_rope_cos_sin_cache`` is not asked for here: vLLM sets it
    only after weight loading (``DFlashQwen3Model._build_fused_kv_buffers``), and the runner,
    built once the caches are bound, checks it."""
    for cand in (model, getattr(model, "model", None)):
        if cand is not None and all(hasattr(cand, a) for a in ("layers", "norm")):
            return cand
    raise TypeError(
        f"{type(model).__name__}: neither it nor its .model has layers and norm "
        "(the draft backbone the kernels replace)"
    )


def accelerate(model: T, layout: Any = None) -> T:
    """Route ``model``'s draft backbone forward through the prebuilt kernels when eligible.

    Idempotent. With ``MONO_AOT_DISABLE=1`` the model is returned untouched. The backbone's
    ``forward(positions, inputs_embeds, ...)`` must return the final norm's output.
    """
    from mono_aot.vllm.hook import DISABLE_ENV, DrafterHook, env_flag

    if env_flag(DISABLE_ENV):
        return model
    backbone = _backbone_of(model)
    if getattr(backbone, "_mono_aot_hook", None) is not None:
        return model
    cls_forward = getattr(type(backbone), "_mono_aot_stock_forward", None)
    if cls_forward is not None:  # an @accelerated backbone class: its parent's forward
        stock = types.MethodType(cls_forward, backbone)
        hook = DrafterHook(backbone, stock, layout)
        backbone._mono_aot_hook = hook  # the class's forward calls it
    else:
        hook = DrafterHook(backbone, backbone.forward, layout)
        backbone._mono_aot_hook = hook
        backbone.forward = hook  # nn.Module.__call__ finds the instance attribute
    return model


def accelerated(cls: type[T]) -> type[T]:
    """A subclass of ``cls`` whose instances are ``accelerate``d when constructed (the class
    decorator form; ``register()`` applies it to the registered class)."""
    if getattr(cls, "_mono_aot_wrapped", None) is not None:
        return cls
    parent_forward = cls.forward  # type: ignore[attr-defined]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, *args, **kwargs)  # type: ignore[misc]
        accelerate(self)

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        hook = self.__dict__.get("_mono_aot_hook")
        if hook is None:  # not the backbone itself (a wrapper: its .model carries the hook)
            return parent_forward(self, *args, **kwargs)
        return hook(*args, **kwargs)

    ns = {
        "__init__": __init__,
        "forward": forward,
        "_mono_aot_wrapped": cls,
        "_mono_aot_stock_forward": parent_forward,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
    }
    sub = type(cls.__name__, (cls,), ns)
    # forward's signature, so vLLM and torch.compile see the parent's parameters
    sub.forward.__signature__ = inspect.signature(parent_forward)
    return sub  # type: ignore[return-value]
