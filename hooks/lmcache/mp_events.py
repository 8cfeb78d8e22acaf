"""The operations of LMCache's multiprocess server, from its event bus.

In multiprocess mode one LMCache server holds the pool for many engines, and its
components publish typed events on an in-process bus (`lmcache.v1.mp_observability`)
that a thread of the bus's own drains. `subscribe()`, called in the server process
(`kvaudit.hooks.lmcache.mp_server` does, as LMCache loads it), registers a subscriber
whose callbacks run on that thread, off the server's request path, and make one span
per operation (hook `lmcache.mp_server`):

- `mp.lookup` then `mp.lookup_prefetch.end` (same request): a `kvaudit.lookup` of the
  request's chunks, hit tokens by tier;
- `l1.write.finished` (and `l1.write_finished_and_read_reserved`): a `kvaudit.store`
  into L1; `l2.keys.stored`: a store into an L2 adapter;
- `l1.read.finished`: a `kvaudit.fetch` out of L1 (an engine's retrieve);
- `l1.keys.evicted`, `l2.keys.deleted`: a `kvaudit.evict`, with no reason (neither
  event says why the pages left).

Each page is one server object (`ObjectKey`): its key is `contract.mp_object_key` (chunk
hash and cache salt), with the model, the world size and rank packed in its `kv_rank`,
its object group (`kv_group`), and, from the KV cache layout the engines registered for
that model and world size, dtype, shape and layout. A lookup's pages say `tier=cpu` for the
chunks L1 served, none for those an L2 adapter did. Only the lookup names the request
(vLLM's internal id, `kvaudit.request.engine_id`); L1 and L2 events name none: the vLLM
hook's blocks name the objects (`source_key`), which is how the layers join (docs/design.md
section 6.4). Nor do they carry token ranges: an object's is its chunk's place in the
prompt of the lookup that last named its chunk hash (engines look a request up before
they store or retrieve it). An L2 page's tier is `remote` only where the adapter is fleet-shared.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final

from lmcache.v1.mp_observability.event import Event, EventType
from lmcache.v1.mp_observability.event_bus import EventBus, EventCallback, EventSubscriber, get_event_bus

from kvaudit.contract import (
    MP_LAYOUTS,
    Hook,
    Op,
    Outcome,
    PageDescriptor,
    SpanAttr,
    Tier,
    Transfer,
    bytes_per_element,
    mp_object_key,
)
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter

# L1BackendType values (the medium behind the server's L1) as contract tiers.
_L1_TIER: Final = {"dram": Tier.CPU, "devdax": Tier.CPU, "gds": Tier.DISK}
L1_BACKEND: Final = "lmcache.mp.l1"
LOOKUP_BACKEND: Final = "lmcache.mp"
# Lookups whose prefetch has not ended yet, by request: the oldest dropped past this bound.
_MAX_OPEN_LOOKUPS: Final = 4096
# Token ranges of the chunks lookups named, by chunk hash: the most recent kept.
_MAX_RANGES: Final = 1 << 16

# (model name, world size) -> the registered layout's (dtypes, shapes), or None.
Layouts = Callable[[str, int], tuple[Sequence[Any], Sequence[Any]] | None]


def world_size_and_rank(kv_rank: int) -> tuple[int, int]:
    """The world size and global rank LMCache packs into an `ObjectKey.kv_rank`
    (`ObjectKey.ComputeKVRank`: 8 bits each of world size, global rank, local world size, local rank)."""
    return (kv_rank >> 24) & 0xFF, (kv_rank >> 16) & 0xFF


class _Format:
    """What the registered layout says of every object of one model and world size."""

    __slots__ = ("bytes", "dtype", "layout", "shape")

    def __init__(self, dtype: Any, shape: Sequence[int], chunk_size: int) -> None:
        self.dtype = str(dtype).removeprefix("torch.")
        # The registration's token axis (second to last) is the engine's; an object holds a chunk.
        dims = [int(d) for d in shape]
        if len(dims) >= 2:
            dims[-2] = chunk_size
        self.shape = tuple(dims)
        self.layout = MP_LAYOUTS.get(len(dims))
        size = bytes_per_element(self.dtype)
        self.bytes = math.prod(dims) * size if size is not None else None


class MPServerSubscriber(EventSubscriber):
    """Spans of one server's operations from its event bus; `shutdown()` (the bus calls it on stop) flushes them.

    Args:
        emitter: where the spans go.
        owns_emitter: shut the emitter down with the subscriber (else only flush it).
        layouts: the server's registered layouts (its `layout_desc_registry`), or None.
        chunk_size: tokens per object.
        hash_algo: the server's chunk hash algorithm.
    """

    def __init__(
        self,
        emitter: Emitter,
        *,
        owns_emitter: bool,
        layouts: Layouts | None = None,
        chunk_size: int | None = None,
        hash_algo: str | None = None,
    ) -> None:
        self._emitter = emitter
        self._owns_emitter = owns_emitter
        self._layouts = layouts
        self._chunk_size = chunk_size
        self._hash_algo = hash_algo
        # Formats seen, kept past their engines' unregistration (evictions come later).
        self._formats: dict[tuple[str, int], _Format] = {}
        self._lookups: OrderedDict[str, Event] = OrderedDict()
        # A chunk hash is a prefix hash: its chunk's place in the prompt is the same in every lookup.
        self._ranges: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        self._lock = threading.Lock()  # the bus has one drain thread; a test may publish from another

    def get_subscriptions(self) -> dict[EventType, EventCallback]:
        return {
            EventType.MP_LOOKUP: self._lookup,
            EventType.MP_LOOKUP_PREFETCH_END: self._lookup_end,
            EventType.L1_WRITE_FINISHED: self._l1_written,
            EventType.L1_WRITE_FINISHED_AND_READ_RESERVED: self._l1_written,
            EventType.L1_READ_FINISHED: self._l1_read,
            EventType.L2_KEYS_STORED: self._l2_stored,
            EventType.L1_KEYS_EVICTED: self._l1_evicted,
            EventType.L2_KEYS_DELETED: self._l2_deleted,
        }

    def shutdown(self) -> None:
        if self._owns_emitter:
            self._emitter.shutdown()
        else:
            self._emitter.flush()

    # ---- lookups ----

    def _lookup(self, event: Event) -> None:
        chunk = event.metadata.get("chunk_size") or self._chunk_size
        with self._lock:
            self._lookups[event.session_id] = event
            while len(self._lookups) > _MAX_OPEN_LOOKUPS:
                self._lookups.popitem(last=False)
            if chunk:
                for index, chunk_hash in enumerate(event.metadata.get("chunk_hashes") or ()):
                    self._ranges[chunk_hash] = (index * chunk, (index + 1) * chunk)
                    self._ranges.move_to_end(chunk_hash)
                while len(self._ranges) > _MAX_RANGES:
                    self._ranges.popitem(last=False)

    def _lookup_end(self, event: Event) -> None:
        with self._lock:
            lookup = self._lookups.pop(event.session_id, None)
        meta = event.metadata
        requested = meta.get("requested_tokens")
        hit = meta.get("hit_tokens") or 0
        outcome = (
            Outcome.MISS if not hit else Outcome.HIT if requested is not None and hit >= requested else Outcome.PARTIAL
        )
        op = self._emitter.operation(
            Op.LOOKUP,
            hook=Hook.LMCACHE_MP_SERVER,
            request_id=event.session_id,
            backend=LOOKUP_BACKEND,
            tokens_requested=requested,
            attributes={SpanAttr.ENGINE_REQUEST_ID: event.session_id},
            at_ns=_ns(lookup or event),
        )
        if lookup is not None:
            for page in self._lookup_pages(lookup.metadata, meta):
                op.add_page(page)
        op.end(outcome, tokens_hit=hit, end_ns=_ns(event))

    def _lookup_pages(self, lookup: dict[str, Any], end: dict[str, Any]) -> list[PageDescriptor]:
        """One page per chunk looked up: key, token range, model; the tier of those hit (L1 first)."""
        chunk = lookup.get("chunk_size") or self._chunk_size or 0
        l1_chunks = (end.get("l1_hit_tokens") or 0) // chunk if chunk else 0
        salt = end.get("cache_salt") or ""
        pages = []
        for index, chunk_hash in enumerate(lookup.get("chunk_hashes") or ()):
            # L1 is the server's memory; which L2 adapter served the rest the event does not say.
            tier = Tier.CPU if index < l1_chunks else None
            pages.append(
                PageDescriptor(
                    key=mp_object_key(chunk_hash, salt),
                    hash_algo=self._hash_algo,
                    token_start=index * chunk,
                    token_end=(index + 1) * chunk,
                    model=lookup.get("model_name"),
                    tier=tier and tier.value,
                )
            )
        return pages

    # ---- stores, fetches, evictions ----

    def _l1_written(self, event: Event) -> None:
        keys = event.metadata.get("keys") or ()
        if keys:
            metas = event.metadata.get("meta") or [None] * len(keys)
            pages = [self._page(key, meta and meta.size_bytes, _l1_tier(meta)) for key, meta in zip(keys, metas)]
            self._emit(Op.STORE, L1_BACKEND, pages, event)

    def _l1_read(self, event: Event) -> None:
        keys = event.metadata.get("keys") or ()
        if keys:
            pages = [self._page(key, None, Tier.CPU, used=True) for key in keys]
            self._emit(Op.FETCH, L1_BACKEND, pages, event, Outcome.HIT)

    def _l2_stored(self, event: Event) -> None:
        keys = event.metadata.get("keys") or ()
        if keys:
            sizes = event.metadata.get("sizes") or [None] * len(keys)
            tier = Tier.REMOTE if event.metadata.get("shared") else None
            pages = [self._page(key, size, tier) for key, size in zip(keys, sizes)]
            self._emit(Op.STORE, _l2_backend(event), pages, event)

    def _l1_evicted(self, event: Event) -> None:
        # Also published, empty, after every read that freed nothing.
        keys = event.metadata.get("keys") or ()
        if keys:
            metas = event.metadata.get("meta") or [None] * len(keys)
            pages = [self._page(key, meta and meta.size_bytes, _l1_tier(meta)) for key, meta in zip(keys, metas)]
            self._emit(Op.EVICT, L1_BACKEND, pages, event)

    def _l2_deleted(self, event: Event) -> None:
        keys = event.metadata.get("keys") or ()
        if keys:
            tier = Tier.REMOTE if event.metadata.get("shared") else None
            self._emit(Op.EVICT, _l2_backend(event), [self._page(key, None, tier) for key in keys], event)

    def _emit(
        self, op: Op, backend: str, pages: list[PageDescriptor], event: Event, outcome: Outcome | None = None
    ) -> None:
        operation = self._emitter.operation(op, hook=Hook.LMCACHE_MP_SERVER, backend=backend, at_ns=_ns(event))
        for page in pages:
            operation.add_page(page)
        if op is Op.STORE:
            tokens = self._chunk_size * len(pages) if self._chunk_size else None
            operation.end(tokens_stored=tokens)
        else:
            operation.end(outcome)

    def _page(self, key: Any, size: int | None, tier: str | None, used: bool | None = None) -> PageDescriptor:
        """A server object (`ObjectKey`) as a page descriptor."""
        world_size, rank = world_size_and_rank(key.kv_rank)
        with self._lock:
            token_start, token_end = self._ranges.get(key.chunk_hash, (None, None))
        page = PageDescriptor(
            key=mp_object_key(key.chunk_hash, key.cache_salt),
            hash_algo=self._hash_algo,
            token_start=token_start,
            token_end=token_end,
            model=key.model_name,
            world_size=world_size,
            rank=rank,
            bytes=size,
            tier=tier and str(tier),
            kv_group=key.object_group_id,
            used=used,
        )
        fmt = self._format(key.model_name, world_size)
        if fmt is not None:
            page.dtype, page.shape, page.layout = fmt.dtype, fmt.shape, fmt.layout
            page.transfer = Transfer.COPY
            if page.bytes is None:
                page.bytes = fmt.bytes
        return page

    def _format(self, model: str, world_size: int) -> _Format | None:
        """The registered layout of `model` at `world_size`, as last seen registered."""
        found = self._formats.get((model, world_size))
        if found is None and self._layouts is not None and self._chunk_size:
            registered = self._layouts(model, world_size)
            if registered is not None:
                dtypes, shapes = registered
                if dtypes and shapes:
                    found = self._formats[(model, world_size)] = _Format(dtypes[0], shapes[0], self._chunk_size)
        return found


def _ns(event: Event) -> int:
    return int(event.timestamp * 1e9)


def _l1_tier(meta: Any) -> str | None:
    # L1BackendType is a str enum whose hash is its name's: look it up by value.
    return meta and _L1_TIER.get(getattr(meta.backend, "value", meta.backend))


def _l2_backend(event: Event) -> str:
    return f"lmcache.mp.l2.{event.metadata.get('backend') or 'unknown'}"


def subscribe(
    replica: str,
    export: str | None = None,
    *,
    emitter: Emitter | None = None,
    bus: EventBus | None = None,
    layouts: Layouts | None = None,
    chunk_size: int | None = None,
    hash_algo: str | None = None,
) -> MPServerSubscriber:
    """Register the subscriber on `bus` (default: the server's global bus).

    Args:
        replica: the id the server's spans carry (the pool's name, e.g. `pool`).
        export: `file:PATH` or `otlp:URL` (see `kvaudit.emit.setup.exporter_for`).
        emitter: an emitter to use instead of making one from `replica` and `export`.
        bus: the event bus; LMCache's global one, enabled when the server runs with
            observability on.
        layouts, chunk_size, hash_algo: as `MPServerSubscriber` takes them.
    """
    import lmcache

    own = emitter is None
    if emitter is None:
        emitter = setup_emitter(replica, export, engine="lmcache", engine_version=lmcache.__version__)
    subscriber = MPServerSubscriber(
        emitter, owns_emitter=own, layouts=layouts, chunk_size=chunk_size, hash_algo=hash_algo
    )
    (bus or get_event_bus()).register_subscriber(subscriber)
    return subscriber
