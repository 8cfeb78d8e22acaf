"""The trace contract between the hooks and the analysis side (docs/design.md section 3).

This module owns every attribute name kvaudit writes or reads: nothing else in the
project spells one out. It also owns the record types that travel in a trace (the
`PageDescriptor` of one stored or fetched page and the `KVConfig` a replica declares
for itself in its resource attributes), every enumerated value, and the columns each
attribute becomes in the views (`RESOURCE_COLUMNS`, `SPAN_COLUMNS`, `PAGE_COLUMNS`),
from which the reader's Arrow schemas and the ClickHouse views are generated.
"""

from __future__ import annotations

import hashlib
import typing
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final

import msgspec

SCHEMA_VERSION: Final = 1
EVENT_PAGE: Final = "kvaudit.page"
TRACER_NAME: Final = "kvaudit"


class Op(StrEnum):
    LOOKUP = "lookup"
    STORE = "store"
    FETCH = "fetch"
    EVICT = "evict"

    @property
    def span_name(self) -> str:
        return f"kvaudit.{self.value}"


class Outcome(StrEnum):
    HIT = "hit"
    PARTIAL = "partial"
    MISS = "miss"
    REJECTED = "rejected"
    ERROR = "error"


class Hook(StrEnum):
    VLLM_CONNECTOR = "vllm.connector"
    LMCACHE_ENGINE = "lmcache.engine"
    LMCACHE_BACKEND = "lmcache.backend"
    # LMCache's multiprocess server (`lmcache server`), seen from its event bus: the pool's own
    # operations, which no vLLM span is the parent of (docs/design.md section 6.4).
    LMCACHE_MP_SERVER = "lmcache.mp_server"
    # vLLM's own KV cache events (ZMQ `KVEventBatch`), turned into spans by `kvaudit collect`.
    VLLM_KV_EVENTS = "vllm.kv_events"
    SIMULATOR = "kvaudit.simulator"


class Tier(StrEnum):
    """Values of `kvaudit.page.tier`: where a page was found, put or evicted from."""

    GPU = "gpu"
    CPU = "cpu"
    DISK = "disk"
    REMOTE = "remote"


class EvictReason(StrEnum):
    """Values of `kvaudit.evict.reason`: why pages left a store."""

    CAPACITY = "capacity"  # made room for other pages
    REMOVE = "remove"  # removed on request (an explicit remove or clear call)
    INVALIDATED = "invalidated"  # a failed store taken back so lookups stop seeing it
    CLEARED = "cleared"  # the whole store was emptied (e.g. vLLM's prefix-cache reset)


class Transfer(StrEnum):
    """Values of `kvaudit.page.transfer`: how a page's payload moved."""

    COPY = "copy"  # the bytes were copied
    ZERO_COPY = "zero_copy"  # shared memory, read in place
    RAW_PTR = "raw_ptr"  # a process-local address instead of bytes (KVA002)


class Kind(StrEnum):
    """How an attribute's value is typed in the views (an OTLP AnyValue's field)."""

    STR = "str"
    INT = "int"
    BOOL = "bool"
    INTS = "ints"  # an array of integers
    DOUBLE = "double"


class Res:
    """Resource attribute names (one set per process)."""

    SERVICE_NAME: Final = "service.name"
    REPLICA: Final = "service.instance.id"
    SCHEMA: Final = "kvaudit.schema"
    ENGINE: Final = "kvaudit.engine"
    ENGINE_VERSION: Final = "kvaudit.engine.version"
    PROCESS_PID: Final = "process.pid"
    # When the process started (OpenTelemetry's semantic convention: ISO 8601): a process
    # restarted with the same pid, as in a container, is another process (docs/design.md section 3.2).
    PROCESS_CREATION_TIME: Final = "process.creation.time"
    KV_MODEL: Final = "kvaudit.kv.model"
    KV_DTYPE: Final = "kvaudit.kv.dtype"
    KV_LAYOUT: Final = "kvaudit.kv.layout"
    KV_BLOCK_SIZE: Final = "kvaudit.kv.block_size"
    KV_WORLD_SIZE: Final = "kvaudit.kv.world_size"
    KV_RANK: Final = "kvaudit.kv.rank"
    KV_HASH_ALGO: Final = "kvaudit.kv.hash_algo"
    KV_LAYERS: Final = "kvaudit.kv.layers"
    KV_KV_HEADS: Final = "kvaudit.kv.kv_heads"
    KV_HEAD_SIZE: Final = "kvaudit.kv.head_size"
    # The replica's geometry fingerprint (`geometry_fingerprint`, docs/design.md section 4.5).
    KV_GEOMETRY: Final = "kvaudit.kv.geometry"
    # The share of requests the process records, where it records fewer than all (docs/design.md section 3.10).
    SAMPLE_RATE: Final = "kvaudit.sample.rate"


