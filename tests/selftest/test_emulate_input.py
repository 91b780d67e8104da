"""``mono-aot emulate`` refuses what it cannot run before any work: an arch the layout does not
target (before anything else is looked up), an unknown check, a request count no step holds.
One ``mono-aot:`` line naming the option, exit 2. Any layout the kernels build for runs; a
large one states its expected cost first (``launch_costs``)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mono_aot", "emulate", *args],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (
            ["--layout", "minimax-m3.1-dspark-tp4", "--arch", "gfx90a"],
            "mono-aot: --arch gfx90a: layout minimax-m3.1-dspark-tp4 targets gfx942, gfx950",
        ),
        (["--check", "graph-replay"], "mono-aot: emulate: Invalid value for '--check'"),
        (
            ["--requests", "17"],
            "mono-aot: --requests 17: layout emulator-tiny-tp4's steps hold 1..16 requests (one "
            "launch 1..5, more are multi-launch steps)",
        ),
        (  # the arch is refused before the provider's kernels for it are looked up
            ["--arch", "gfx90a", "--provider", "no-such-dir:no_module"],
            "mono-aot: --arch gfx90a: layout emulator-tiny-tp4 targets gfx942, gfx950",
        ),
    ],
)
def test_refusals_are_one_line_and_exit_2(args, expect):
    r = run(*args)
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expect), r.stderr


def test_the_expected_cost_of_a_launch_follows_the_layout():
    """The shipped layout's figures are the measured ones they are calibrated on (a narrow
    step: 440 M wave-instructions, peak up to 7.45 GB); the tiny layout costs a small fraction."""
    from mono_aot.selftest.emulated import launch_costs
    from mono_aot.spec.layouts import resolve_layout

    shipped = {
        c.variant: c for c in launch_costs(resolve_layout("minimax-m3.1-dspark-tp4"), "gfx942")
    }
    tiny = {c.variant: c for c in launch_costs(resolve_layout("emulator-tiny-tp4"), "gfx942")}
    assert shipped["narrow"].waves == 304 * 8
    assert 430e6 < shipped["narrow"].instructions < 450e6
    assert 7e9 < shipped["narrow"].memory_bytes < 8e9
    assert "2,432 waves a device" in shipped["narrow"].describe()
    assert tiny["narrow"].instructions < shipped["narrow"].instructions / 10
    assert tiny["wide"].seconds < shipped["wide"].seconds / 10
