"""Lookup keys: what the runtime computes with no compiler present (README, "Builds").

The key hashes the key schema, the kernel provider and the digest of its sources, the variant,
the layout's canonical form, the arch and its CTA count. The toolchain that turns those into
bytes is the build inputs' business (``mono_aot.compiler.inputs``). This package imports the
spec and the standard library only, never FlyDSL or the compiler, because the runtime uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mono_aot.keys.sources import Sources, kernel_source_digest, kernel_sources, source_digest
from mono_aot.spec.layouts import Layout
from mono_aot.spec.util import canonical_json, sha256_hex

KEY_SCHEMA_VERSION = 1
REAL_PROVIDER = "mono_aot.kernels"


@dataclass(frozen=True)
class Provider:
    """Where kernels come from: a module the build worker imports, and the files that define it.

    ``sources`` are (relative path, absolute path) pairs; the relative path enters the digest so
    the runtime (which sees the files installed elsewhere) computes the same value.
    ``search_path`` is put first on the worker's ``sys.path`` (fixture providers outside the
    package); it is never part of a key.
    """

    module: str
    sources: Sources
    search_path: Path | None = None
    uses_abi_contract: bool = True  # kernargs must equal mono_aot.spec.abi.kernarg_layout

    def source_digest(self) -> str:
        if self.module == REAL_PROVIDER and self.sources == kernel_sources():
            return kernel_source_digest()
        return source_digest(self.sources)


def real_provider() -> Provider:
    """``mono_aot.kernels`` as installed (``mono_aot.keys.sources``)."""
    return Provider(REAL_PROVIDER, kernel_sources())


def lookup_inputs(
    provider: Provider | str, source_digest_hex: str, variant: str, layout: Layout, arch: str
) -> dict[str, Any]:
    """Everything the lookup key hashes, in a form a person can diff."""
    module = provider.module if isinstance(provider, Provider) else provider
    return {
        "key_schema": KEY_SCHEMA_VERSION,
        "provider": module,
        "kernel_sources": source_digest_hex,
        "variant": variant,
        "layout": layout.canonical(),
        "wait_ticks": layout.wait_ticks,
        "wide_base": layout.serving.wide_base,
        "arch": arch,
        "ctas": layout.ctas(arch),
    }


def key_of(inputs: dict[str, Any]) -> str:
    return sha256_hex(canonical_json(inputs))


def lookup_key(provider: Provider, variant: str, layout: Layout, arch: str) -> str:
    """The key of (variant, layout, arch) of ``provider``."""
    return key_of(lookup_inputs(provider, provider.source_digest(), variant, layout, arch))


def served_key(variant: str, layout: Layout, arch: str) -> str:
    """The key the runtime looks up: the installed real kernels' (no parsing in a wheel)."""
    return key_of(lookup_inputs(REAL_PROVIDER, kernel_source_digest(), variant, layout, arch))


__all__ = [
    "KEY_SCHEMA_VERSION",
    "REAL_PROVIDER",
    "Provider",
    "key_of",
    "lookup_inputs",
    "lookup_key",
    "real_provider",
    "served_key",
    "source_digest",
]