class SpanAttr:
    """Span attribute names (one span per operation on one request)."""

    OP: Final = "kvaudit.op"
    REQUEST_ID: Final = "kvaudit.request.id"
    # vLLM's internal request id (the client's id with vLLM's random suffix): what LMCache's
    # multiprocess server sees as the request, so the two layers join on it in SQL. Read from
    # the spans view's `attributes` map.
    ENGINE_REQUEST_ID: Final = "kvaudit.request.engine_id"
    HOOK: Final = "kvaudit.hook"
    BACKEND: Final = "kvaudit.backend"
    TOKENS_REQUESTED: Final = "kvaudit.tokens.requested"
    TOKENS_HIT: Final = "kvaudit.tokens.hit"
    TOKENS_STORED: Final = "kvaudit.tokens.stored"
    # Lookup: the prompt prefix the engine already had locally, before asking the cache.
    TOKENS_LOCAL: Final = "kvaudit.tokens.local"
    PAGES: Final = "kvaudit.pages"
    BYTES: Final = "kvaudit.bytes"
    OUTCOME: Final = "kvaudit.outcome"
    # Evict spans: why the pages left (an `EvictReason`); absent where the source does not say.
    EVICT_REASON: Final = "kvaudit.evict.reason"
    # Tokens per block, where the source states it per operation (vLLM KV events do).
    BLOCK_SIZE: Final = "kvaudit.block_size"


class TelemetryAttr:
    """Attributes of the `kvaudit.telemetry` span: the emitter reporting on itself.

    The counts are cumulative for the emitting process, so the latest span of a
    process carries its totals and a lost telemetry span loses nothing.
    """

    SPAN_NAME: Final = "kvaudit.telemetry"
    DROPPED_SPANS: Final = "kvaudit.telemetry.dropped_spans"
    FAILED_EXPORTS: Final = "kvaudit.telemetry.failed_exports"
    ERRORS: Final = "kvaudit.telemetry.errors"
    # Batches of upstream events (e.g. vLLM KV event sequence numbers) known missed and
    # not recovered: the traces lack whatever those batches said.
    LOST_BATCHES: Final = "kvaudit.telemetry.lost_batches"


class PageAttr:
    """Attribute names of a `kvaudit.page` event (one page descriptor)."""

    KEY: Final = "kvaudit.page.key"
    HASH_ALGO: Final = "kvaudit.page.hash_algo"
    TOKEN_START: Final = "kvaudit.page.token_start"
    TOKEN_END: Final = "kvaudit.page.token_end"
    MODEL: Final = "kvaudit.page.model"
    DTYPE: Final = "kvaudit.page.dtype"
    SHAPE: Final = "kvaudit.page.shape"
    LAYOUT: Final = "kvaudit.page.layout"
    BYTES: Final = "kvaudit.page.bytes"
    WORLD_SIZE: Final = "kvaudit.page.world_size"
    RANK: Final = "kvaudit.page.rank"
    LAYERS: Final = "kvaudit.page.layers"
    KV_HEADS: Final = "kvaudit.page.kv_heads"
    HEAD_SIZE: Final = "kvaudit.page.head_size"
    USED: Final = "kvaudit.page.used"
    CHECKSUM: Final = "kvaudit.page.checksum"
    TRANSFER: Final = "kvaudit.page.transfer"
    ADDRESS: Final = "kvaudit.page.address"
    TIER: Final = "kvaudit.page.tier"
    # The key of the page of the layer below (an LMCache chunk) that served this page's
    # tokens, recorded by the layer above (vLLM); that page's span is in the same trace.
    SOURCE_KEY: Final = "kvaudit.page.source_key"
    # The geometry fingerprint of the replica that computed the page (KVA008).
    GEOMETRY: Final = "kvaudit.page.geometry"
    # The KV cache group (LMCache's object group in multiprocess mode) the page belongs to.
    KV_GROUP: Final = "kvaudit.page.kv_group"
    # The kind of that group's attention, in vLLM's words (`full_attention`, `sliding_window`,
    # ...), and the window in tokens of a sliding-window group: what lets explain tell a page
    # dropped by design from an evicted one (docs/design.md section 7.2, `outside_window`).
    KV_GROUP_KIND: Final = "kvaudit.page.kv_group_kind"
    SLIDING_WINDOW: Final = "kvaudit.page.sliding_window"


