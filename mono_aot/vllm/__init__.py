"""vLLM integration: the draft backbone of ``MiniMaxM3DSparkModel`` on the prebuilt kernels.

The only package that imports vLLM (lazily: importing this one does not). The entry point
``mono_aot = "mono_aot.vllm:register"`` in ``vllm.general_plugins`` makes vLLM call
``register()`` in every process it starts. Users who construct the model themselves call
``accelerate(model)`` or decorate their class with ``@accelerated``. Followed: vLLM 0.34.0
(README, "vLLM").
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from mono_aot.vllm.wrap import accelerate, accelerated

ARCH = "MiniMaxM3DSparkModel"
log = logging.getLogger("vllm.mono_aot")

_LOCK = threading.Lock()
_REGISTERED = False


def _wrap_registered(registry: Any) -> str:
    """Wrap what ``registry`` holds for ARCH now; what was done, as text."""
    from mono_aot.vllm import wrapped

    entry = registry.models.get(ARCH)
    if entry is None:
        return f"no {ARCH} registered yet: it is wrapped when registered"
    model_cls = getattr(entry, "model_cls", None)
    if model_cls is not None:  # registered as a class
        if getattr(model_cls, "_mono_aot_wrapped", None) is not None:
            return f"{ARCH} ({model_cls.__module__}.{model_cls.__qualname__}) already wrapped"
        _original_register(registry)(ARCH, accelerated(model_cls))
        return f"wrapped {ARCH} ({model_cls.__module__}.{model_cls.__qualname__})"
    module, name = getattr(entry, "module_name", None), getattr(entry, "class_name", None)
    if module is None or name is None:
        return f"{ARCH} is registered as {type(entry).__name__}, which mono-aot cannot wrap"
    if module == wrapped.__name__:
        return f"{ARCH} ({module}:{name}) already wrapped"
    _original_register(registry)(ARCH, f"{wrapped.__name__}:{wrapped.lazy_name(module, name)}")
    return f"wrapped {ARCH} ({module}:{name}, loaded lazily)"


def _original_register(registry: Any) -> Any:
    return registry.__dict__.get("_mono_aot_register_model") or registry.register_model


def _hook_registrations(registry: Any) -> None:
    """Later registrations of ARCH (a user's plugin loaded after this one) are wrapped too."""
    if "_mono_aot_register_model" in registry.__dict__:
        return
    original = registry.register_model

    def register_model(model_arch: str, model_cls: Any) -> None:
        original(model_arch, model_cls)
        if model_arch == ARCH:
            log.info("mono-aot: %s", _wrap_registered(registry))

    registry._mono_aot_register_model = original
    registry.register_model = register_model


def register() -> None:
    """vLLM's general-plugin entry point: re-entrant, never raises, logs one line."""
    global _REGISTERED
    try:
        from mono_aot.vllm.hook import DISABLE_ENV, env_flag

        with _LOCK:
            if env_flag(DISABLE_ENV):
                log.info("mono-aot: %s=1: the drafter kernels are disabled", DISABLE_ENV)
                return
            from vllm import ModelRegistry

            first = not _REGISTERED
            _hook_registrations(ModelRegistry)
            said = _wrap_registered(ModelRegistry)
            _REGISTERED = True
            (log.info if first else log.debug)("mono-aot: %s", said)
    except Exception as e:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        log.warning("mono-aot: plugin not active: %s: %s", type(e).__name__, e)


__all__ = ["ARCH", "accelerate", "accelerated", "register"]
