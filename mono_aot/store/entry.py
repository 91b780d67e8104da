"""The entry document: what a store records about one published code object.

An entry is small JSON, parsed with pydantic and versioned; nothing in it ever becomes a path
(blob paths derive from the digest, which is checked to be 64 hex digits).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mono_aot.spec.util import HEX64, canonical_json

ENTRY_SCHEMA_VERSION = 1
HEX64_PATTERN = HEX64.pattern


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BlobRef(_Doc):
    sha256: str = Field(pattern=HEX64_PATTERN)
    size: int = Field(gt=0)


class Launch(_Doc):
    grid: int = Field(gt=0)  # workgroups (the layout's CTA count)
    block: int = Field(gt=0)  # threads per workgroup
    dynamic_lds: int = Field(ge=0)


class KernargSlot(_Doc):
    name: str  # from the kernel contract (mono_aot.spec.abi)
    offset: int = Field(ge=0)
    size: int = Field(gt=0)
    value_kind: str  # from the code object's metadata: by_value, global_buffer, ...


class Resources(_Doc):
    vgpr: int = Field(ge=0)
    agpr: int = Field(ge=0)
    sgpr: int = Field(ge=0)
    lds: int = Field(ge=0)  # group_segment_fixed_size
    scratch: int = Field(ge=0)  # private_segment_fixed_size
    vgpr_spill: int = Field(ge=0)
    sgpr_spill: int = Field(ge=0)
    wavefront_size: int = Field(gt=0)
    max_flat_workgroup_size: int = Field(gt=0)
    code_bytes: int = Field(ge=0)  # size of the .text section


class ElfInfo(_Doc):
    machine: int  # EM_AMDGPU = 224
    osabi: int  # 64 = ELFOSABI_AMDGPU_HSA
    abi_version: int  # 4 = code object v6
    e_flags: int


class Provenance(_Doc):
    """Who built it and when: informative, never part of a key."""

    mono_aot_version: str
    flydsl_version: str
    linker_version: str
    built_at: str  # ISO 8601, UTC
    build_seconds: float = Field(ge=0)
    # how the compile worker really ran: "fixed" (no address-space randomisation, the bytes are
    # reproducible) or "randomized" (the kernel refused the personality flag: valid bytes that
    # another build may not reproduce)
    address_space: Literal["fixed", "randomized"] = "fixed"


class Entry(_Doc):
    schema_version: Literal[1] = ENTRY_SCHEMA_VERSION
    key: str = Field(pattern=HEX64_PATTERN)
    variant: str
    arch: str
    layout: str  # the layout's name (informative; its canonical form is in lookup_inputs)
    lookup_inputs: dict[str, Any]  # everything the key hashes: computable without a compiler
    build_inputs: dict[str, Any]  # the toolchain and options that produced these bytes
    blob: BlobRef
    symbol: str  # the kernel's symbol in the code object (hipModuleGetFunction name)
    launch: Launch
    kernarg_segment_size: int = Field(ge=0)
    kernargs: list[KernargSlot]
    resources: Resources
    elf: ElfInfo
    provenance: Provenance


# --- The file format -------------------------------------------------------------------------
# An entry file is the canonical JSON (indent 2, sorted keys, ASCII) of an envelope:
#   {"entry": {...}, "entry_sha256": "<sha256 of the compact canonical entry>",
#    "format": "mono-aot.entry", "schema_version": 1}
# Reading demands the exact canonical bytes and a matching digest, so any edit or truncation of
# the file, even one that still parses, is caught: a person can read and diff it, nobody can
# change it unnoticed.

ENTRY_FORMAT = "mono-aot.entry"


class EntryCorrupt(Exception):
    """The file is not an intact entry document; ``str()`` says why."""


class EntryUnknownSchema(Exception):
    """The entry has a schema version this mono-aot does not read (written by another version)."""

    def __init__(self, version: object) -> None:
        self.version = version
        super().__init__(
            f"entry schema version {version!r}; this mono-aot reads version {ENTRY_SCHEMA_VERSION}"
        )


def _compact(doc: Any) -> bytes:
    return canonical_json(doc).encode()


def _pretty(doc: Any) -> bytes:
    return (
        json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False) + "\n"
    ).encode()


def encode_entry(entry: Entry) -> bytes:
    """The exact bytes of ``entry``'s file: deterministic, so re-publishing is comparable."""
    doc = entry.model_dump(mode="json")
    return _pretty(
        {
            "entry": doc,
            "entry_sha256": hashlib.sha256(_compact(doc)).hexdigest(),
            "format": ENTRY_FORMAT,
            "schema_version": ENTRY_SCHEMA_VERSION,
        }
    )


def decode_entry(raw: bytes, key: str) -> Entry:
    """Parse an entry file filed under ``key``; raise EntryCorrupt or EntryUnknownSchema.

    The schema version is looked at before anything else, so an entry of another version is
    never half-read.
    """
    try:
        env = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise EntryCorrupt(
            f"not valid JSON ({len(raw)} bytes; truncated or damaged?): {e}"
        ) from None
    if not isinstance(env, dict) or env.get("format") != ENTRY_FORMAT:
        raise EntryCorrupt(f'not a mono-aot entry document (no "format": "{ENTRY_FORMAT}")')
    version = env.get("schema_version")
    if type(version) is not int:
        raise EntryCorrupt(f"schema_version is {version!r}, not an integer")
    if version != ENTRY_SCHEMA_VERSION:
        raise EntryUnknownSchema(version)
    if set(env) != {"entry", "entry_sha256", "format", "schema_version"}:
        raise EntryCorrupt(f"unexpected envelope fields {sorted(env)}")
    try:
        canonical = _pretty(env)
    except ValueError as e:  # NaN or infinity
        raise EntryCorrupt(f"not canonical JSON: {e}") from None
    if canonical != raw:
        raise EntryCorrupt("not in canonical form (the file was edited)")
    doc = env["entry"]
    if not isinstance(doc, dict):
        raise EntryCorrupt('"entry" is not an object')
    digest = hashlib.sha256(_compact(doc)).hexdigest()
    if env["entry_sha256"] != digest:
        raise EntryCorrupt(
            f"entry digest mismatch: file says {str(env['entry_sha256'])[:16]}..., "
            f"content hashes to {digest[:16]}... (the file was edited or damaged)"
        )
    try:
        entry = Entry.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "entry"
        raise EntryCorrupt(f"invalid entry field {where}: {first['msg']}") from None
    if entry.key != key:
        raise EntryCorrupt(f"filed under key {key} but its key is {entry.key}")
    return entry
