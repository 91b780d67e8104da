"""The shipped layout holds vLLM's own values for the MiniMax-M3.1 DSpark drafter.

Read from the installed vLLM's source (``vllm/models/minimax_m3/amd/mono/drafter/layout.py``,
the constants of its in-tree drafter kernels) by parsing it, never from a copy: importing the
module would run vLLM's model package, which needs a GPU stack. ``make test-vllm`` pins vLLM
0.34.0, the release that ships the model, so there a missing file fails the test.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path

from mono_aot.spec.layouts import resolve_layout

DRAFTER_LAYOUT = Path("models/minimax_m3/amd/mono/drafter/layout.py")


def _vllm_constants() -> dict[str, object]:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / DRAFTER_LAYOUT
    assert path.is_file(), (
        f"vLLM {importlib.metadata.version('vllm')} has no {DRAFTER_LAYOUT} "
        "(the MiniMax-M3.1 DSpark drafter ships from vLLM 0.34.0, which make test-vllm pins)"
    )
    out: dict[str, object] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
                out[target.id] = node.value.value
    return out


def test_the_shipped_layout_is_vllms_minimax_m3_1_dspark_drafter():
    c = _vllm_constants()
    lay = resolve_layout("minimax-m3.1-dspark-tp4")
    m, s = lay.model, lay.serving
    assert (m.layers, m.hidden, m.head_dim, m.rotary_dim) == (
        c["LAYERS"],
        c["HIDDEN"],
        c["HD"],
        c["ROT"],
    )
    assert lay.q_heads_per_rank == c["HEADS"] and lay.q_rows_per_rank == c["QS"]
    assert lay.qkv_rows_per_rank == c["QKV_N"] and lay.mlp_per_rank == c["IR"]
    assert (m.window, s.kv_block, s.qpr, s.max_reqs) == (
        c["WINDOW"],
        c["BLOCK"],
        c["QPR"],
        c["MAX_REQS"],
    )
    assert m.norm_eps == c["EPS"] and lay.kernel.threads == c["THREADS"]
    assert lay.ctas("gfx950") == c["BLOCKS"]  # one CTA per CU of MI350X/MI355X
    assert lay.kv_entry_bytes == 2 * c["HD"]  # a token's record: k (128 B) | v (128 B)
