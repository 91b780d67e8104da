"""``mono-aot coverage``: every key the runtime will look up, and the layer that serves it.

Serving-side only (spec, keys, store): it works on an install without the build extra and
writes nothing when every key is served.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from mono_aot import __version__
from mono_aot.cli._common import arch_option, emit_json, json_option, layout_option
from mono_aot.spec.errors import EXIT_FAILED, BadInput


def select(arches: Sequence[str], names: Sequence[str]) -> list[tuple[str, object, str]]:
    """(layout argument, Layout, arch) pairs to check. Named layouts must target every named
    arch; the shipped ones are filtered by it (an arch that none targets is bad input)."""
    from mono_aot.spec.arch import SUPPORTED_ARCHS
    from mono_aot.spec.layouts import resolve_layout, shipped_layouts

    for a in arches:
        if a not in SUPPORTED_ARCHS:
            raise BadInput(
                f"unknown arch (supported: {', '.join(SUPPORTED_ARCHS)})", field="arch", value=a
            )
    if names:
        lays = [(n, resolve_layout(n)) for n in dict.fromkeys(names)]
        for n, lay in lays:
            for a in arches:
                if a not in lay.targets:
                    raise BadInput(
                        f"layout {n} does not target {a} (it targets {', '.join(lay.archs)})"
                    )
    else:
        lays = [(lay.name, lay) for lay in shipped_layouts()]
        if not lays:
            raise BadInput("no layouts: none are shipped and none was named")
        for a in arches:
            if not any(a in lay.targets for _, lay in lays):
                raise BadInput("no shipped layout targets it", field="arch", value=a)
    out = []
    for n, lay in lays:
        for a in dict.fromkeys(arches) if arches else lay.archs:
            if a in lay.targets:
                out.append((n, lay, a))
    return out


@click.command("coverage")
@arch_option("Check")
@layout_option()
@json_option
def coverage(archs, layouts, as_json) -> None:
    """Every key the runtime looks up for these layouts, archs and variants, and who serves it.

    Exit status: 0 every key is served, 1 any is not (each named, with the command that builds
    it), 2 bad input.
    """
    from mono_aot.keys import served_key
    from mono_aot.keys.sources import kernel_source_digest
    from mono_aot.store import Store

    targets = select(archs, layouts)
    digest = kernel_source_digest()
    store = Store.default(kernel_sources=digest)
    rows = []
    for name, lay, arch in targets:
        for variant in lay.variants():
            key = served_key(variant, lay, arch)
            hit = store.lookup(key)
            rows.append(
                {
                    "layout": lay.name,
                    "layout_arg": name,
                    "arch": arch,
                    "ctas": lay.ctas(arch),
                    "variant": variant,
                    "key": key,
                    "served": hit is not None,
                    "layer": None if hit is None else hit.layer.label,
                    "root": None if hit is None else str(hit.layer.root),
                }
            )
    missing = [r for r in rows if not r["served"]]
    if as_json:
        emit_json(
            {
                "mono_aot": __version__,
                "kernel_sources": digest,
                "layers": [layer.as_json() for layer in store.layers],
                "keys": rows,
                "missing": len(missing),
            }
        )
    else:
        for r in rows:
            state = "served " if r["served"] else "MISSING"
            where = f"{r['layer']} {r['root']}" if r["served"] else "-"
            click.echo(
                f"{state} {r['layout']}/{r['arch']}/{r['variant']}  {r['key'][:16]}  {where}"
            )
        click.echo(f"{len(rows) - len(missing)} of {len(rows)} keys served")
    if missing:
        for r in missing:
            click.echo(
                f"mono-aot: not served: {r['layout']}/{r['arch']}/{r['variant']} key {r['key']}; "
                f"build it: mono-aot build --arch {r['arch']} --layout {r['layout_arg']} "
                f"--variant {r['variant']}, or install mono-aot-kernels-{r['arch']} "
                f"{__version__} (made by: mono-aot pack --arch {r['arch']})",
                err=True,
            )
        sys.exit(EXIT_FAILED)
