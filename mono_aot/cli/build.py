"""``mono-aot build``: compile the layout x arch x variant matrix into the store."""

from __future__ import annotations

import os
import sys
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
from mono_aot.spec.errors import BadInput, MonoError
from mono_aot.spec.layouts import VARIANTS


def _provider(spec: str | None):
    from mono_aot.compiler.inputs import directory_provider
    from mono_aot.keys import REAL_PROVIDER, real_provider

    if spec is None:
        prov = real_provider()
        if not any(rel.startswith("mono_aot/kernels/") for rel, _ in prov.sources):
            raise MonoError(
                f"the kernels ({REAL_PROVIDER}) are not part of this install: nothing to build"
            )
        return prov
    directory, sep, module = spec.rpartition(":")
    if not sep or not directory or not module:
        raise BadInput(f"--provider {spec}: expected DIR:MODULE")
    if not Path(directory).is_dir():
        raise BadInput(f"--provider {spec}: {directory} is not a directory")
    from importlib.machinery import PathFinder

    # found without importing it (that is the worker's job); else every job fails alike
    if PathFinder.find_spec(module.partition(".")[0], [directory]) is None:
        raise BadInput(f"--provider {spec}: no module {module!r} in {directory}")
    return directory_provider(Path(directory), module)


def _store(root: str | None):
    from mono_aot.store import Store

    if root is None:
        return Store.default()
    if not root.strip():
        raise BadInput("--store: empty path (omit --store to build into the user cache)")
    return Store.at(root)


@click.command("build")
@arch_option("Build for")
@layout_option()
@click.option(
    "--variant",
    "variants",
    multiple=True,
    type=click.Choice(VARIANTS),
    help="Kernel variant (repeatable; default: the layout's own, no narrow when wide_base = 1).",
)
@jobs_option
@click.option(
    "--store",
    "store_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Build into this store root instead of the user cache.",
)
@click.option("--dry-run", is_flag=True, help="Print the plan with hit/miss per job and exit.")
@click.option("--force", is_flag=True, help="Rebuild and replace entries that would be hits.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=None,
    metavar="SECONDS",
    help="Kill a compile that runs longer (default 1800).",
)
@click.option(
    "--provider",
    "provider_spec",
    default=None,
    metavar="DIR:MODULE",
    help="Build the kernels of MODULE found in DIR instead of mono_aot.kernels "
    "(kernel development and tests).",
)
@json_option
def build(
    archs, layouts, variants, parallel, store_dir, dry_run, force, timeout, provider_spec, as_json
) -> None:
    """Compile the layout x arch x variant matrix into the store.

    Exit status: 0 when every job is a hit or was built, 1 when any failed, 2 for bad input.
    """
    require_module("flydsl", "mono-aot build", "build")
    from mono_aot.compiler.compile import DEFAULT_TIMEOUT_S
    from mono_aot.compiler.plan import current_toolchain, plan_jobs, select_layouts, stale_reason
    from mono_aot.compiler.run import FAILED, run_jobs

    store = _store(store_dir)
    lays = select_layouts(layouts)
    provider = _provider(provider_spec)
    toolchain = current_toolchain()
    jobs = plan_jobs(lays, archs, variants, provider, toolchain)

    if dry_run:
        rows = []
        for job in jobs:
            hit = store.lookup(job.key, accept=lambda e, j=job: e.build_inputs == j.build_inputs)
            hit = hit or store.lookup(job.key)
            if hit is None:
                state, why = "miss", ""
            elif hit.entry.build_inputs == job.build_inputs:
                state, why = "hit", ""
            else:
                state, why = "stale", stale_reason(hit.entry.build_inputs, job.build_inputs)
            rows.append(
                {
                    **job.as_json(),
                    "status": state,
                    "reason": why or None,
                    "lookup_inputs": job.lookup_inputs,
                    "build_inputs": job.build_inputs,
                }
            )
        if as_json:
            emit_json({"dry_run": True, "store": store.describe(), "plan": rows})
            return
        click.echo(f"store: {store.describe()}")
        for r in rows:
            extra = f"  ({r['reason']})" if r["reason"] else ""
            click.echo(
                f"{r['status']:<6} {r['layout']}/{r['arch']}/{r['variant']}  {r['key'][:12]}{extra}"
            )
        return

    n = parallel or os.cpu_count() or 1
    tty = not as_json and sys.stderr.isatty()
    bar = None
    if tty:
        bar = click.progressbar(
            length=len(jobs),
            label="mono-aot build",
            file=sys.stderr,
            item_show_func=lambda r: r.job.name if r else "",
        )
        bar.__enter__()

    def on_result(res) -> None:
        if bar is not None:
            bar.update(1, res)
        elif not as_json:
            click.echo(result_line(res))

    try:
        with sigterm_exits():
            results = run_jobs(
                jobs,
                store,
                provider,
                toolchain,
                parallel=n,
                force=force,
                timeout=timeout or DEFAULT_TIMEOUT_S,
                on_result=on_result,
            )
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)

    counts = {s: sum(r.status == s for r in results) for s in ("hit", "built", "rebuilt", "failed")}
    summary = {"jobs": len(results), **counts, "compiles": sum(r.compiled for r in results)}
    if as_json:
        emit_json(
            {
                "dry_run": False,
                "store": store.describe(),
                "plan": [j.as_json() for j in jobs],
                "results": [r.as_json() for r in results],
                "summary": summary,
            }
        )
    else:
        if bar is not None:
            for r in results:
                click.echo(result_line(r))
        _table(results)
        click.echo(
            f"{summary['jobs']} jobs: {counts['hit']} hit, {counts['built']} built, "
            f"{counts['rebuilt']} rebuilt, {counts['failed']} failed ({summary['compiles']} compiles)"
        )
    failed = [r for r in results if r.status == FAILED]
    if failed:
        raise MonoError(
            f"{len(failed)} of {len(results)} jobs failed: {', '.join(r.job.name for r in failed)}"
        )


def _table(results) -> None:
    rows = [("job", "status", "seconds", "key", "vgpr", "agpr", "sgpr", "lds", "code")]
    for r in results:
        e = r.entry
        res = (
            [
                str(x)
                for x in (
                    e.resources.vgpr,
                    e.resources.agpr,
                    e.resources.sgpr,
                    e.resources.lds,
                    e.resources.code_bytes,
                )
            ]
            if e
            else ["-"] * 5
        )
        rows.append(
            (r.job.name, r.status, f"{r.seconds:.1f}" if r.compiled else "-", r.job.key[:12], *res)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    click.echo("")
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
