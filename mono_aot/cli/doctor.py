"""``mono-aot doctor``: what this machine has for building and serving, and how to fix gaps."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys

import click

from mono_aot import __version__
from mono_aot.cli._common import emit_json, json_option
from mono_aot.compiler.toolchain import HOW_TO_GET_A_LINKER, discover
from mono_aot.keys.sources import kernel_source_digest
from mono_aot.spec.errors import EXIT_FAILED, ToolchainError
from mono_aot.store.packs import installed_packs
from mono_aot.store.paths import (
    PACK_ENTRY_POINT_GROUP,
    extra_store_roots,
    is_writable_dir,
    user_cache_root,
)


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _store_row(layer: str, root) -> dict:
    # a file (or a path through one) can never hold a store: say so, not "not created yet"
    blocked = next((p for p in (root, *root.parents) if p.exists()), None)
    not_a_dir = str(blocked) if blocked is not None and not blocked.is_dir() else None
    return {
        "layer": layer,
        "root": str(root),
        "exists": root.is_dir(),
        "writable": is_writable_dir(root),
        "not_a_directory": not_a_dir,
    }


def collect() -> dict:
    """Everything doctor reports, as data (the text view and --json share it)."""
    missing: list[dict[str, str]] = []
    torch_v = _version("torch")
    if torch_v is None:
        missing.append({"what": "torch", "fix": "pip install torch"})
    flydsl_v = _version("flydsl")
    if flydsl_v is None:
        missing.append(
            {
                "what": "flydsl (needed to build, not to serve)",
                "fix": "pip install 'mono-aot[build]'",
            }
        )
    for dist in ("msgpack", "pyelftools"):
        if _version(dist) is None:
            missing.append(
                {"what": f"{dist} (needed to build)", "fix": "pip install 'mono-aot[build]'"}
            )

    try:
        found = discover()
        linker = found.linker
        skipped = found.skipped
    except ToolchainError as e:
        linker, skipped = None, [str(e)]
    if linker is None:
        missing.append({"what": "ld.lld >= 19 (needed to build)", "fix": HOW_TO_GET_A_LINKER})

    stores = [_store_row("MONO_AOT_PATH", p) for p in extra_store_roots()]
    cache = user_cache_root()
    stores.append(_store_row("user cache", cache))
    if not stores[-1]["writable"]:
        blocked = stores[-1]["not_a_directory"]
        why = f": {blocked} is not a directory" if blocked else ""
        missing.append(
            {
                "what": f"a writable user cache ({cache}{why})",
                "fix": "set MONO_AOT_CACHE_DIR to a writable folder",
            }
        )
    try:
        digest = kernel_source_digest()
    except (OSError, ValueError) as e:  # an install whose kernel sources cannot be read
        digest = None
        missing.append({"what": f"the kernel source digest ({e})", "fix": "reinstall mono-aot"})
    packs = [p.as_json(digest) for p in installed_packs()]
    return {
        "mono_aot": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch_v,
        "flydsl": flydsl_v,
        "linker": None
        if linker is None
        else {
            "source": linker.source,
            "version": linker.version,
            "binary": str(linker.binary),
            "sha256": linker.sha256,
        },
        "linker_skipped": skipped,
        "stores": stores,
        "kernel_sources": digest,
        "pack_group": PACK_ENTRY_POINT_GROUP,
        "packs": packs,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MONO_AOT_")},
        "missing": missing,
    }


@click.command()
@json_option
@click.option(
    "--build", "for_build", is_flag=True, help="Exit 1 unless everything a build needs is present."
)
def doctor(as_json: bool, for_build: bool) -> None:
    """Versions, linker, store locations and what is missing (with the command that fixes it)."""
    doc = collect()
    if as_json:
        emit_json(doc)
    else:
        click.echo(f"mono-aot {doc['mono_aot']}  python {doc['python']}  {doc['platform']}")
        click.echo(f"torch   {doc['torch'] or 'missing'}")
        click.echo(f"flydsl  {doc['flydsl'] or 'missing'}")
        ln = doc["linker"]
        if ln:
            click.echo(f"linker  {ln['version']}  ({ln['source']}: {ln['binary']})")
        else:
            click.echo("linker  missing")
        for s in doc["linker_skipped"]:
            click.echo(f"        skipped {s}")
        for s in doc["stores"]:
            state = "writable" if s["writable"] else "read-only"
            exists = "" if s["exists"] else " (not created yet)"
            if s["not_a_directory"]:
                state, exists = "unusable", f" ({s['not_a_directory']} is not a directory)"
            click.echo(f"store   {s['layer']}: {s['root']}  {state}{exists}")
        for p in doc["packs"]:
            dist = f"{p['dist']} {p['dist_version']}" if p["dist"] else p["value"]
            if p["status"] == "served":
                built = (
                    f"mono-aot {p['mono_aot']}, kernel sources {p['kernel_sources'][:16]}, "
                    f"{p['entries']} entries"
                    if p["mono_aot"]
                    else "no pack index"
                )
                click.echo(f"pack    {p['name']}: {dist}  served  ({built}; {p['root']})")
            else:
                click.echo(f"pack    {p['name']}: {dist}  skipped: {p['reason']}")
        for m in doc["missing"]:
            click.echo(f"missing {m['what']}: {m['fix']}")
        if not doc["missing"]:
            click.echo("nothing missing")
    if for_build and doc["missing"]:
        sys.exit(EXIT_FAILED)
