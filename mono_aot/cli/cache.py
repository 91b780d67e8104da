"""``mono-aot cache``: list, show, verify, gc, explain and clear the artifact store.

Keys may be abbreviated to a unique prefix of at least 4 hex digits, as git does.
Exit codes: 0 ok, 1 something is corrupt or missing (verify) or an operation failed,
2 bad input (unknown or ambiguous key, bad SIZE, clear without --yes off a terminal).
"""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from mono_aot.cli._common import emit_json, json_option
from mono_aot.spec.errors import EXIT_FAILED, BadInput, MonoError
from mono_aot.spec.util import HEX64
from mono_aot.store import Store
from mono_aot.store.layer import MISSING

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class SizeType(click.ParamType):
    """Bytes: ``1024``, ``500K``, ``500M``, ``2G``, ``1.5T`` (binary units; ``MB``/``MiB`` too)."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        m = _SIZE.fullmatch(str(value).strip())
        if not m:
            self.fail(f"{value!r} is not a size (examples: 1024, 500M, 2G)", param, ctx)
        return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _store(ctx: click.Context) -> Store:
    return ctx.obj["store"]


@click.group()
@click.option(
    "--store",
    "store_dir",
    type=click.Path(file_okay=False),
    help="Use this store root alone instead of MONO_AOT_PATH, the user cache and packs.",
)
@click.pass_context
def cache(ctx: click.Context, store_dir: str | None) -> None:
    """The artifact store: MONO_AOT_PATH roots, the user cache, installed packs."""
    ctx.ensure_object(dict)
    if store_dir is not None and not store_dir.strip():
        # Path("") is the working directory: never let `clear --yes` empty that by accident
        raise BadInput("--store: empty path (omit --store to use the layers)")
    ctx.obj["store"] = Store.at(Path(store_dir)) if store_dir is not None else Store.default()


@cache.command("ls")
@json_option
@click.pass_context
def ls_cmd(ctx: click.Context, as_json: bool) -> None:
    """List the entries of every layer.

    In lookup order; a shadowed entry (an earlier layer has the key) is never served.
    """
    store = _store(ctx)
    rows = []
    for item in store.listing():
        if item.entry is None:
            click.echo(
                f"mono-aot: {item.problem.message()} (run `mono-aot cache verify`)", err=True
            )
            continue
        e = item.entry
        rows.append(
            {
                "key": e.key,
                "variant": e.variant,
                "arch": e.arch,
                "layout": e.layout,
                "size": e.blob.size,
                "layer": item.layer.label,
                "root": str(item.layer.root),
                "shadowed": item.shadowed,
            }
        )
    if as_json:
        emit_json(rows)
        return
    if rows:
        w = max(len(r["layout"]) for r in rows)
        click.echo(
            f"{'KEY':<16}  {'VARIANT':<7}  {'ARCH':<7}  {'LAYOUT':<{w}}  {'SIZE':>10}  LAYER"
        )
        for r in rows:
            note = "  (shadowed)" if r["shadowed"] else ""
            click.echo(
                f"{r['key'][:16]}  {r['variant']:<7}  {r['arch']:<7}  {r['layout']:<{w}}  "
                f"{human(r['size']):>10}  {r['layer']}{note}"
            )
    click.echo(f"{len(rows)} entries; layers (lookup order):")
    for layer in store.layers:
        missing = "" if layer.base.is_dir() else ", empty"
        click.echo(
            f"  {layer.label}: {layer.root} "
            f"({'writable' if layer.writable else 'read-only'}{missing})"
        )


@cache.command("show")
@click.argument("key")
@json_option
@click.pass_context
def show_cmd(ctx: click.Context, key: str, as_json: bool) -> None:
    """Show one entry and check its blob.

    KEY may be a unique prefix. Writes nothing; exit 1 if the blob fails verification.
    """
    store = _store(ctx)
    key = store.resolve_prefix(key)
    found = store.find_entry(key)
    if found is None:
        raise MonoError(f"{key} has no intact entry (run `mono-aot cache verify {key[:12]}`)")
    layer, e = found
    _, _, problem = layer.read_blob(e.blob.sha256, e.blob.size, key)
    blob_status = "verified" if problem is None else f"FAILED: {problem.reason}"
    if as_json:
        emit_json(
            {
                "key": key,
                "layer": layer.as_json(),
                "entry_path": str(layer.entry_path(key)),
                "blob_path": str(layer.blob_path(e.blob.sha256)),
                "blob_status": blob_status,
                "entry": e.model_dump(mode="json"),
            }
        )
    else:
        click.echo(f"key      {key}")
        click.echo(f"layer    {layer.describe()}")
        click.echo(f"variant  {e.variant}   arch {e.arch}   layout {e.layout}")
        click.echo(f"symbol   {e.symbol}")
        click.echo(f"blob     {e.blob.sha256}  {e.blob.size} bytes  {blob_status}")
        ln = e.launch
        click.echo(f"launch   grid {ln.grid}  block {ln.block}  dynamic LDS {ln.dynamic_lds}")
        click.echo(
            f"kernargs {e.kernarg_segment_size} bytes: "
            + ", ".join(f"{k.name}@{k.offset}+{k.size}" for k in e.kernargs)
        )
        click.echo(
            "resources " + "  ".join(f"{k}={v}" for k, v in e.resources.model_dump().items())
        )
        click.echo(
            f"elf      machine {e.elf.machine}  osabi {e.elf.osabi}  abi {e.elf.abi_version}"
            f"  e_flags {e.elf.e_flags:#x}"
        )
        p = e.provenance
        click.echo(
            f"built    {p.built_at} in {p.build_seconds:.1f}s by mono-aot "
            f"{p.mono_aot_version}, FlyDSL {p.flydsl_version}, {p.linker_version}"
        )
    if problem is not None:
        raise MonoError(f"blob of {key} failed verification: {problem.reason}")


@cache.command("verify")
@click.argument("keys", nargs=-1)
@click.option(
    "--all",
    "all_layers",
    is_flag=True,
    help="Every entry and blob of every layer, shadowed and unreferenced ones too.",
)
@json_option
@click.pass_context
def verify_cmd(ctx: click.Context, keys: tuple[str, ...], all_layers: bool, as_json: bool) -> None:
    """Check digests and sizes; exit 1 on damage.

    Default: every key (or the KEYS given) as a lookup resolves it. Exit 1 if anything is
    corrupt or missing, with the list. Damaged files in writable layers are moved to
    quarantine, as a lookup would.
    """
    store = _store(ctx)
    wanted = None
    if keys:
        wanted = [k if HEX64.fullmatch(k) else store.resolve_prefix(k) for k in keys]
    report = store.verify(wanted, all_layers=all_layers)
    if as_json:
        emit_json(
            {
                "ok": report.ok,
                "problems": [p.as_json() for p in report.problems],
                "skipped": [p.as_json() for p in report.skipped],
            }
        )
    else:
        for p in report.skipped:
            click.echo(f"skipped  {p.message()}")
        for p in report.problems:
            label = "MISSING" if p.kind == MISSING else p.kind.upper()
            click.echo(f"{label}  {p.message()}")
        click.echo(
            f"{report.ok} verified, {len(report.problems)} problems"
            + (f", {len(report.skipped)} of another schema version" if report.skipped else "")
        )
    if report.problems:
        sys.exit(EXIT_FAILED)


@cache.command("gc")
@click.option(
    "--max-size",
    required=True,
    type=SizeType(),
    help="Shrink each writable layer to at most SIZE (1024, 500M, 2G; binary units).",
)
@click.option("--dry-run", is_flag=True, help="List exactly what gc would remove; remove nothing.")
@json_option
@click.pass_context
def gc_cmd(ctx: click.Context, max_size: int, dry_run: bool, as_json: bool) -> None:
    """Remove garbage, then least recently used entries.

    Garbage: temp files of killed publishers, quarantined files, damaged entries, blobs no
    entry needs. Read-only layers are never touched.
    """
    plans = _store(ctx).gc(max_size, dry_run=dry_run)
    if as_json:
        emit_json({"dry_run": dry_run, "layers": [p.as_json() for p in plans]})
        return
    verb = "would remove" if dry_run else "removed"
    for plan in plans:
        click.echo(f"{plan.layer.label} {plan.layer.root}: {human(plan.size_before)}")
        for r in plan.removals:
            used = ""
            if r.last_use is not None:
                used = "  last used " + datetime.fromtimestamp(r.last_use, UTC).strftime(
                    "%Y-%m-%d %H:%M:%SZ"
                )
            click.echo(f"  {verb} {r.kind:<13} {r.path}  {r.size}{used}")
        for note in plan.notes:
            click.echo(f"  note: {note}")
        click.echo(
            f"  {verb} {len(plan.removals)} files, {human(plan.freed)}; "
            f"{human(plan.size_after)} left (max {human(max_size)})"
        )


def _flatten(doc: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(doc, dict) and doc:
        for k in sorted(doc):
            _flatten(doc[k], f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(doc, list) and doc:
        for i, v in enumerate(doc):
            _flatten(v, f"{prefix}[{i}]", out)
    else:
        out[prefix] = doc
    return out


def _inputs(store: Store, key: str) -> dict[str, Any]:
    found = store.find_entry(key)
    if found is None:
        raise MonoError(f"{key} has no intact entry (run `mono-aot cache verify {key[:12]}`)")
    e = found[1]
    return _flatten(e.build_inputs, "build", _flatten(e.lookup_inputs, "lookup", {}))


_ABSENT = object()


def _show(v: Any) -> str:
    return "(absent)" if v is _ABSENT else repr(v) if isinstance(v, str) else str(v)


@cache.command("explain")
@click.argument("key")
@click.argument("other", required=False)
@json_option
@click.pass_context
def explain_cmd(ctx: click.Context, key: str, other: str | None, as_json: bool) -> None:
    """Every input of a key, or what two keys differ in.

    lookup.* are what the runtime hashes, build.* the toolchain; with OTHER, only the inputs
    that differ between KEY and OTHER.
    """
    store = _store(ctx)
    key = store.resolve_prefix(key)
    a = _inputs(store, key)
    if other is None:
        if as_json:
            emit_json({"key": key, "inputs": a})
            return
        click.echo(f"key {key}")
        for k, v in a.items():
            click.echo(f"  {k} = {_show(v)}")
        return
    other = store.resolve_prefix(other)
    b = _inputs(store, other)
    names = [*a, *(k for k in b if k not in a)]
    diff = {
        k: (a.get(k, _ABSENT), b.get(k, _ABSENT))
        for k in names
        if a.get(k, _ABSENT) != b.get(k, _ABSENT)
    }
    if as_json:
        emit_json(
            {
                "keys": [key, other],
                "differ": {
                    k: {
                        "a": None if x is _ABSENT else x,
                        "b": None if y is _ABSENT else y,
                        "in": [n for n, v in (("a", x), ("b", y)) if v is not _ABSENT],
                    }
                    for k, (x, y) in diff.items()
                },
            }
        )
        return
    click.echo(f"a {key}\nb {other}")
    if not diff:
        click.echo("  no input differs (same inputs, so the two keys were computed differently)")
    for k, (x, y) in diff.items():
        click.echo(f"  {k}: {_show(x)} -> {_show(y)}")


@cache.command("clear")
@click.option("--yes", is_flag=True, help="Do not ask (needed when stdin is not a terminal).")
@click.pass_context
def clear_cmd(ctx: click.Context, yes: bool) -> None:
    """Empty the writable layer(s).

    Removes every entry, blob and quarantined file (lock files stay); read-only layers are
    untouched. Off a terminal, --yes is required (exit 2 otherwise).
    """
    store = _store(ctx)
    targets = [layer for layer in store.layers if layer.writable]
    where = ", ".join(str(layer.root) for layer in targets) or "(no writable layer)"
    if not yes:
        if not sys.stdin.isatty():
            raise BadInput(f"refusing to clear {where} without --yes (stdin is not a terminal)")
        click.confirm(f"remove every entry and blob in {where}?", abort=True)
    for done in store.clear():
        click.echo(f"cleared {done.layer.root}: {done.files} files, {human(done.bytes)}")
