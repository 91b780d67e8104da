"""Lazily registered model classes, wrapped: vLLM imports ``mono_aot.vllm.wrapped:<name>`` where
``<name>`` encodes the user's ``module:Class``, and gets the ``accelerated`` subclass, so a lazy
registration stays lazy (vLLM's registry imports it only when the model is used)."""

from __future__ import annotations

import importlib
from typing import Any

_PREFIX = "Accelerated_"
_CACHE: dict[str, type] = {}


def lazy_name(module: str, cls: str) -> str:
    return _PREFIX + f"{module}:{cls}".encode().hex()


def __getattr__(name: str) -> Any:
    if not name.startswith(_PREFIX):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _CACHE:
        try:
            module, _, cls = bytes.fromhex(name[len(_PREFIX) :]).decode().partition(":")
        except ValueError:
            raise AttributeError(f"{name!r} does not name a wrapped class") from None
        from mono_aot.vllm.wrap import accelerated

        _CACHE[name] = accelerated(getattr(importlib.import_module(module), cls))
    return _CACHE[name]
