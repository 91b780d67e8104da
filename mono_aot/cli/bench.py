"""``mono-aot bench``: FlyDSL just in time vs its warm cache vs mono-aot's warm bind, builds,
imports and sizes, measured side by side in one run on this machine (README, "mono-aot bench")."""

from __future__ import annotations

from pathlib import Path

import click

from mono_aot.cli._common import emit_json, json_option, require_module
from mono_aot.spec.errors import BadInput


@click.command("bench")
@click.option(
    "--quick",
    is_flag=True,
    help="Fewer runs, one arch (gfx942), no cold full-matrix build (under a minute when the "
    "store is prebuilt; every JSON field is still present, skipped ones null with a reason).",
)
@click.option(
    "--layout", "layout_name", default=None, help="Shipped layout name (default: the shipped one)."
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    help="N of the -j N build figures (default: the number of cores).",
)
@click.option(
    "--store",
    "store_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Bind from this store root (kernels missing from it are built into it first, not "
    "timed); default: a temporary store the bench builds.",
)
@click.option(
    "--flydsl-python",
    "flydsl_pythons",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Also measure FlyDSL's figures with this interpreter, which has another FlyDSL "
    "version installed (repeatable; e.g. .venv-flydsl-oldest/bin/python from make "
    "test-flydsl-oldest).",
)
@json_option
def bench(quick, layout_name, jobs, store_dir, flydsl_pythons, as_json) -> None:
    """Measure serving and build costs on this machine and print one table (or --json).

    Nothing needing a GPU is measured: module load on a device and kernel time are printed as
    "not measured". Exit status: 0 the run finished (targets met or missed), 1 a measured
    process failed, 2 bad input or a missing build extra.
    """
    require_module("flydsl", "mono-aot bench", "build")
    from mono_aot.bench.report import render
    from mono_aot.bench.run import run_bench
    from mono_aot.spec.layouts import resolve_layout, shipped_layout_paths

    if layout_name is None:
        shipped = [p.stem for p in shipped_layout_paths()]
        if len(shipped) != 1:
            raise BadInput(f"--layout is required (shipped: {', '.join(shipped) or 'none'})")
        layout_name = shipped[0]
    resolve_layout(layout_name)  # a bad name is bad input before anything runs
    if store_dir is not None and not store_dir.strip():
        raise BadInput("--store: empty path")

    def log(msg: str) -> None:
        click.echo(msg, err=True)

    doc = run_bench(
        quick=quick,
        layout=layout_name,
        jobs=jobs,
        store=Path(store_dir).resolve() if store_dir else None,
        flydsl_pythons=[str(Path(p).absolute()) for p in flydsl_pythons],
        log=log,
    )
    if as_json:
        emit_json(doc)
    else:
        click.echo(render(doc))
