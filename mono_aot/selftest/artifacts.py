"""The code objects the selftest runs: the stored ones, found by the runtime's lookup key.

Before any rank starts, the parent looks every needed kernel up in the store layers (the keys
``mono_aot.keys.served_key`` computes, exactly what ``load_launcher`` will look up in the
ranks). A miss follows the runtime's policy (``mono_aot.runtime.miss``): ``MONO_AOT_STRICT=1``
is an error naming each missing key and its prebuild command; otherwise the parent runs one
``mono-aot build`` for all of them (it needs FlyDSL and a linker), into the user cache, and the
ranks then load only hits (they run with ``MONO_AOT_STRICT=1``, so no rank ever compiles).

The dead-rank check needs kernels whose every wait gives up after a short time: the layout
with a short ``peer_wait_s``. That is another layout (its wait ticks are in the key), written
to a spec file for ``mono-aot build --layout PATH``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mono_aot.spec.errors import MonoError, MonoUnsupported
from mono_aot.spec.layouts import write_spec

if TYPE_CHECKING:
    from mono_aot.spec.layouts import Layout
    from mono_aot.store import Store

BUILD_TIMEOUT_S = 3600.0


def short_wait_layout(layout: Layout, seconds: float) -> Layout:
    """``layout`` with every wait bounded by ``seconds``: its own kernels, its own keys (or
    ``layout`` itself when its bound is already that short)."""
    from mono_aot.spec.layouts import parse_layout

    if layout.serving.peer_wait_s <= seconds:
        return layout
    doc = layout.model_dump(mode="json")
    doc["serving"]["peer_wait_s"] = float(seconds)
    us = round(seconds * 1e6)
    doc["name"] = (
        f"{layout.name}-wait{us // 1000}ms" if us % 1000 == 0 else f"{layout.name}-wait{us}us"
    )
    doc["description"] = f"{layout.name} with a {seconds:g} s wait bound (selftest dead-rank)"
    return parse_layout(doc, f"{layout.name} with peer_wait_s = {seconds:g}")


@dataclass(frozen=True)
class Need:
    """One kernel the selftest runs."""

    layout: Layout
    variant: str
    shipped: bool  # a shipped layout (built by name) or one of the selftest's own (by path)

    def key(self, arch: str) -> str:
        from mono_aot.keys import served_key

        return served_key(self.variant, self.layout, arch)


def _shipped(layout: Layout) -> bool:
    """Whether ``layout`` is the shipped layout of its name (built by name) or a spec of its own
    (built from a spec file written for it)."""
    from mono_aot.spec.layouts import resolve_layout

    try:
        return resolve_layout(layout.name).digest == layout.digest
    except MonoError:
        return False


def needs(layout: Layout, short: Layout | None) -> list[Need]:
    out = [Need(layout, v, _shipped(layout)) for v in layout.variants()]
    if short is not None:
        out += [Need(short, v, False) for v in short.variants()]
    return out


def _command(need: Need, arch: str, spec: str) -> str:
    return f"mono-aot build --layout {spec} --arch {arch} --variant {need.variant}"


def ensure_kernels(
    wanted: Sequence[Need],
    arch: str,
    workdir: Path,
    *,
    log: Callable[[str], None] = lambda s: None,
    env: Mapping[str, str] | None = None,
    store: Store | None = None,
) -> dict[str, str]:
    """Every wanted kernel in the store (built once here on a miss, unless strict); returns
    ``{"<layout>/<variant>": "hit <layer>" | "built"}``."""
    from mono_aot.runtime.miss import STRICT_ENV, JitBuildWarning, compiler_available, run_build
    from mono_aot.store import Store

    env = dict(os.environ if env is None else env)
    store = store if store is not None else Store.default(env)
    status: dict[str, str] = {}
    missing: list[tuple[Need, str]] = []
    for need in wanted:
        key = need.key(arch)
        hit = store.lookup(key)
        name = f"{need.layout.name}/{need.variant}"
        if hit is None:
            missing.append((need, key))
        else:
            status[name] = f"hit ({hit.layer.label})"
    if not missing:
        return status
    specs = {
        n.layout.name: (n.layout.name if n.shipped else str(write_spec(n.layout, workdir)))
        for n, _ in missing
    }
    lines = [
        f"{n.layout.name} {n.variant} on {arch} (key {key}): {_command(n, arch, specs[n.layout.name])}"
        for n, key in missing
    ]
    if env.get(STRICT_ENV, "") not in ("", "0"):
        raise MonoError(
            f"{STRICT_ENV}=1 and {len(missing)} kernel(s) the selftest runs are not prebuilt "
            "(the dead-rank kernels are the layout with a short peer_wait_s; run the selftest "
            "once without strict mode to build them): " + "; ".join(lines)
        )
    if not compiler_available():
        raise MonoUnsupported(
            f"{len(missing)} kernel(s) the selftest runs are not in any store and there is no "
            "compiler here to build them (pip install 'mono-aot[build]', or prebuild on a build "
            "host and point MONO_AOT_PATH at that store): " + "; ".join(lines)
        )
    warnings.warn(
        "building just in time, once for all ranks, into the user cache: " + "; ".join(lines),
        JitBuildWarning,
        stacklevel=2,
    )
    by_layout: dict[str, list[Need]] = {}
    for n, _ in missing:
        by_layout.setdefault(specs[n.layout.name], []).append(n)
    for spec, group in by_layout.items():
        log(f"building {', '.join(n.variant for n in group)} of {group[0].layout.name} ...")
        run_build(spec, arch, [n.variant for n in group], env, timeout=BUILD_TIMEOUT_S)
    for n, key in missing:
        if store.lookup(key) is None:
            raise MonoError(
                f"the build succeeded but key {key} ({n.layout.name} {n.variant}) is still missing"
            )
        status[f"{n.layout.name}/{n.variant}"] = "built"
    return status
