"""When a draft forward runs on the prebuilt kernels, and when on the model's own forward.

Every decision is taken from state all TP ranks share (the forward context, the graph mode, the
TP size, capture state, outcomes gathered over the TP CPU group), so no rank ever launches alone:
a rank that launched without its peers would wait for them until the kernels' bound.
"""

from __future__ import annotations

import inspect
import logging
import os
import weakref
from typing import Any

import torch

from mono_aot.spec.errors import BadInput, MonoError, MonoUnsupported
from mono_aot.vllm import adapter, ops

log = logging.getLogger("vllm.mono_aot")

DISABLE_ENV = "MONO_AOT_DISABLE"
STRICT_ENV = "MONO_AOT_STRICT"
LAYOUT_ENV = "MONO_AOT_LAYOUT"

# What a forward did (``DrafterHook.last``), for logs and tests.
RUN = "kernels"
STOCK_NO_CONTEXT = "stock: no vLLM forward context"
STOCK_NO_METADATA = "stock: no attention metadata (profiling or a dummy run)"
STOCK_PIECEWISE = "stock: a PIECEWISE graph forward"
STOCK_CAPTURE = "stock: graph capture before the runner exists"
STOCK_NOT_BOUND = "stock: draft KV caches not bound on every rank yet"
STOCK_OFF = "stock: mono-aot is off"


def env_flag(name: str, env: dict[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get(name, "") not in ("", "0")


def _caches_bound(backbone: Any) -> bool:
    for layer in backbone.layers:
        kv = getattr(layer.self_attn.attn, "kv_cache", None)
        if isinstance(kv, list | tuple):
            kv = kv[0] if kv else None
        if not isinstance(kv, torch.Tensor) or kv.numel() == 0:
            return False
    return True


class DrafterHook:
    """Replaces a draft backbone's forward: the prebuilt kernels when eligible, else the
    backbone's own forward. ``last`` says what the latest forward did; ``off_reason`` why the
    hook turned itself off (then for good, on every rank)."""

    def __init__(self, backbone: Any, stock: Any, layout: Any = None) -> None:
        self._backbone = weakref.ref(backbone)
        # the backbone's own forward, held weakly: the hook lives in the op's table, and a
        # strong reference to the backbone there would keep the model (and its runner) alive
        self._stock = weakref.WeakMethod(stock) if inspect.ismethod(stock) else (lambda: stock)
        self._signature = inspect.signature(stock)
        self.layout = layout
        self.runner: Any = None
        self.off_reason: str | None = None
        self.last: str | None = None
        self.builds = 0
        self.handle = ops.register_hook(self)
        weakref.finalize(backbone, self._release, self.handle)

    # ---- the forward ----

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        positions, embeds = self._inputs(args, kwargs)
        self.last = self._decide(embeds)
        if self.last == RUN:
            try:
                return torch.ops.mono_aot.drafter_step(positions, embeds, self.handle)
            except (MonoUnsupported, BadInput) as e:
                # a later check (the step's inputs, its metadata): shared by every rank, so
                # every rank turns off here alike, before any launched
                self.last = self._turn_off(f"at launch: {e}")
        return self._stock()(*args, **kwargs)

    def _inputs(self, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        bound = self._signature.bind(*args, **kwargs)
        return bound.arguments.get("positions"), bound.arguments.get("inputs_embeds")

    def run_kernels(self, positions: torch.Tensor, inputs_embeds: torch.Tensor) -> torch.Tensor:
        """The custom op's body: the runner's step on the current stream."""
        runner = self.runner
        if runner is None:
            raise MonoError("mono-aot: the drafter op ran without a runner (a hook bug)")
        ctx = adapter.attention_context(runner.layer_names[0])
        return runner.forward(positions, inputs_embeds, ctx, stream=adapter.current_stream())

    # ---- the decision ----

    @torch.compiler.disable
    def _decide(self, embeds: Any) -> str:
        if self.off_reason is not None:
            return STOCK_OFF
        if embeds is None:
            return self._turn_off("the backbone was called without inputs_embeds")
        state = adapter.forward_state()
        if not state.has_context:
            return STOCK_NO_CONTEXT
        problem = adapter.graph_mode_problem()
        if problem:
            return self._turn_off(problem)
        try:
            tp = adapter.tp_group()
            layout = self._layout()
        except MonoUnsupported as e:
            return self._turn_off(str(e))
        if tp.world_size != layout.parallel.tp:
            return self._turn_off(
                f"TP {tp.world_size}: the kernels are built for TP {layout.parallel.tp}"
            )
        if not state.has_metadata:
            return STOCK_NO_METADATA
        if state.piecewise:
            return STOCK_PIECEWISE
        capturing = adapter.capturing()
        if self.runner is not None:
            if not self.runner.stale():
                return RUN
            if capturing:  # re-bound caches mid-capture: cannot rebuild here
                return self._turn_off("the draft KV caches moved during a graph capture")
            self._close_runner()
        if capturing:
            return STOCK_CAPTURE
        bound = adapter.gather(_caches_bound(self._backbone()), tp.cpu_group)
        if not all(bound):
            return STOCK_NOT_BOUND
        return self._build(tp, layout)

    def _layout(self) -> Any:
        if self.layout is None:
            from mono_aot.spec.layouts import resolve_layout, shipped_layout_paths

            name = os.environ.get(LAYOUT_ENV)
            if not name:
                shipped = [p.stem for p in shipped_layout_paths()]
                if len(shipped) != 1:
                    raise MonoUnsupported(
                        f"set {LAYOUT_ENV} to one of the shipped layouts ({', '.join(shipped)}) "
                        "or a spec path"
                    )
                name = shipped[0]
            try:
                self.layout = resolve_layout(name)
            except MonoError as e:
                raise MonoUnsupported(f"{LAYOUT_ENV}: {e}") from None
        return self.layout

    def _build(self, tp: Any, layout: Any) -> str:
        """Construct the runner on every rank at once (collective, all-or-nothing)."""
        from mono_aot.runtime.runner import DrafterRunner

        try:
            self.runner = DrafterRunner(
                self._backbone(), layout, tp=tp, attention_context=adapter.attention_context
            )
        except MonoUnsupported as e:
            return self._turn_off(str(e))
        self.builds += 1
        log.info(
            "mono-aot: drafter kernels bound on rank %d (layout %s, build %d)",
            tp.rank,
            layout.name,
            self.builds,
        )
        return RUN

    def _turn_off(self, reason: str) -> str:
        self.off_reason = reason
        self._close_runner()
        if env_flag(STRICT_ENV):
            raise MonoUnsupported(f"{STRICT_ENV}=1 and the drafter kernels cannot serve: {reason}")
        log.warning("mono-aot: drafter kernels off, vLLM's own forward serves: %s", reason)
        return STOCK_OFF

    def _close_runner(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.close()

    @staticmethod
    def _release(handle: int) -> None:
        hook = ops._HOOKS.get(handle)
        if hook is not None:
            hook._close_runner()
        ops.unregister_hook(handle)
