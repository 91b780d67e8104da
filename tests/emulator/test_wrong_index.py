"""The wrong-index fixture provider (``tests/emulator/wrong_index.py``): the small layout builds
with it through ``mono-aot build --provider``, passes the build's publish checks, and gives code
objects and keys of its own, different from the real kernels' of the same layout. (That the
emulator's check fails on them is the emulator's test.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from mono_aot.emulator.decode import decode_kernel
from mono_aot.keys import lookup_key, real_provider, served_key
from mono_aot.store import Store
from tests.emulator.wrong_index import LAYOUT, PROVIDER_DIR, PROVIDER_MODULE

pytestmark = pytest.mark.slow


def test_the_provider_changes_exactly_the_one_index_map():
    """In a fresh interpreter: importing the provider moves ``pv_pos`` by one position, modulo
    the chunk, and leaves every other index map and the provider protocol as the real one."""
    code = f"""
import sys
sys.path.insert(0, {str(PROVIDER_DIR)!r})
from mono_aot import kernels
from mono_aot.spec.layouts import resolve_layout
from mono_aot.spec.plans import AttnGeometry
lay = resolve_layout({LAYOUT!r})
g = AttnGeometry.build(lay, "gfx942", "wide")
right = {{(s, grp, e): g.pv_pos(s, grp, e) for s in range(2) for grp in range(4) for e in range(8)}}
others = [g.score_pos(1, 2, 3), g.v_frag_word(5, 7), g.k_frag_word(1, 2, 3), g.qk_dim(1, 1, 1)]
import {PROVIDER_MODULE} as w
assert w.KERNEL_NAMES is kernels.KERNEL_NAMES and w.launcher_for is kernels.launcher_for
assert w.trace_args is kernels.trace_args
wrong = {{k: g.pv_pos(*k) for k in right}}
assert all(wrong[k] == (right[k] + 1) % g.chunk for k in right), wrong
assert sorted(wrong.values()) == sorted((v + 1) % g.chunk for v in right.values())
assert all(0 <= v < g.chunk for v in wrong.values())
assert others == [g.score_pos(1, 2, 3), g.v_frag_word(5, 7), g.k_frag_word(1, 2, 3), g.qk_dim(1, 1, 1)]
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_it_builds_with_keys_and_bytes_of_its_own(wrong_index_build, tiny_compiles):
    b = wrong_index_build
    assert sorted(b.keys) == [("gfx942", "narrow"), ("gfx942", "wide")]
    store = Store.at(b.store)
    for (arch, variant), key in b.keys.items():
        entry = store.lookup(key).entry
        real = tiny_compiles[(variant, arch)].code_object
        wrong = b.code_object(arch, variant)
        # its own key: not the real provider's, not the one the runtime serves
        assert key != lookup_key(real_provider(), variant, b.layout, arch)
        assert key != served_key(variant, b.layout, arch)
        assert entry.lookup_inputs["provider"] == PROVIDER_MODULE
        assert entry.lookup_inputs["layout"] == b.layout.canonical()
        # a different code object for the same kernel symbol and launch
        assert wrong != real
        dw, dr = decode_kernel(wrong), decode_kernel(real)
        assert dw.kernel.name == dr.kernel.name == f"mono_drafter_{variant}_0"
        assert [i.text() for i in dw.instructions] != [i.text() for i in dr.instructions]
