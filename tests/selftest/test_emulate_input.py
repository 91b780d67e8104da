"""``mono-aot emulate`` refuses what it cannot run before any work: a layout too large to
emulate (the shipped one: 304 workgroups of 8 waves per device), an arch the layout does not
target (before anything else is looked up), an unknown check, a request count no step holds. One ``mono-aot:`` line naming the option, exit 2."""

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
            ["--layout", "minimax-m3-dspark-tp4", "--arch", "gfx942"],
            "mono-aot: --layout minimax-m3-dspark-tp4: 304 workgroups of 512 threads (2432 "
            "waves) per device on gfx942: the emulator takes at most",
        ),
        (
            ["--layout", "minimax-m3-dspark-tp4", "--arch", "gfx90a"],
            "mono-aot: --arch gfx90a: layout minimax-m3-dspark-tp4 targets gfx942, gfx950",
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
