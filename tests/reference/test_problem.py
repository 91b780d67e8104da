"""The selftest's problems make attention peaked, so that a kernel reading a wrong K/V position
or index fails the output check instead of hiding in a near-uniform average
(``_QUERY_NORM_OFFSET`` in ``mono_aot/reference/problem.py``)."""

from __future__ import annotations

import pytest
import torch

from mono_aot.reference import make_problem
from mono_aot.reference.dense import DenseConfig, DenseDrafter
from mono_aot.selftest.cases import TOLERANCE, request_specs
from mono_aot.spec.layouts import resolve_layout


class _Recording(DenseDrafter):
    """The dense model, recording each attention's probabilities; ``shift`` pairs the
    probability of key p with the value of key p + 1 (the wrong-index fixture's mistake,
    ``tests/emulator/fixtures/wrong_index/wrong_index_kernels.py``)."""

    shift = False
    probs: list[torch.Tensor]

    def _probs(self, q: torch.Tensor, k: torch.Tensor, allowed=None) -> torch.Tensor:
        p = super()._probs(q, k, allowed)
        self.probs.append(p)
        return p

    def _attention(self, q, k, v, allowed=None) -> torch.Tensor:
        return super()._attention(q, k, v.roll(-1, dims=0) if self.shift else v, allowed)


def _run(prob, shift: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model = _Recording(DenseConfig.from_layout(prob.layout), prob.layers, prob.final_norm)
    model.shift, model.probs = shift, []
    out = model.forward(
        prob.inputs.x, prob.inputs.positions, prob.inputs.cos_sin,
        prob.dense_requests(), prob.kv_roundtrip(),
    )  # fmt: skip
    return out, model.probs


@pytest.fixture(scope="module")
def wide_problem():
    """The emulator's wide check of the small layout (``mono-aot emulate --check wide
    --requests 2``: contexts 255 and 256, ``request_specs`` with salt 2; the layout's window
    of 200 bites both)."""
    lay = resolve_layout("emulator-tiny-tp4")
    return make_problem(lay, "gfx942", request_specs(lay, 2, salt=2), seed=0)


def test_attention_over_long_contexts_is_peaked(wide_problem):
    _, probs = _run(wide_problem, shift=False)
    for p in probs:  # one per request and layer: [heads, queries, keys]
        keys = p.shape[-1]
        assert keys >= wide_problem.layout.model.window  # a window's worth of keys or more
        top = p.max(dim=-1).values
        assert float(top.mean()) > 0.3, "a query head's largest probability, on average"
        effective = (-(p * p.clamp_min(1e-300).log()).sum(dim=-1)).exp()  # exp(entropy)
        assert float(effective.mean()) < keys / 10


def test_values_one_position_off_fail_the_output_check_by_far(wide_problem):
    right, _ = _run(wide_problem, shift=False)
    assert torch.allclose(right, wide_problem.dense())  # the recording model is the dense one
    wrong, _ = _run(wide_problem, shift=True)
    assert float((wrong - right).norm() / right.norm()) > 10 * TOLERANCE
