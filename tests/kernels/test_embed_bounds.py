"""Host-side checks of index maps the drafter kernel body computes on the device (each one
mirrors one map of mono_aot/kernels and would have caught a bug found in it)."""

from __future__ import annotations

import pytest

from mono_aot.spec import abi
from mono_aot.spec.layouts import resolve_layout

LAY = resolve_layout("minimax-m3.1-dspark-tp4")


def _embed_rows(hidden: int, ctas: int, stride: int, bid: int, clamp: bool) -> list[list[int]]:
    """The hidden rows the embed phase loads per 8-row group (drafter.ph_embed's embed_add over
    pointwise.absorb's groups), with or without the clamp to hidden - 1."""
    r0 = bid * hidden // ctas
    out = []
    for i0 in range(0, stride, 8):
        rows = [r0 + i0 + j for j in range(8)]
        out.append([min(r, hidden - 1) for r in rows] if clamp else rows)
    return out


@pytest.mark.parametrize("arch", sorted(LAY.targets))
def test_embed_loads_stay_inside_the_token_row(arch):
    """The last token's row is the end of x: no workgroup may load past hidden, and every row a
    workgroup owns must still load its own column."""
    h, ctas, stride = LAY.model.hidden, LAY.ctas(arch), abi.mbox_rows(LAY)
    for bid in range(ctas):
        r0 = bid * h // ctas
        cnt = (bid + 1) * h // ctas - r0
        groups = _embed_rows(h, ctas, stride, bid, clamp=True)
        raw = _embed_rows(h, ctas, stride, bid, clamp=False)
        for g, (rows, unclamped) in enumerate(zip(groups, raw, strict=True)):
            assert max(rows) < h
            for j in range(8):
                if g * 8 + j < cnt:
                    assert rows[j] == unclamped[j] == r0 + g * 8 + j


def test_embed_clamp_is_needed_on_an_arch_whose_ctas_do_not_divide_hidden():
    """gfx942 (304 CTAs): the last workgroup's last group reaches past hidden without the clamp."""
    h, stride = LAY.model.hidden, abi.mbox_rows(LAY)
    ctas = LAY.ctas("gfx942")
    raw = _embed_rows(h, ctas, stride, ctas - 1, clamp=False)
    assert max(max(g) for g in raw) >= h
