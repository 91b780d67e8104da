"""The build plan: selected layouts x archs x variants, each with its key and build inputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from mono_aot.compiler.compile import options_identity
from mono_aot.compiler.inputs import build_inputs, installed_package_digest
from mono_aot.compiler.toolchain import Linker, find_linker
from mono_aot.keys import Provider, key_of, lookup_inputs
from mono_aot.spec.abi import kernarg_layout
from mono_aot.spec.arch import SUPPORTED_ARCHS
from mono_aot.spec.errors import BadInput, MonoError, ToolchainError
from mono_aot.spec.layouts import VARIANTS, Layout, resolve_layout, shipped_layouts


@dataclass(frozen=True)
class Toolchain:
    """The FlyDSL install and the linker every job of a build uses."""

    flydsl_version: str
    flydsl_sha256: str
    flydsl_files: int
    linker: Linker

    def flydsl_identity(self) -> dict[str, Any]:
        return {"version": self.flydsl_version, "files_sha256": self.flydsl_sha256}


@lru_cache(maxsize=1)
def _flydsl_digest() -> tuple[str, str, int]:
    from importlib import metadata

    try:
        return installed_package_digest("flydsl")
    except metadata.PackageNotFoundError:
        raise ToolchainError(
            "FlyDSL is not installed: install the build extra (pip install 'mono-aot[build]')"
        ) from None


def current_toolchain(linker: Linker | None = None) -> Toolchain:
    """Identify the toolchain without importing FlyDSL (its installed files are hashed)."""
    version, digest, n = _flydsl_digest()
    return Toolchain(version, digest, n, linker or find_linker())


@dataclass(frozen=True)
class Job:
    layout: Layout
    arch: str
    variant: str
    key: str
    lookup_inputs: dict[str, Any] = field(repr=False)
    build_inputs: dict[str, Any] = field(repr=False)

    @property
    def name(self) -> str:
        return f"{self.layout.name}/{self.arch}/{self.variant}"

    def as_json(self) -> dict[str, Any]:
        return {
            "layout": self.layout.name,
            "arch": self.arch,
            "variant": self.variant,
            "ctas": self.layout.ctas(self.arch),
            "key": self.key,
        }


def select_layouts(names: Sequence[str]) -> list[Layout]:
    """``--layout NAME|PATH`` values, or every shipped layout; duplicates by name refused."""
    lays = [resolve_layout(n) for n in names] if names else shipped_layouts()
    if not lays:
        raise BadInput("no layouts: none are shipped and none was named")
    seen: dict[str, Layout] = {}
    for lay in lays:
        if lay.name in seen and seen[lay.name] != lay:
            raise BadInput(f"two different layouts are both named {lay.name!r}")
        seen[lay.name] = lay
    return list(seen.values())


def plan_jobs(
    layouts: Sequence[Layout],
    archs: Sequence[str],
    variants: Sequence[str],
    provider: Provider,
    toolchain: Toolchain,
) -> list[Job]:
    """One job per (layout, arch, variant); BadInput names the layout and arch or variant."""
    for a in archs:
        if a not in SUPPORTED_ARCHS:
            raise BadInput(
                f"unknown arch (supported: {', '.join(SUPPORTED_ARCHS)})", field="arch", value=a
            )
    for v in variants:
        if v not in VARIANTS:
            raise BadInput(
                f"unknown variant (expected one of {', '.join(VARIANTS)})", field="variant", value=v
            )
    try:
        src = provider.source_digest()
    except OSError as e:
        raise MonoError(f"cannot read the kernel sources of {provider.module}: {e}") from None
    jobs = []
    for lay in layouts:
        lay_archs = list(dict.fromkeys(archs)) if archs else list(lay.archs)
        for a in lay_archs:
            if a not in lay.targets:
                raise BadInput(
                    f"layout {lay.name} does not target {a} (it targets {', '.join(lay.archs)})"
                )
        lay_variants = list(dict.fromkeys(variants)) if variants else list(lay.variants())
        for v in lay_variants:
            if v not in lay.variants():
                raise BadInput(
                    f"layout {lay.name} has no {v} kernel (wide_base={lay.serving.wide_base}; "
                    f"its variants: {', '.join(lay.variants())})"
                )
        for a in lay_archs:
            binputs = build_inputs(
                flydsl=toolchain.flydsl_identity(),
                linker=toolchain.linker.identity(),
                options=options_identity(a),
            )
            for v in lay_variants:
                li = lookup_inputs(provider, src, v, lay, a)
                jobs.append(Job(lay, a, v, key_of(li), li, binputs))
    return jobs


def contract_kernargs(provider: Provider, layout: Layout, worker: dict[str, Any]) -> tuple:
    """The (name, offset, size) list the code object must match."""
    if provider.uses_abi_contract:
        return tuple(tuple(t) for t in kernarg_layout(layout.parallel.tp))
    got = worker.get("expected_kernargs")
    if got is None:
        raise MonoError(f"fixture provider {provider.module} declares no expected_kernargs")
    return tuple(tuple(t) for t in got)


def stale_reason(old: dict[str, Any], new: dict[str, Any]) -> str:
    """Which parts of the build inputs differ, for the report."""
    parts = []
    for k in sorted(set(old) | set(new)):
        if old.get(k) != new.get(k):
            o, n = old.get(k), new.get(k)
            if (
                isinstance(o, dict)
                and isinstance(n, dict)
                and "version" in o
                and o.get("version") != n.get("version")
            ):
                parts.append(f"{k} {o.get('version')} -> {n.get('version')}")
            else:
                parts.append(f"{k} changed")
    return ", ".join(parts) or "build inputs changed"
