"""``mono-aot pack``: build what is missing, then one read-only pack wheel per arch."""

from __future__ import annotations

import os
from pathlib import Path

import click

from mono_aot.cli._common import (
    arch_option,
    emit_json,
    jobs_option,
    json_option,
    layout_option,
    require_module,
    result_line,
    sigterm_exits,
)
from mono_aot.spec.errors import BadInput


@click.command("pack")
@arch_option("Pack")
@layout_option("every shipped layout that targets the arch")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="dist",
    show_default=True,
    help="Directory the wheels are written to.",
)
@click.option(
    "--store",
    "store_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Build into and pack from this store root instead of the default layers.",
)
@jobs_option
@json_option
def pack(archs, layouts, out_dir, store_dir, parallel, as_json) -> None:
    """Build missing kernels into the store, then write a wheel mono_aot_kernels_<arch> per arch.

    Exit status: 0 every wheel written, 1 a build or the wheel build failed, 2 bad input or a
    missing build extra.
    """
    # a pack is a release artifact: every entry is (re)built by this toolchain, and the wheel
    # is made by the build front end and hatchling; all of them come with the build extra
    for module in ("flydsl", "build", "hatchling"):
        require_module(module, "mono-aot pack", "build")
    from mono_aot.compiler.pack import build_packs
    from mono_aot.store import Store

    if store_dir is not None and not store_dir.strip():
        raise BadInput("--store: empty path (omit --store to use the default layers)")
    if not out_dir.strip():
        raise BadInput("--out: empty path")
    store = Store.default() if store_dir is None else Store.at(store_dir)

    def on_result(res) -> None:
        if not as_json:
            click.echo(result_line(res))

    with sigterm_exits():
        report = build_packs(
            archs,
            layouts,
            store,
            Path(out_dir),
            parallel=parallel or os.cpu_count() or 1,
            on_result=on_result,
        )
    if as_json:
        emit_json(
            {
                "store": store.describe(),
                "results": [r.as_json() for r in report.results],
                "wheels": [w.as_json() for w in report.wheels],
            }
        )
        return
    for w in report.wheels:
        click.echo(
            f"{w.path}  {w.size} bytes ({w.size / 1024:.1f} KiB, {len(w.index.entries)} entries)"
        )
