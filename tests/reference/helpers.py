"""Small layouts for the reference tests (the shipped geometry is too big for most of them)."""

from __future__ import annotations

import copy
from typing import Any

from mono_aot.spec.layouts import Layout, parse_layout, resolve_layout

SMALL: dict[str, Any] = {
    "name": "small",
    "model": {
        "layers": 2,
        "hidden": 256,
        "heads": 8,
        "kv_heads": 4,
        "head_dim": 32,
        "rotary_dim": 16,
        "mlp": 512,
        "norm_eps": 1e-6,
        "swiglu_alpha": 1.702,
        # small, so the clamps of the SwiGLU are active for many of the unit-scale activations
        "swiglu_limit": 1.0,
    },
    "parallel": {"tp": 4},
    "serving": {
        "kv_block": 8,
        "qpr": 4,
        "max_reqs": 16,
        "chunk_reqs": 8,
        "wide_base": 3,
        "peer_wait_s": 1.0,
    },
    "kernel": {"threads": 256},
    "targets": {"gfx942": {"ctas": 304}, "gfx950": {"ctas": 256}},
}


def small_layout(**sections: dict[str, Any]) -> Layout:
    """The small layout, with ``section={key: value}`` overrides (e.g. ``model={"layers": 1}``)."""
    doc = copy.deepcopy(SMALL)
    for section, values in sections.items():
        doc.setdefault(section, {}).update(values)
    return parse_layout(doc, "tests/reference/helpers.py")


def shipped_one_layer() -> Layout:
    """The shipped geometry with a single layer (per-rank shapes exactly the shipped ones)."""
    shipped = resolve_layout("minimax-m3.1-dspark-tp4")
    doc = shipped.model_dump()
    doc["model"]["layers"] = 1
    doc["name"] = "shipped-one-layer"
    return parse_layout(doc, "tests/reference/helpers.py")


def real_geometry_one_layer() -> Layout:
    """The MiniMax-M3.1 DSpark drafter's geometry as vLLM 0.34 serves it (QPR 7, KV blocks of
    128, a 4096-position window, MXFP8 weights in blocks of 32, at most 10 requests), with a
    single layer. A mapping in memory: no kernel is built for it yet (``kernel_problems``)."""
    doc = resolve_layout("minimax-m3.1-dspark-tp4").model_dump()
    doc["model"].update(layers=1, window=4096)
    doc["serving"].update(qpr=7, kv_block=128, max_reqs=10, chunk_reqs=8)
    doc["weights"] = {"format": "mxfp8", "block": 32}
    doc["name"] = "real-geometry-one-layer"
    return parse_layout(doc, "tests/reference/helpers.py")
