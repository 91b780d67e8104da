"""What each selftest rank process runs (through ``mono_aot.selftest.cluster``): a draft model
with vLLM's attribute paths holding the reference problem's weights on this rank's GPU, the
runtime's ``DrafterRunner`` over it (stored code objects through the loader, peer buffers over
HIP IPC exchanged on the cluster's gloo group), and one step at a time, launched by
``runner.forward`` exactly as vLLM would, then read back for the parent to judge.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from types import SimpleNamespace as NS
from typing import TYPE_CHECKING, Any

from mono_aot.selftest.cluster import RankContext

if TYPE_CHECKING:
    import torch

    from mono_aot.spec.layouts import Layout

# (projection attribute path, packed name) under a draft layer
_PROJ = {
    "qkv": ("self_attn", "qkv_proj"),
    "o": ("self_attn", "o_proj"),
    "gu": ("mlp", "gate_up_proj"),
    "d": ("mlp", "down_proj"),
}


def draft_model(
    weights: dict[str, Any],
    caches: list[torch.Tensor],
    cos_sin: torch.Tensor,
) -> NS:
    """A ``MiniMaxM3DSparkModel`` as the runner sees it (vLLM's attribute paths), holding one
    rank's packed reference weights (``mono_aot.reference.RankWeights`` fields as a dict),
    its per-layer KV caches and the rope cache. Views, not copies."""
    packed, norms = weights["packed"], weights["norms"]
    layers = []
    for i, kv in enumerate(caches):

        def proj(name: str, i: int = i) -> NS:
            return NS(weight=packed[f"{name}_w"][i], weight_scale=packed[f"{name}_s"][i])

        def norm(name: str, i: int = i) -> NS:
            return NS(weight=norms[name][i])

        attn = NS(
            kv_cache=[kv],
            layer_name=f"model.layers.{i}.self_attn.attn",
            _k_scale=weights["k_scale"][i : i + 1],
            _v_scale=weights["v_scale"][i : i + 1],
        )
        layers.append(
            NS(
                input_layernorm=norm("w_in"),
                post_attention_layernorm=norm("w_post"),
                self_attn=NS(
                    q_norm=norm("w_q"),
                    k_norm=norm("w_k"),
                    qkv_proj=proj("qkv"),
                    o_proj=proj("o"),
                    attn=attn,
                ),
                mlp=NS(gate_up_proj=proj("gu"), down_proj=proj("d")),
            )
        )
    return NS(
        layers=layers,
        norm=NS(weight=weights["final_norm"]),
        _rope_cos_sin_cache=cos_sin,
    )


def init_rank(ctx: RankContext, msg: dict[str, Any]) -> dict[str, Any]:
    """Load this rank's weights onto its GPU and build the runner(s): ``msg`` holds the
    ``device``, the ``layout`` (and ``short``, the dead-rank layout, or None), the ``weights``
    file, ``blocks`` per KV cache, the ``rope`` cache file and the fp8 ``nan_code``."""
    import torch

    from mono_aot.runtime.runner import DrafterRunner, TPGroup

    torch.cuda.set_device(msg["device"])
    dev = torch.device("cuda", msg["device"])
    lay: Layout = msg["layout"]
    w = torch.load(msg["weights"], weights_only=True)
    weights = {
        "packed": {k: t.to(dev) for k, t in w["packed"].items()},
        "norms": {k: t.to(dev) for k, t in w["norms"].items()},
        **{k: w[k].to(dev) for k in ("k_scale", "v_scale", "final_norm")},
    }
    shape = (msg["blocks"], lay.kv_heads_per_rank, lay.serving.kv_block, lay.kv_entry_bytes)
    caches = [
        torch.full(shape, msg["nan_code"], dtype=torch.uint8, device=dev)
        for _ in range(lay.model.layers)
    ]
    cos_sin = torch.load(msg["rope"], weights_only=True).to(dev)
    model = draft_model(weights, caches, cos_sin)
    tp = TPGroup(ctx.world, ctx.rank, ctx.group)
    env = dict(os.environ)
    runners = {"normal": DrafterRunner(model, lay, tp=tp, env=env)}
    if msg.get("short") is not None:
        runners["short"] = DrafterRunner(model, msg["short"], tp=tp, env=env)
    ctx.state.update(runners=runners, caches=caches, nan_code=msg["nan_code"], device=dev)
    return {
        "rank": ctx.rank,
        "kernels": {
            f"{name}/{v}": f.entry.key
            for name, r in runners.items()
            for v, f in r.launchers.items()
        },
    }


def run_step(ctx: RankContext, msg: dict[str, Any]) -> dict[str, Any]:
    """One step on this rank: the case's caches into the model's, a NaN-poisoned output,
    ``runner.forward`` right after a gloo barrier (all ranks launch within milliseconds, far
    inside the wait bound), optionally captured in a graph and replayed; the results back.

    ``msg``: ``case`` (the step's inputs file), ``caches`` (this rank's pre-step caches file),
    ``runner`` (``normal`` or ``short``), ``launch`` (False: this rank plays dead),
    ``set_step`` / ``reset_health`` (host-side resets), ``replays``.
    """
    import torch
    import torch.distributed as dist

    st = ctx.state
    runner = st["runners"][msg.get("runner", "normal")]
    case = torch.load(msg["case"], weights_only=True)
    pre = torch.load(msg["caches"], weights_only=True)
    step = stage_step(runner, st["caches"], st["nan_code"], case, pre, st["device"], msg)
    replays = int(msg.get("replays", 0))
    result: dict[str, Any] = {"rank": ctx.rank}
    torch.cuda.synchronize()
    dist.barrier(group=ctx.group)
    t0 = time.perf_counter()
    if msg.get("launch", True):
        step.run()
        if replays:
            torch.cuda.synchronize()
            result["health_before_replay"] = runner.health.cpu().tolist()
            result["out_before_replay"] = step.out.cpu()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step.run()
            dist.barrier(group=ctx.group)  # every rank captured before any replays
            for _ in range(replays):
                graph.replay()
        torch.cuda.synchronize()
    result["seconds"] = time.perf_counter() - t0
    return {**result, **step.result(st["caches"], st["nan_code"])}


@dataclass
class StagedStep:
    """One rank's step, staged: the runner, its inputs on the device, the poisoned output."""

    runner: Any
    x: torch.Tensor
    positions: torch.Tensor
    context: Any
    out: torch.Tensor
    blocks: int

    def run(self) -> None:
        self.runner.forward(self.positions, self.x, self.context, out=self.out)

    def result(self, caches: list[torch.Tensor], nan_code: int) -> dict[str, Any]:
        """What the parent judges (``mono_aot.selftest.cases.judge``), on the CPU."""
        b = self.blocks
        return {
            "chunks": self.runner.chunks(self.x.shape[0] // self.runner.layout.serving.qpr),
            "out": self.out.cpu(),
            "caches": [kv[:b].cpu() for kv in caches],
            "outside_bad": sum(int((kv[b:] != nan_code).sum()) for kv in caches),
            "health": self.runner.health.cpu().tolist(),
            "step": int(self.runner.step.item()),
        }


def stage_step(
    runner: Any,
    caches: list[torch.Tensor],
    nan_code: int,
    case: dict[str, Any],
    pre: list[torch.Tensor],
    dev: torch.device,
    msg: dict[str, Any],
) -> StagedStep:
    """The case's caches into the model's (NaN codes past them), its inputs onto ``dev``, a
    NaN-poisoned output, and the host-side resets ``msg`` asks for (``set_step``,
    ``reset_health``). Shared by the GPU ranks and the emulated ones
    (``mono_aot.selftest.emulated``)."""
    import torch

    from mono_aot.runtime.runner import AttentionContext

    blocks = pre[0].shape[0]
    for kv, c in zip(caches, pre, strict=True):
        kv[:blocks].copy_(c)
        kv[blocks:].fill_(nan_code)
    x = case["x"].to(dev)
    base = case["bt_base"].to(dev)
    bt = base.as_strided(case["bt_shape"], case["bt_stride"], case["bt_offset"])
    context = AttentionContext(
        block_table=bt, seq_lens=case["seq_lens"].to(dev), slots=case["slots"].to(dev)
    )
    out = torch.full(tuple(x.shape), float("nan"), dtype=torch.bfloat16, device=dev)
    if msg.get("set_step") is not None:
        runner.step.fill_(int(msg["set_step"]))
    if msg.get("reset_health"):
        runner.health.zero_()
    return StagedStep(runner, x, case["positions"].to(dev), context, out, blocks)


def close_rank(ctx: RankContext, _: Any) -> None:
    """Release the peer buffers (collective-free) before the process leaves."""
    for r in ctx.state.get("runners", {}).values():
        r.close()
    ctx.state.clear()


# ---------------------------------------------------------------- the late-dispatch check


def _load_step(ctx: RankContext, msg: dict[str, Any]) -> dict[str, Any]:
    """The case's inputs on this rank's GPU, its pre-step caches copied into the model's (every
    block past the problem's NaN codes) and a NaN-poisoned ``out``."""
    import torch

    from mono_aot.runtime.runner import AttentionContext

    st = ctx.state
    dev = st["device"]
    case = torch.load(msg["case"], weights_only=True)
    pre = torch.load(msg["caches"], weights_only=True)
    blocks = pre[0].shape[0]
    for kv, c in zip(st["caches"], pre, strict=True):
        kv[:blocks].copy_(c)
        kv[blocks:].fill_(st["nan_code"])
    x = case["x"].to(dev)
    base = case["bt_base"].to(dev)
    bt = base.as_strided(case["bt_shape"], case["bt_stride"], case["bt_offset"])
    n = x.shape[0]
    return {
        "x": x,
        "positions": case["positions"].to(dev),
        "context": AttentionContext(
            block_table=bt, seq_lens=case["seq_lens"].to(dev), slots=case["slots"].to(dev)
        ),
        "out": torch.full((n, x.shape[1]), float("nan"), dtype=torch.bfloat16, device=dev),
        "blocks": blocks,
    }


def _results(ctx: RankContext, runner: Any, out: torch.Tensor, blocks: int) -> dict[str, Any]:
    """What the parent judges: ``out``, the problem's cache blocks, the bytes changed past
    them, the health words and the step counter (after ``torch.cuda.synchronize``)."""
    st = ctx.state
    return {
        "out": out.cpu(),
        "caches": [kv[:blocks].cpu() for kv in st["caches"]],
        "outside_bad": sum(int((kv[blocks:] != st["nan_code"]).sum()) for kv in st["caches"]),
        "health": runner.health.cpu().tolist(),
        "step": int(runner.step.item()),
    }


def runner_state(ctx: RankContext, msg: dict[str, Any]) -> dict[str, Any]:
    """``step`` and ``health`` of the runner ``msg["runner"]`` on this rank."""
    runner = ctx.state["runners"][msg.get("runner", "normal")]
    return {
        "rank": ctx.rank,
        "step": int(runner.step.item()),
        "health": runner.health.cpu().tolist(),
    }


def run_late_dispatch(ctx: RankContext, msg: dict[str, Any]) -> dict[str, Any]:
    """Two launches of one step (one launch: a single chunk) on the same scratch.

    The first runs on a stream whose CU mask (``cases.late_mask``, from the kernel's
    workgroups per CU as HIP reports them) enables a quarter of the CUs or fewer: the
    workgroups that find a CU wait at the first grid barrier for the others, which the
    hardware dispatches only once those gave up, past the wait bound. Then the host reads
    and clears ``health`` (the only host action: ``step`` is left to the runner), re-poisons
    ``out``, and the second launch runs on torch's current stream with every CU.

    ``msg``: ``case``, ``caches``, ``runner``, and ``set_step``: a step no launch of this
    runner used yet, set (with health cleared) before the first launch so the ranks start in
    line whatever ran before.
    """
    import torch
    import torch.distributed as dist

    from mono_aot.selftest.cases import late_mask

    runner = ctx.state["runners"][msg.get("runner", "normal")]
    c = _load_step(ctx, msg)
    x, positions, context, out = c["x"], c["positions"], c["context"], c["out"]
    chunks = runner.chunks(x.shape[0] // runner.layout.serving.qpr)
    if len(chunks) != 1:
        raise ValueError(f"the late-dispatch step must be one launch; the runner makes {chunks}")
    launcher = runner.launchers[chunks[0][2]]
    hip = launcher.device.hip
    per_cu = hip.occupancy(
        launcher.function, launcher.block, launcher.dynamic_lds, "late-dispatch kernel"
    )
    enabled, mask = late_mask(launcher.grid, per_cu)
    runner.step.fill_(int(msg["set_step"]))
    runner.health.zero_()
    first: dict[str, Any] = {"mask_cus": enabled, "per_cu": per_cu, "step": int(msg["set_step"])}
    pre = [kv[: c["blocks"]].clone() for kv in ctx.state["caches"]]
    handle = hip.stream_create_with_cu_mask(mask)
    try:
        masked = torch.cuda.ExternalStream(handle, device=ctx.state["device"])
        torch.cuda.synchronize()
        dist.barrier(group=ctx.group)
        t0 = time.perf_counter()
        # the masked stream is torch's current one too, so the runner's step increment is
        # ordered after the launch on it
        with torch.cuda.stream(masked):
            runner.forward(positions, x, context, out=out, stream=masked)
        torch.cuda.synchronize()
        first["seconds"] = time.perf_counter() - t0
    finally:
        torch.cuda.synchronize()
        hip.stream_destroy(handle)
    first["health"] = runner.health.cpu().tolist()
    first["out_written"] = int((~torch.isnan(out)).sum())
    first["kv_changed"] = sum(
        int((kv[: c["blocks"]] != p).sum()) for kv, p in zip(ctx.state["caches"], pre, strict=True)
    )
    runner.health.zero_()
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    dist.barrier(group=ctx.group)
    t0 = time.perf_counter()
    runner.forward(positions, x, context, out=out)
    torch.cuda.synchronize()
    result = {"rank": ctx.rank, "first": first, "seconds": time.perf_counter() - t0}
    result.update(_results(ctx, runner, out, c["blocks"]))
    return result
