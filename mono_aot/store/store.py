"""The layered store: lookups in layer order, publishing and single-flight builds."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mono_aot.spec.errors import BadInput, MonoError
from mono_aot.store.entry import Entry
from mono_aot.store.gc import Cleared, GcPlan, clear_layer, gc_layer
from mono_aot.store.layer import (
    CACHE,
    DIR,
    ENTRY_SCHEMA,
    MISSING,
    PACK,
    PATH,
    Hit,
    Layer,
    Problem,
    StoreReadOnly,
    check_key,
)
from mono_aot.store.lock import key_lock
from mono_aot.store.packs import pack_roots
from mono_aot.store.paths import extra_store_roots, is_writable_dir, user_cache_root

BuildFn = Callable[[], tuple[Entry, bytes]]
Accept = Callable[[Entry], bool]
_PREFIX = re.compile(r"[0-9a-f]{4,64}")


@dataclass(frozen=True)
class Listed:
    """One entry file seen by ``Store.listing``: intact (``entry``) or not (``problem``)."""

    layer: Layer
    key: str
    entry: Entry | None
    problem: Problem | None
    shadowed: bool  # an earlier layer serves this key


@dataclass
class VerifyReport:
    ok: int = 0
    problems: list[Problem] = field(default_factory=list)  # damaged, missing or unreadable
    skipped: list[Problem] = field(default_factory=list)  # another schema version: not ours

    def add(self, found: list[Problem]) -> None:
        for p in found:
            (self.skipped if p.kind == ENTRY_SCHEMA else self.problems).append(p)


class Store:
    """An ordered list of layers; lookups take the first intact (and accepted) entry."""

    def __init__(self, layers: Sequence[Layer]) -> None:
        self.layers: tuple[Layer, ...] = tuple(layers)

    @classmethod
    def default(
        cls, env: Mapping[str, str] | None = None, *, kernel_sources: str | None = None
    ) -> Store:
        """``MONO_AOT_PATH`` roots (read-only), the user cache (writable if the filesystem lets
        this user write it), then installed packs (read-only).

        ``kernel_sources``: the installed kernel-source digest
        (``mono_aot.keys.sources.kernel_source_digest()``); packs built from other sources are
        then left out, with one warning each per process. Serving code passes it; without it,
        packs are checked for loading only (their keys still never match another digest's).
        """
        env = dict(os.environ if env is None else env)
        cache = user_cache_root(env)
        layers: list[Layer] = []
        seen = {_real(cache)}
        for root in extra_store_roots(env):
            if _real(root) not in seen:
                seen.add(_real(root))
                layers.append(Layer(root, PATH, False, "MONO_AOT_PATH"))
        layers.append(Layer(cache, CACHE, is_writable_dir(cache), "user cache"))
        for name, root in pack_roots(kernel_sources):
            if _real(root) not in seen:
                seen.add(_real(root))
                layers.append(Layer(root, PACK, False, f"pack {name}"))
        return cls(layers)

    @classmethod
    def at(cls, root: str | os.PathLike[str], *, writable: bool | None = None) -> Store:
        """A single root (``--store DIR``); writable unless told or unable to write there."""
        root = Path(root)
        can = is_writable_dir(root)
        if writable and not can:
            raise StoreReadOnly(f"store {root} is not writable by this user")
        return cls([Layer(root, DIR, can if writable is None else writable, "store")])

    @property
    def writable_layer(self) -> Layer | None:
        return next((layer for layer in self.layers if layer.writable), None)

    def describe(self) -> str:
        return "; ".join(layer.describe() for layer in self.layers)

    # --- lookups and builds ---------------------------------------------------------------

    def lookup(self, key: str, *, accept: Accept | None = None) -> Hit | None:
        """Verified bytes of ``key`` from the first layer holding an intact entry that
        ``accept`` (if given) takes; damaged files are reported and skipped. Writes nothing
        unless a file is damaged."""
        check_key(key)
        for layer in self.layers:
            hit, _ = layer.check(key)
            if hit is not None and (accept is None or accept(hit.entry)):
                return hit
        return None

    def miss_message(self, key: str) -> str:
        """Why ``key`` is not served: every layer searched and whether it is read-only."""
        where = "; ".join(layer.describe() for layer in self.layers) or "no layers"
        return f"no entry for key {key} in {where}"

    def publish(self, entry: Entry, data: bytes) -> Hit:
        """Publish into the first writable layer (see ``Layer.publish``)."""
        layer = self.writable_layer
        if layer is None:
            raise StoreReadOnly(
                f"cannot publish {entry.key}: no writable layer ({self.describe()}); set "
                "MONO_AOT_CACHE_DIR to a writable directory"
            )
        return layer.publish(entry, data)

    def get_or_build(
        self,
        key: str,
        build_fn: BuildFn,
        *,
        accept: Accept | None = None,
        timeout: float | None = None,
    ) -> tuple[Hit, bool]:
        """The hit for ``key``, building and publishing it on a miss: (hit, built).

        Single flight: concurrent callers (any process) that miss the same key take the key's
        lock in the writable layer; the first builds, the others wait and then read its result
        (re-checked after taking the lock). ``accept`` rejects an existing entry (for example
        one built by another toolchain) so that it is rebuilt and atomically replaced.
        """
        check_key(key)
        hit = self.lookup(key, accept=accept)
        if hit is not None:
            return hit, False
        layer = self.writable_layer
        if layer is None:
            raise StoreReadOnly(
                f"{self.miss_message(key)}; cannot build it: no layer is writable (set "
                "MONO_AOT_CACHE_DIR to a writable directory)"
            )
        with key_lock(
            layer.lock_path(key), f"key {key} (another process is building it)", timeout=timeout
        ):
            hit = self.lookup(key, accept=accept)
            if hit is not None:
                return hit, False
            entry, data = build_fn()
            if entry.key != key:
                raise MonoError(f"the build of key {key} produced an entry for key {entry.key}")
            return layer.publish(entry, data), True

    # --- what the CLI needs ---------------------------------------------------------------

    def resolve_prefix(self, prefix: str) -> str:
        """The one key starting with ``prefix`` (at least 4 hex digits), as git abbreviates."""
        p = prefix.strip().lower()
        if not _PREFIX.fullmatch(p):
            raise BadInput(f"{prefix!r} is not a key or key prefix (4 to 64 hex digits)")
        found = sorted({k for layer in self.layers for k in layer.keys(p)})
        if len(found) == 1:
            return found[0]
        if not found:
            raise BadInput(f"no entry matches key {prefix!r} in {self.describe()}")
        lines = [f"key prefix {prefix!r} is ambiguous; {len(found)} candidates:"]
        for k in found:
            hit = self.find_entry(k)
            detail = f"  {hit[1].variant} {hit[1].arch} {hit[1].layout}" if hit else ""
            lines.append(f"  {k}{detail}")
        raise BadInput("\n".join(lines))

    def find_entry(self, key: str) -> tuple[Layer, Entry] | None:
        """The first intact entry for ``key`` (its blob not read): for show and explain."""
        for layer in self.layers:
            entry, _, _ = layer.read_entry(key)
            if entry is not None:
                return layer, entry
        return None

    def listing(self) -> Iterator[Listed]:
        """Every entry file in every layer, in lookup order; nothing is verified or moved."""
        served: set[str] = set()
        for layer in self.layers:
            for key in layer.keys():
                entry, _, problem = layer.read_entry(key)
                yield Listed(layer, key, entry, problem, key in served)
                if entry is not None:
                    served.add(key)

    def verify(
        self, keys: Sequence[str] | None = None, *, all_layers: bool = False
    ) -> VerifyReport:
        """Verify like a lookup does, quarantining in writable layers.

        Default: every key (or ``keys``) as a lookup would resolve it, stopping at the first
        intact copy. ``all_layers``: every entry and every blob of every layer.
        """
        report = VerifyReport()
        if all_layers and keys is None:
            for layer in self.layers:
                ok, found = layer.verify()
                report.ok += ok
                report.add(found)
            return report
        wanted = (
            list(keys)
            if keys is not None
            else sorted({k for layer in self.layers for k in layer.keys()})
        )
        for key in wanted:
            check_key(key)
            served, seen = False, False
            for layer in self.layers:
                hit, found = layer.check(key, report=False, as_use=False)
                report.add(found)
                seen = seen or hit is not None or bool(found)
                if hit is not None:
                    report.ok += 1
                    served = True
                    if not all_layers:
                        break
            if not served and not seen:
                report.problems.append(
                    Problem(
                        self.layers[0],
                        MISSING,
                        key,
                        self.layers[0].entry_path(key),
                        self.miss_message(key),
                    )
                )
        return report

    def _writable_layers(self, action: str) -> list[Layer]:
        layers = [layer for layer in self.layers if layer.writable]
        if not layers:
            raise StoreReadOnly(f"cannot {action}: no writable layer ({self.describe()})")
        return layers

    def gc(self, max_size: int, *, dry_run: bool = False) -> list[GcPlan]:
        """Shrink every writable layer to ``max_size`` bytes (see ``mono_aot.store.gc``)."""
        return [gc_layer(layer, max_size, dry_run=dry_run) for layer in self._writable_layers("gc")]

    def clear(self) -> list[Cleared]:
        """Empty every writable layer; read-only layers are never touched."""
        return [clear_layer(layer) for layer in self._writable_layers("clear")]


def _real(p: Path) -> str:
    return os.path.realpath(p)
