"""Content-addressed artifact store: verified blobs, schema-versioned entries, layers.

``Store.default()`` reads ``MONO_AOT_PATH`` roots, then the user cache (the writable layer), then
installed packs (``mono_aot.store.packs``). The disk layout is in ``mono_aot.store.layer``, the
entry file format in ``mono_aot.store.entry``, the gc policy in ``mono_aot.store.gc``, locking in
``mono_aot.store.lock``.
"""

from mono_aot.store.entry import (
    ENTRY_SCHEMA_VERSION,
    Entry,
    EntryCorrupt,
    EntryUnknownSchema,
    decode_entry,
    encode_entry,
)
from mono_aot.store.gc import Cleared, GcPlan, Removal
from mono_aot.store.layer import Hit, Layer, Problem, StoreReadOnly, check_key
from mono_aot.store.lock import LockTimeout
from mono_aot.store.store import Listed, Store, VerifyReport

__all__ = [
    "ENTRY_SCHEMA_VERSION",
    "Cleared",
    "Entry",
    "EntryCorrupt",
    "EntryUnknownSchema",
    "GcPlan",
    "Hit",
    "Layer",
    "Listed",
    "LockTimeout",
    "Problem",
    "Removal",
    "Store",
    "StoreReadOnly",
    "VerifyReport",
    "check_key",
    "decode_entry",
    "encode_entry",
]
