"""``mono-aot selftest``: run the drafter kernels on this machine's GPUs against the reference.

Exit codes: 0 every check passed; 1 a check failed or could not finish (a rank crashed or hung);
2 bad input; 3 this machine cannot run the selftest (no ROCm torch, or fewer than ``tp`` GPUs
of a targeted arch with the layout's CU count): nothing was tested. The kernels come from the
store; only a kernel missing from it needs FlyDSL (built once, unless MONO_AOT_STRICT=1).
"""

from __future__ import annotations

import sys

import click

from mono_aot.cli._common import emit_json, json_option
from mono_aot.selftest import CHECKS, DEFAULT_REPLAYS, run_selftest
from mono_aot.spec.errors import EXIT_FAILED, EXIT_NO_DEVICE, BadInput
from mono_aot.spec.layouts import resolve_layout, shipped_layout_paths


def _default_layout() -> str:
    shipped = [p.stem for p in shipped_layout_paths()]
    if len(shipped) != 1:
        raise BadInput(f"--layout is required (shipped layouts: {', '.join(shipped) or 'none'})")
    return shipped[0]


@click.command(
    epilog=f"Exit codes: 0 all checks passed, 1 a check failed, 2 bad input, {EXIT_NO_DEVICE} no "
    "usable GPUs here (nothing was tested)."
)
@click.option(
    "--layout", "layout_name", help="Shipped layout name or spec path (default: the shipped one)."
)
@click.option(
    "--check",
    "checks",
    multiple=True,
    type=click.Choice(CHECKS),
    help="Run only these checks (repeatable; default: all). narrow, wide: every request count "
    "of one launch; multi-launch: steps of several launches; dead-rank: a rank that never "
    "launches is recorded by its peers, then a step passes after a host re-align; "
    "dead-rank-realign: the same, then the next step must pass with no host reset of step or "
    "health; late-dispatch: a launch whose workgroups wait past the bound for CUs (a CU-masked "
    "stream) records a timeout, the next launch on the same scratch passes; graph-replay: a "
    "captured step replayed with no host reset.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random problems.")
@click.option(
    "--replays",
    type=click.IntRange(1, 100000),
    default=DEFAULT_REPLAYS,
    show_default=True,
    help="Graph replays of the graph-replay check.",
)
@json_option
def selftest(
    layout_name: str | None, checks: tuple[str, ...], seed: int, replays: int, as_json: bool
) -> None:
    """Run the kernels on this machine's GPUs and print a verdict per check.

    Four rank processes, one GPU each, run the stored kernels through the serving runtime
    and compare every step with the float64 reference."""
    layout = resolve_layout(layout_name or _default_layout())
    log = (lambda s: None) if as_json else (lambda s: click.echo(s, err=True))
    results = run_selftest(layout, checks or CHECKS, seed=seed, replays=replays, log=log)
    ok = all(r.ok for r in results)
    if as_json:
        emit_json({"layout": layout.name, "ok": ok, "checks": [r.as_json() for r in results]})
    else:
        for r in results:
            click.echo(f"{'PASS' if r.ok else 'FAIL'} {r.name}: {r.detail} ({r.seconds:.0f} s)")
        click.echo(f"selftest {'passed' if ok else 'FAILED'} ({layout.name})")
    if not ok:
        sys.exit(EXIT_FAILED)  # as coverage, doctor and cache do (run_main ignores ctx.exit)
