"""``mono-aot layouts``: list, show, validate and describe layout specs."""

from __future__ import annotations

import click

from mono_aot.cli._common import emit_json, json_option
from mono_aot.spec.arch import arch_info
from mono_aot.spec.errors import LayoutError
from mono_aot.spec.layouts import (
    Layout,
    json_schema,
    load_layout,
    resolve_layout,
    shipped_layout_paths,
)
from mono_aot.spec.plans import launch_bytes


def _summary(lay: Layout) -> dict:
    return {
        "name": lay.name,
        "digest": lay.digest,
        "description": lay.description,
        "targets": {a: lay.targets[a].ctas for a in lay.archs},
        "variants": list(lay.variants()),
    }


def _derived(lay: Layout) -> dict:
    return {
        "wait_ticks": lay.wait_ticks,
        "q_heads_per_rank": lay.q_heads_per_rank,
        "kv_heads_per_rank": lay.kv_heads_per_rank,
        "qkv_rows_per_rank": lay.qkv_rows_per_rank,
        "o_cols_per_rank": lay.o_cols_per_rank,
        "mlp_per_rank": lay.mlp_per_rank,
        "gu_rows_per_rank": lay.gu_rows_per_rank,
        "launch_tokens": lay.launch_tokens,
        "variant_tokens": {v: lay.variant_tokens(v) for v in lay.variants()},
        "scratch_bytes": {v: lay.scratch_bytes(v) for v in lay.variants()},
        "peer_bytes": lay.peer_bytes,
        "launch": _launch_model(lay),
    }


def _launch_model(lay: Layout) -> list[dict]:
    """Per rank and launch: the bytes streamed and the HBM floor on each target arch, for one
    short request and for full launches at 4K and 32K (past a window, a request reads no
    more)."""
    full = lay.serving.chunk_reqs
    out = []
    for r, ctx in ((1, 1024), (full, 4096), (full, 32768)):
        b = launch_bytes(lay, r, ctx)
        floor = {a: round(b["total"] / arch_info(a).hbm_bytes_per_s * 1e6, 1) for a in lay.archs}
        out.append({"requests": r, "context": ctx, **b, "hbm_floor_us": floor})
    return out


@click.group()
def layouts() -> None:
    """Layout specs: the model geometries the kernels are specialised on."""


@layouts.command("list")
@json_option
def list_cmd(as_json: bool) -> None:
    """The shipped layouts."""
    rows = [_summary(load_layout(p)) for p in shipped_layout_paths()]
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        targets = " ".join(f"{a}:{n}" for a, n in r["targets"].items())
        click.echo(f"{r['name']}  {r['digest'][:12]}  {targets}  {r['description']}")


@layouts.command("show")
@click.argument("name")
@json_option
def show_cmd(name: str, as_json: bool) -> None:
    """One layout (shipped NAME or a PATH): its fields, derived constants and digest."""
    lay = resolve_layout(name)
    doc = {
        **_summary(lay),
        "spec": lay.model_dump(),
        "derived": _derived(lay),
        "canonical": lay.canonical(),
    }
    if as_json:
        emit_json(doc)
        return
    click.echo(f"{lay.name}  digest {lay.digest}")
    for section in ("model", "parallel", "serving", "weights", "kernel"):
        for k, v in getattr(lay, section).model_dump().items():
            click.echo(f"  {section}.{k} = {v}")
    for a in lay.archs:
        click.echo(f"  targets.{a}.ctas = {lay.targets[a].ctas}")
    click.echo("derived:")
    for k, v in doc["derived"].items():
        if k != "launch":
            click.echo(f"  {k} = {v}")
    click.echo("per launch and rank (HBM bytes, and the floor at each arch's bandwidth):")
    for row in doc["derived"]["launch"]:
        floors = ", ".join(f"{a} {us} us" for a, us in row["hbm_floor_us"].items())
        click.echo(
            f"  {row['requests']} requests at context {row['context']}: weights {row['weights']:,}"
            f" + scales {row['scales']:,} + K/V {row['kv']:,} = {row['total']:,} B; {floors}"
        )
    click.echo(f"canonical (sha256 = digest): {lay.canonical_json()}")


@layouts.command("validate")
# no click.Path checks: load_layout reports a directory or unreadable file as that file's
# problem, so the other files are still checked and --json still prints every result
@click.argument("paths", nargs=-1, required=True)
@json_option
def validate_cmd(paths: tuple[str, ...], as_json: bool) -> None:
    """Check spec files; one line per problem (file: field: rule), exit 2 if any."""
    results, problems = [], []
    for p in paths:
        try:
            lay = load_layout(p)
            results.append({"path": p, "ok": True, "name": lay.name, "digest": lay.digest})
        except LayoutError as e:
            results.append({"path": p, "ok": False, "problems": e.problems})
            problems += e.problems
    if as_json:
        emit_json(results)
    else:
        for r in results:
            if r["ok"]:
                click.echo(f"ok  {r['path']}  {r['name']}  {r['digest'][:12]}")
    if problems:
        raise LayoutError(problems)


@layouts.command("schema")
def schema_cmd() -> None:
    """Print the JSON Schema of a layout spec."""
    emit_json(json_schema())
