"""What a store miss does at serving time.

``MONO_AOT_STRICT=1``: an error naming the key, layout, arch and the prebuild command.
Otherwise, when the build extra (FlyDSL) is installed, ``mono-aot build`` runs as a subprocess
into the user cache, with a warning: the runtime never imports the compiler, and the build's
per-key single-flight lock makes ranks starting together compile each kernel once. Without a
compiler the miss is ``MonoUnsupported`` with the same text.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import warnings
from typing import TYPE_CHECKING

from mono_aot.spec.errors import MonoError, MonoUnsupported

if TYPE_CHECKING:
    from mono_aot.spec.layouts import Layout
    from mono_aot.store import Hit, Store

STRICT_ENV = "MONO_AOT_STRICT"
JIT_TIMEOUT_S = 3600.0
log = logging.getLogger("mono_aot.runtime")


class KernelMissing(MonoError):
    """Strict mode: no prebuilt code object for a key."""


class JitBuildWarning(UserWarning):
    """A kernel was missing from every store layer and is compiled just in time."""


def prebuild_command(layout: Layout, arch: str, variant: str) -> str:
    return f"mono-aot build --layout {layout.name} --arch {arch} --variant {variant}"


def compiler_available() -> bool:
    """Whether ``mono-aot build`` can run here, found without importing FlyDSL."""
    return importlib.util.find_spec("flydsl") is not None


def _shipped_name(layout: Layout) -> str | None:
    """The shipped layout name that generates exactly ``layout``'s code, if any."""
    from mono_aot.spec.errors import LayoutError
    from mono_aot.spec.layouts import resolve_layout

    try:
        shipped = resolve_layout(layout.name)
    except LayoutError:
        return None
    same = shipped.digest == layout.digest and shipped.targets == layout.targets
    return layout.name if same else None


def run_build(
    layout: str,
    arch: str,
    variants: list[str],
    env: dict[str, str],
    *,
    timeout: float,
    extra: list[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``mono-aot build`` in a subprocess (the runtime never imports the compiler); its
    per-key lock makes concurrent callers compile each key once. ``MonoError`` on a failure or
    a timeout, naming the command and the tail of its output."""
    argv = [sys.executable, "-m", "mono_aot", "build", "--layout", layout, "--arch", arch]
    for v in variants:
        argv += ["--variant", v]
    argv += extra or []
    cmd = " ".join(["mono-aot", *argv[3:]])
    try:
        p = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise MonoError(f"the build ({cmd}) ran over {timeout:g} s") from None
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
        raise MonoError(
            f"the build ({cmd}) failed with exit code {p.returncode}: " + " | ".join(tail)
        )
    return p


# the env values Store.default reads (its layers) -> the Store: packs are found once per
# process, as vLLM finds its plugins (scanning every installed distribution's entry points
# costs more than a whole verified lookup)
_SERVED: dict[tuple[str | None, ...], Store] = {}
_STORE_ENV = ("MONO_AOT_PATH", "MONO_AOT_CACHE_DIR", "XDG_CACHE_HOME", "HOME")


def served_store(env: dict[str, str]) -> Store:
    """The store layers serving looks in: packs built from other kernel sources are skipped
    (and named once), since none of their keys could be the ones this install computes."""
    from mono_aot.keys.sources import kernel_source_digest
    from mono_aot.store import Store

    digest = kernel_source_digest()
    token = (digest, *(env.get(k) for k in _STORE_ENV))
    store = _SERVED.get(token)
    if store is None:
        store = _SERVED[token] = Store.default(env, kernel_sources=digest)
    return store


def find_or_build(
    key: str,
    variant: str,
    layout: Layout,
    arch: str,
    *,
    store: Store | None = None,
    env: dict[str, str] | None = None,
) -> Hit:
    """The verified hit for ``key``, applying the miss policy."""
    env = dict(os.environ if env is None else env)
    store = store if store is not None else served_store(env)
    hit = store.lookup(key)
    if hit is not None:
        return hit
    cmd = prebuild_command(layout, arch, variant)
    text = (
        f"no prebuilt {variant} kernel for layout {layout.name} on {arch} (key {key}; "
        f"{store.miss_message(key)}); prebuild it with: {cmd}"
    )
    if env.get(STRICT_ENV, "") not in ("", "0"):
        raise KernelMissing(f"{STRICT_ENV}=1: {text}")
    if not compiler_available():
        raise MonoUnsupported(
            f"{text} (no compiler here to build it just in time: pip install 'mono-aot[build]')"
        )
    warnings.warn(
        f"{text}; building it just in time into the user cache", JitBuildWarning, stacklevel=3
    )
    from mono_aot.spec.layouts import write_spec

    with tempfile.TemporaryDirectory(prefix="mono-aot-jit-") as tmp:
        # a shipped layout by name; any other (a spec file elsewhere, one made in memory) by a
        # spec file that loads back into exactly this layout
        spec = _shipped_name(layout) or str(write_spec(layout, tmp))
        p = run_build(spec, arch, [variant], env, timeout=JIT_TIMEOUT_S, extra=["-j", "1"])
    for line in p.stdout.strip().splitlines():
        log.info("just-in-time build: %s", line)
    hit = served_store(env).lookup(key)
    if hit is None:
        raise MonoError(f"the just-in-time build ({cmd}) succeeded but key {key} is still missing")
    return hit
