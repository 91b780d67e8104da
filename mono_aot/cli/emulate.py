"""``mono-aot emulate``: run the stored code objects of a layout on emulated devices.

The selftest's checks (``mono_aot.selftest.emulated``) on ``tp`` devices of the functional
emulator (``mono_aot.emulator``), with no GPU: the shipped bytes, bound by the runtime's own
runner. A pass says the instructions compute what the float64 reference does under the
emulator's model (README, "Emulator"), not that the hardware does.

Exit codes: 0 every check passed; 1 a check failed (or the emulator stopped a launch on a fault
it detected); 2 bad input (an unknown layout, an arch the layout does not target, the
``emulate`` extra missing). Any layout runs: a large one's expected time and memory are printed
first, and on a terminal a progress line every few million wave-instructions.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from mono_aot.cli._common import emit_json, json_option, require_module
from mono_aot.selftest.emulated import CHECKS, TEST_LAYOUT
from mono_aot.spec.errors import EXIT_FAILED, BadInput

if TYPE_CHECKING:
    from mono_aot.spec.layouts import Layout


@click.command(epilog="Exit codes: 0 all checks passed, 1 a check failed, 2 bad input.")
@click.option(
    "--layout",
    "layout_name",
    metavar="NAME|PATH",
    default=TEST_LAYOUT,
    show_default=True,
    help="Shipped layout name or spec path.",
)
@click.option("--arch", metavar="A", help="Emulated arch (default: the layout's first target).")
@click.option(
    "--check",
    "checks",
    multiple=True,
    type=click.Choice(CHECKS),
    help="Run only these checks (repeatable; default: all).",
)
@click.option(
    "--requests",
    "requests",
    multiple=True,
    type=click.IntRange(1),
    metavar="N",
    help="The narrow, wide and multi-launch checks run only these request counts "
    "(repeatable; a count above one launch's is a multi-launch step; default: each check's "
    "own counts).",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the problems and of the scheduler.",
)
@click.option(
    "--shuffle",
    is_flag=True,
    help="Randomise the interleaving of waves (by --seed) instead of the fixed round order.",
)
@click.option(
    "--provider",
    metavar="DIR:MODULE",
    help="Run the code objects this kernel provider built (mono-aot build --provider, into a "
    "store this command reads) in place of the served ones; for trying a kernel change.",
)
@json_option
def emulate(
    layout_name: str,
    arch: str | None,
    checks: tuple[str, ...],
    requests: tuple[int, ...],
    seed: int,
    shuffle: bool,
    provider: str | None,
    as_json: bool,
) -> None:
    """Run a layout's kernels on emulated devices and print a verdict per check."""
    require_module("numpy", "mono-aot emulate", "emulate")
    from mono_aot.selftest.emulated import check_emulable, run_emulation
    from mono_aot.spec.layouts import resolve_layout

    layout = resolve_layout(layout_name)
    arch = arch or layout.archs[0]
    check_emulable(layout, arch)  # before the provider's kernels are looked up for that arch
    log = (lambda s: None) if as_json else (lambda s: click.echo(s, err=True))
    replace = _provider_kernels(provider, layout, arch) if provider else None
    results, totals = run_emulation(
        layout,
        arch,
        checks or CHECKS,
        seed=seed,
        shuffle=shuffle,
        log=log,
        replace=replace,
        requests=requests,
        progress=not as_json and sys.stderr.isatty(),
    )
    ok = all(r.ok for r in results)
    if as_json:
        emit_json(
            {
                "layout": layout.name,
                "arch": arch,
                "ok": ok,
                "checks": [r.as_json() for r in results],
                "instructions": totals.instructions,
                "instructions_per_second": round(totals.per_second),
                "virtual_seconds": totals.virtual_seconds,
                "launches": totals.runs,  # a step's launch on every rank, run side by side
                "longest_launch_seconds": round(totals.longest_run_s, 1),
                "peak_memory_bytes": totals.peak_memory_bytes(),
            }
        )
    else:
        for r in results:
            click.echo(f"{'PASS' if r.ok else 'FAIL'} {r.name}: {r.detail} ({r.seconds:.0f} s)")
        click.echo(
            f"emulate {'passed' if ok else 'FAILED'} ({layout.name}, {arch}): "
            f"{totals.instructions:,} wave-instructions, {totals.per_second:,.0f}/s; "
            f"{totals.runs} launches (every rank's side by side), the longest "
            f"{totals.longest_run_s / 60:.1f} min; peak memory "
            f"{totals.peak_memory_bytes() / 1e9:.1f} GB"
        )
    if not ok:
        sys.exit(EXIT_FAILED)  # as coverage, doctor and cache do (run_main ignores ctx.exit)


def _provider_kernels(spec: str, layout: Layout, arch: str) -> dict[str, bytes]:
    """The provider's stored code object of each variant, by kernel symbol."""
    from mono_aot.cli.build import _provider
    from mono_aot.keys import lookup_key
    from mono_aot.store import Store

    prov = _provider(spec)
    store = Store.default()
    out = {}
    for variant in layout.variants():
        key = lookup_key(prov, variant, layout, arch)
        hit = store.lookup(key)
        if hit is None:
            raise BadInput(
                f"no {variant} kernel of this provider for {layout.name} on {arch} in the store "
                f"(key {key[:12]}): build it first with mono-aot build --provider {spec} "
                f"--layout {layout.name} --arch {arch}",
                field="provider",
                value=spec,
            )
        out[hit.entry.symbol] = hit.data
    return out
