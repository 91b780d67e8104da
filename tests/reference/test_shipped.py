"""The reference on the shipped geometry's real per-rank shapes (one layer, one request)."""

from __future__ import annotations

import pytest
import torch

from mono_aot.reference import RequestSpec, make_problem, max_rel_error, run_tp
from tests.reference.helpers import shipped_one_layer


@pytest.mark.slow
def test_shipped_geometry_one_layer_against_dense():
    lay = shipped_one_layer()
    p = make_problem(lay, "gfx942", [RequestSpec(40, (True,) * 6 + (False,))], seed=21)
    rw = p.ranks[0]
    # the runner's packed tensors, with the layers dim in front
    assert {k: tuple(v.shape) for k, v in rw.packed.items()} == {
        "qkv_w": (1, 2304, 6144),
        "qkv_s": (1, 2304, 192),
        "o_w": (1, 6144, 2048),
        "o_s": (1, 6144, 64),
        "gu_w": (1, 6144, 6144),
        "gu_s": (1, 6144, 192),
        "d_w": (1, 6144, 3072),
        "d_s": (1, 6144, 96),
    }
    caches = p.caches()
    assert tuple(caches[0][0].shape[1:]) == (1, 128, 256)
    res = run_tp(lay, p.fmt, p.ranks, caches, p.inputs)
    assert res.out.shape == (7, 6144)
    assert max_rel_error(res.out, p.dense()) < 1e-10
    assert res.ranks[0].kv.shape == (1, 7, 1, 256)
    assert res.ranks[0].written.tolist() == [True] * 6 + [False]
    kres = run_tp(lay, p.fmt, p.ranks, p.caches(), p.inputs, numerics="kernel")
    assert kres.out.dtype == torch.bfloat16
    assert max_rel_error(kres.out, res.out) < 2e-2