class PageDescriptor(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """What one stored or fetched page carried. `None` means the field was absent.

    On a fetch a hook fills in only what the fetched object actually carried, never
    the consumer's own configuration: absence is what the auditor checks for.
    """

    key: str | None = None
    hash_algo: str | None = None
    token_start: int | None = None
    token_end: int | None = None
    model: str | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    layout: str | None = None
    bytes: int | None = None
    world_size: int | None = None
    rank: int | None = None
    layers: int | None = None
    kv_heads: int | None = None
    head_size: int | None = None
    used: bool | None = None
    checksum: str | None = None
    transfer: str | None = None
    address: int | None = None
    tier: str | None = None
    source_key: str | None = None
    geometry: str | None = None
    kv_group: int | None = None
    kv_group_kind: str | None = None
    sliding_window: int | None = None

    def to_attributes(self) -> dict[str, Any]:
        """The present fields as OpenTelemetry attributes."""
        return {
            _PAGE_ATTR_OF_FIELD[name]: value
            for name, value in zip(self.__struct_fields__, msgspec.structs.astuple(self))
            if value is not None
        }

    @classmethod
    def from_attributes(cls, attributes: Mapping[str, Any]) -> PageDescriptor:
        """The inverse of `to_attributes`; unknown attributes are ignored."""
        fields = {
            field: attributes[attr] for field, attr in _PAGE_ATTR_OF_FIELD.items() if attributes.get(attr) is not None
        }
        if "shape" in fields:
            fields["shape"] = tuple(fields["shape"])
        return cls(**fields)

    def missing(self, required: frozenset[str]) -> list[str]:
        """Names of required fields that are absent."""
        return [name for name in required if getattr(self, name) is None]

    @classmethod
    def from_config(cls, kv: KVConfig, **fields: Any) -> PageDescriptor:
        """A page as a replica of configuration `kv` stores (or expects) it; `fields` add the rest."""
        shared = {name: getattr(kv, name) for name in _CONFIG_FIELDS_ON_PAGES}
        return cls(**{**shared, **fields})


# Field name -> attribute name; the two spellings differ only by the prefix.
_PAGE_ATTR_OF_FIELD: Final[dict[str, str]] = {
    name: getattr(PageAttr, name.upper()) for name in PageDescriptor.__struct_fields__
}

REQUIRED_ON_FETCH: Final = frozenset(
    {
        "key",
        "hash_algo",
        "token_start",
        "token_end",
        "model",
        "dtype",
        "shape",
        "layout",
        "bytes",
        "world_size",
        "rank",
        "used",
    }
)
# The store side knows its engine's configuration, so it also always knows the geometry.
REQUIRED_ON_STORE: Final = (REQUIRED_ON_FETCH - {"used"}) | {"layers", "kv_heads", "head_size"}
# What a fetched page (or its producer's stored descriptor) must agree on with the consuming
# replica's own configuration (KVA005; the shape too, where the consumer knows what to expect) ...
CONSUMER_FIELDS: Final = (
    "model",
    "dtype",
    "layout",
    "world_size",
    "rank",
    "hash_algo",
    "layers",
    "kv_heads",
    "head_size",
)
# ... and with the descriptor its producer stored under the same key (KVA004).
STORED_FIELDS: Final = (
    "model",
    "dtype",
    "shape",
    "layout",
    "bytes",
    "token_start",
    "token_end",
    "world_size",
    "rank",
    "checksum",
)


class KVConfig(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """A replica's own KV configuration, declared once per process in its resource."""

    model: str | None = None
    dtype: str | None = None
    layout: str | None = None
    block_size: int | None = None
    world_size: int | None = None
    rank: int | None = None
    hash_algo: str | None = None
    layers: int | None = None
    kv_heads: int | None = None
    head_size: int | None = None
    # Derived from the fields above (and the engine's KV format version): `with_geometry`.
    geometry: str | None = None

    def with_geometry(self, format_version: str | None = None) -> KVConfig:
        """This configuration with its geometry fingerprint, as a replica declares it."""
        return msgspec.structs.replace(self, geometry=geometry_fingerprint(self, format_version))

    def to_attributes(self) -> dict[str, Any]:
        return {
            _RES_ATTR_OF_KV_FIELD[name]: value
            for name, value in zip(self.__struct_fields__, msgspec.structs.astuple(self))
            if value is not None
        }


# --- the geometry fingerprint (docs/design.md section 4.5) -----------------------------
# Everything that makes a page readable by a replica. Not the hash algorithm: it decides
# the keys themselves, so replicas that differ there never share a key anyway.
GEOMETRY_FIELDS: Final = (
    "model",
    "dtype",
    "layout",
    "layers",
    "kv_heads",
    "head_size",
    "block_size",
    "world_size",
    "rank",
)
# The recipe's own version, hashed in first: changing the fields or their spelling changes it.
_GEOMETRY_RECIPE: Final = "kvaudit-geometry/1"
# The name of the fingerprint's tag in a prevented key: LMCache spells the key of a request
# configured with `lmcache.tag.kvaudit_geometry=<fingerprint>` as `...@kvaudit_geometry%<fingerprint>`
# (queries/prevented.sql reads the tag so spelled out of the keys).
GEOMETRY_TAG: Final = "kvaudit_geometry"


# How a prevented request's LMCache multiprocess keys carry the fingerprint: appended to the
# request's cache salt (the only free-form part of an MP `ObjectKey`), after the client's own.
GEOMETRY_SALT_SEPARATOR: Final = "+"


def geometry_salt(client_salt: str | None, fingerprint: str) -> str:
    """The cache salt of a prevented request: the client's salt, then `kvaudit_geometry%<fingerprint>`."""
    tag = f"{GEOMETRY_TAG}%{fingerprint}"
    return f"{client_salt}{GEOMETRY_SALT_SEPARATOR}{tag}" if client_salt else tag


# The memory layouts of LMCache multiprocess objects, by the number of axes of the shape the
# engines register (LMCache's names): `KV_2LTD` is [K/V, layers, tokens, heads x head size];
# `KV_LTD` is [layers, tokens, width], the engine-driven registration of a cache that packs
# K and V on one axis (vLLM's CPU cache: width = heads x 2 x head size). Neither tells the
# head split apart from the width.
MP_LAYOUTS: Final = {4: "KV_2LTD", 3: "KV_LTD"}


def mp_object_key(chunk_hash: bytes, cache_salt: str = "") -> str:
    """The page key of an object of LMCache's multiprocess server: its chunk hash in hex, then
    `@` and the cache salt where it has one. Made by both layers: the server hook's pages carry
    it as their key, and the vLLM hook's blocks name it as their `source_key`. Model, rank and
    object group are fields of the page of their own."""
    return f"{chunk_hash.hex()}@{cache_salt}" if cache_salt else chunk_hash.hex()


def geometry_fingerprint(kv: KVConfig, format_version: str | None = None) -> str:
    """16 hex digits naming the page geometry of a replica of configuration `kv`.

    Equal on replicas that can read each other's pages, different (but for a 64-bit
    collision) wherever one field of `GEOMETRY_FIELDS` or the engine's KV format version
    differs; an absent field is hashed as absent, never guessed.
    """
    parts = [_GEOMETRY_RECIPE, *(f"{name}={_canonical(getattr(kv, name))}" for name in GEOMETRY_FIELDS)]
    parts.append(f"format_version={_canonical(format_version)}")
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest()


def _canonical(value: str | int | None) -> str:
    if value is None:
        return "-"
    # `torch.bfloat16` and `bfloat16` are one dtype: spelled without the module.
    return str(value).removeprefix("torch.")


_RES_ATTR_OF_KV_FIELD: Final[dict[str, str]] = {
    name: getattr(Res, f"KV_{name.upper()}") for name in KVConfig.__struct_fields__
}
# The configuration a page carries about itself (a KVConfig field of the same name).
_CONFIG_FIELDS_ON_PAGES: Final = tuple(
    name for name in KVConfig.__struct_fields__ if name in PageDescriptor.__struct_fields__
)


# --- the columns of the views ------------------------------------------------------------
# Column name -> (attribute name, kind): what the reader (kvaudit.read.columns) and the
# ClickHouse views (kvaudit.backends.clickhouse_views) turn each attribute into.


def _kind_of(annotation: Any) -> Kind:
    """The Kind of a record field's type (`str | None`, `tuple[int, ...] | None`, ...)."""
    present = [arg for arg in typing.get_args(annotation) if arg is not type(None)] or [annotation]
    kind = {str: Kind.STR, int: Kind.INT, bool: Kind.BOOL}.get(present[0])
    return kind if kind is not None else Kind.INTS


def _record_columns(record: type[msgspec.Struct], attribute_of: Mapping[str, str]) -> dict[str, tuple[str, Kind]]:
    hints = typing.get_type_hints(record)
    return {name: (attribute_of[name], _kind_of(hints[name])) for name in record.__struct_fields__}


RESOURCE_COLUMNS: Final[dict[str, tuple[str, Kind]]] = {
    "replica": (Res.REPLICA, Kind.STR),
    "service": (Res.SERVICE_NAME, Kind.STR),
    "pid": (Res.PROCESS_PID, Kind.INT),
    "started": (Res.PROCESS_CREATION_TIME, Kind.STR),
    "schema": (Res.SCHEMA, Kind.INT),
    "engine": (Res.ENGINE, Kind.STR),
    "engine_version": (Res.ENGINE_VERSION, Kind.STR),
    "sample_rate": (Res.SAMPLE_RATE, Kind.DOUBLE),
    **_record_columns(KVConfig, _RES_ATTR_OF_KV_FIELD),
}
_SPAN_ATTR_KINDS: Final[dict[str, Kind]] = {
    SpanAttr.OP: Kind.STR,
    SpanAttr.REQUEST_ID: Kind.STR,
    SpanAttr.HOOK: Kind.STR,
    SpanAttr.BACKEND: Kind.STR,
    SpanAttr.TOKENS_REQUESTED: Kind.INT,
    SpanAttr.TOKENS_HIT: Kind.INT,
    SpanAttr.TOKENS_STORED: Kind.INT,
    SpanAttr.TOKENS_LOCAL: Kind.INT,
    SpanAttr.PAGES: Kind.INT,
    SpanAttr.BYTES: Kind.INT,
    SpanAttr.OUTCOME: Kind.STR,
    SpanAttr.EVICT_REASON: Kind.STR,
    SpanAttr.BLOCK_SIZE: Kind.INT,
    TelemetryAttr.DROPPED_SPANS: Kind.INT,
    TelemetryAttr.FAILED_EXPORTS: Kind.INT,
    TelemetryAttr.ERRORS: Kind.INT,
    TelemetryAttr.LOST_BATCHES: Kind.INT,
}
# A span attribute's column drops the `kvaudit.` prefix: `kvaudit.request.id` is `request_id`.
SPAN_COLUMNS: Final[dict[str, tuple[str, Kind]]] = {
    attr.removeprefix("kvaudit.").replace(".", "_"): (attr, kind) for attr, kind in _SPAN_ATTR_KINDS.items()
}
PAGE_COLUMNS: Final[dict[str, tuple[str, Kind]]] = _record_columns(PageDescriptor, _PAGE_ATTR_OF_FIELD)


def bytes_per_element(dtype: str) -> int | None:
    """Size of one element of a KV dtype name, or None for an unknown name."""
    return DTYPE_BYTES.get(dtype.removeprefix("torch."))


DTYPE_BYTES: Final[dict[str, int]] = {
    "float64": 8,
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "fp8": 1,
    "int8": 1,
    "uint8": 1,
}
