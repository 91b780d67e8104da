"""Measure the executor's throughput (wave-instructions per host second) on a real launch.

Not a test (nothing asserts a wall-clock figure): run it by hand before and after a change to
the executor (``mono_aot/emulator/machine.py``, ``program.py``, ``wave.py``...)::

    mono-aot build --store STORE --layout emulator-tiny-tp4 --arch gfx942
    python -m tests.emulator.throughput STORE [--instructions 3000000] [--profile] [--compare]

It runs the selftest's narrow check of 1 request (``--check wide``: a wide step of the
layout's smallest wide count) of a layout (``--layout``; the small test layout in
``layouts/test/`` by default) on 4 emulated
devices exactly as ``mono-aot emulate`` does (``mono_aot/selftest/emulated.py``: real weights,
caches and argument buffers), but stops the machine after ``--instructions`` wave-instructions
and prints how fast they ran (``--profile``: and the cProfile of that run; ``--compare``: and
how fast they ran with every wave alone, ``Machine(gangs=False)``, measured right after).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

from mono_aot.emulator import machine as machine_mod
from mono_aot.spec.layouts import resolve_layout

LAYOUT = "emulator-tiny-tp4"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", help="a store the tiny layout's kernels were built into")
    ap.add_argument("--instructions", type=int, default=3_000_000)
    ap.add_argument("--arch", default="gfx942")
    ap.add_argument("--layout", default=LAYOUT, help="the layout (its kernels in STORE)")
    ap.add_argument(
        "--check",
        choices=("narrow", "wide"),
        default="narrow",
        help="the narrow step (1 request) or the wide step of 2 requests",
    )
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--compare",
        action="store_true",
        help="also run every wave alone (Machine(gangs=False)) and print the ratio",
    )
    a = ap.parse_args(argv)
    rows = [("gangs", _measure(a, gangs=True))]
    if a.compare:
        rows.append(("alone", _measure(a, gangs=False)))
    for name, (n, s) in rows:
        print(f"{name:6s} {n} wave-instructions in {s:.2f} s: {n / s:,.0f} per second")
    if a.compare:
        print(f"gangs / alone: {rows[1][1][1] / rows[0][1][1]:.2f}x")


def _measure(a: argparse.Namespace, *, gangs: bool) -> tuple[int, float]:
    """(wave-instructions, seconds) of one capped run."""
    from mono_aot.selftest.emulated import run_emulation

    runs: list[tuple[int, float]] = []
    prof = cProfile.Profile() if a.profile else None
    real_run, real_init = machine_mod.Machine.run, machine_mod.Machine.__init__

    def capped(self, *, max_instructions=None):
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        try:
            st = real_run(self, max_instructions=a.instructions)
            runs.append((st.instructions, time.perf_counter() - t0))
            return st
        except machine_mod.EmulatorError as e:
            if "instruction limit" not in str(e):
                raise
            runs.append((a.instructions, time.perf_counter() - t0))
            raise
        finally:
            if prof is not None:
                prof.disable()

    def init(self, *args, **kw):
        real_init(self, *args, **{**kw, "gangs": gangs})

    machine_mod.Machine.run = capped  # type: ignore[method-assign]
    machine_mod.Machine.__init__ = init  # type: ignore[method-assign]
    try:
        env = {"MONO_AOT_PATH": a.store, "MONO_AOT_STRICT": "1"}
        layout = resolve_layout(a.layout)
        requests = (layout.serving.wide_base,) if a.check == "wide" else (1,)
        run_emulation(layout, a.arch, [a.check], env=env, requests=requests)
    finally:
        machine_mod.Machine.run = real_run  # type: ignore[method-assign]
        machine_mod.Machine.__init__ = real_init  # type: ignore[method-assign]
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(40)
        print(out.getvalue())
    return runs[0]


if __name__ == "__main__":
    main()
