"""The plugin through vLLM's own loader and registry, each case in a fresh interpreter (vLLM
loads general plugins once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

ARCH = "MiniMaxM3DSparkModel"


# vLLM configures its loggers in each engine and worker process it starts, not on import: do
# as it does, so the plugin's line goes through vLLM's own "vllm" handler
PRELUDE = """
import json, logging
from vllm.logger import _configure_vllm_root_logger
_configure_vllm_root_logger()
"""


def _run(body: str, **env: str) -> tuple[dict, str]:
    """Run ``body`` (which sets ``out``) in a fresh interpreter; (out, its stderr+stdout)."""
    code = PRELUDE + textwrap.dedent(body) + "\nprint('OUT=' + json.dumps(out))\n"
    full = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", **env}
    full.pop("MONO_AOT_DISABLE", None) if "MONO_AOT_DISABLE" not in env else None
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=full
    )
    text = p.stdout + p.stderr
    assert p.returncode == 0, text
    [line] = [x for x in p.stdout.splitlines() if x.startswith("OUT=")]
    return json.loads(line[4:]), text


REGISTER_THEN_LOAD = """
from vllm import ModelRegistry
from vllm.plugins import load_general_plugins
from tests.vllm.draft_model import DraftBackbone
ModelRegistry.register_model("MiniMaxM3DSparkModel", {target})
load_general_plugins()
{again}
cls = ModelRegistry._try_load_model_cls("MiniMaxM3DSparkModel")
out = {{"wrapped": getattr(cls, "_mono_aot_wrapped", None) is not None,
        "parent": getattr(getattr(cls, "_mono_aot_wrapped", None), "__name__", None),
        "entry": type(ModelRegistry.models["MiniMaxM3DSparkModel"]).__name__}}
"""


AGAIN = (
    "import mono_aot.vllm as plugin\nplugin.register()  # again: re-entrant, wraps nothing twice"
)


def test_vllms_loader_wraps_a_class_registered_before_the_plugin_and_logs_once():
    out, text = _run(REGISTER_THEN_LOAD.format(target="DraftBackbone", again=AGAIN))
    assert out == {"wrapped": True, "parent": "DraftBackbone", "entry": "_RegisteredModel"}
    said = [x for x in text.splitlines() if "mono-aot: wrapped" in x]
    assert len(said) == 1 and "tests.vllm.draft_model.DraftBackbone" in said[0], text


def test_a_lazy_registration_stays_lazy_and_resolves_to_the_wrapped_class():
    out, text = _run(
        REGISTER_THEN_LOAD.format(target='"tests.vllm.draft_model:DraftBackbone"', again="")
    )
    assert out == {"wrapped": True, "parent": "DraftBackbone", "entry": "_LazyRegisteredModel"}
    assert "loaded lazily" in text


def test_vllm_plugins_allow_list_and_mono_aot_disable_leave_the_class_alone():
    out, _ = _run(REGISTER_THEN_LOAD.format(target="DraftBackbone", again=""), VLLM_PLUGINS="")
    assert out["wrapped"] is False
    out, text = _run(
        REGISTER_THEN_LOAD.format(target="DraftBackbone", again=""), MONO_AOT_DISABLE="1"
    )
    assert out["wrapped"] is False and "MONO_AOT_DISABLE=1" in text


def test_register_never_raises():
    body = """
    from vllm import ModelRegistry
    ModelRegistry.models = None  # a registry mono-aot cannot read
    import mono_aot.vllm as plugin
    plugin.register()
    out = {"survived": True}
    """
    out, text = _run(body)
    assert out == {"survived": True} and "mono-aot: plugin not active" in text


def test_the_drafter_op_is_one_opaque_node_under_torch_compile():
    body = """
    import torch
    import mono_aot.vllm.ops as ops

    class Runner:  # what the op calls: the hook's runner step (here: its output shape)
        def run_kernels(self, positions, embeds):
            return embeds * 2

    handle = ops.register_hook(Runner())
    graphs = []

    def backend(gm, example_inputs):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm

    f = torch.compile(lambda p, e: torch.ops.mono_aot.drafter_step(p, e, handle) + 1,
                      backend=backend, fullgraph=True)
    e = torch.ones(8, 6144, dtype=torch.bfloat16)
    y = f(torch.arange(8), e)
    out = {"graphs": graphs, "value": float(y[0, 0])}
    """
    out, _ = _run(body)
    [calls] = out["graphs"]
    assert calls == ["mono_aot.drafter_step", "<built-in function add>"], calls
    assert out["value"] == 3.0


def test_a_backbone_is_accelerated_before_weight_loading_sets_its_rope_cache():
    """vLLM's DSpark backbone gets ``_rope_cos_sin_cache`` only after weight loading, so
    construction must not ask for it (the runner checks it when it is built)."""
    from torch import nn

    from mono_aot.vllm import accelerate

    class Backbone(nn.Module):  # what the backbone has before weight loading
        def __init__(self) -> None:
            super().__init__()
            self.layers, self.norm = nn.ModuleList(), nn.Identity()

        def forward(self, positions, inputs_embeds):
            return inputs_embeds

    backbone = Backbone()
    accelerate(backbone)
    assert backbone.forward is backbone._mono_aot_hook
