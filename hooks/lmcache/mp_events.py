"""Evictions of LMCache's multiprocess server, from its event bus.

In multiprocess mode one LMCache server holds the pool for many engines, and its
components publish typed events on an in-process bus (`lmcache.v1.mp_observability`).
`subscribe()`, called in the server process, registers a subscriber that turns
`L1_KEYS_EVICTED` (pages leaving the server's L1 memory, with their sizes) and
`L2_KEYS_DELETED` (pages deleted from an L2 adapter) into `kvaudit.evict` spans
stamped with the event's time. Neither event says why the pages left, so the spans
carry no reason; an L2 page's tier is `remote` only where the adapter is fleet-shared.
"""

from __future__ import annotations

from typing import Any, Final

from lmcache.v1.mp_observability.event import Event, EventType
from lmcache.v1.mp_observability.event_bus import EventBus, EventCallback, EventSubscriber, get_event_bus

from kvaudit.contract import Hook, Op, PageDescriptor, Tier
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter

# L1BackendType values (the medium behind the server's L1) as contract tiers.
_L1_TIER: Final = {"dram": Tier.CPU, "devdax": Tier.CPU, "gds": Tier.DISK}
L1_BACKEND: Final = "lmcache.mp.l1"


class MPEvictionSubscriber(EventSubscriber):
    """Evict spans from one server's event bus; `shutdown()` (the bus calls it on stop) flushes them."""

    def __init__(self, emitter: Emitter, *, owns_emitter: bool) -> None:
        self._emitter = emitter
        self._owns_emitter = owns_emitter

    def get_subscriptions(self) -> dict[EventType, EventCallback]:
        return {EventType.L1_KEYS_EVICTED: self._l1_evicted, EventType.L2_KEYS_DELETED: self._l2_deleted}

    def shutdown(self) -> None:
        if self._owns_emitter:
            self._emitter.shutdown()
        else:
            self._emitter.flush()

    def _l1_evicted(self, event: Event) -> None:
        metas = event.metadata.get("meta") or [None] * len(event.metadata["keys"])
        pages = [
            # L1BackendType is a str enum whose hash is its name's: look it up by value.
            _page(key, meta and meta.size_bytes, meta and _L1_TIER.get(getattr(meta.backend, "value", meta.backend)))
            for key, meta in zip(event.metadata["keys"], metas)
        ]
        self._evict(L1_BACKEND, pages, event)

    def _l2_deleted(self, event: Event) -> None:
        tier = Tier.REMOTE if event.metadata.get("shared") else None
        backend = f"lmcache.mp.l2.{event.metadata.get('backend') or 'unknown'}"
        self._evict(backend, [_page(key, None, tier) for key in event.metadata["keys"]], event)

    def _evict(self, backend: str, pages: list[PageDescriptor], event: Event) -> None:
        op = self._emitter.operation(
            Op.EVICT, hook=Hook.LMCACHE_BACKEND, backend=backend, at_ns=int(event.timestamp * 1e9)
        )
        for page in pages:
            op.add_page(page)
        op.end()


def _page(key: Any, size: int | None, tier: str | None) -> PageDescriptor:
    """A server object key (`ObjectKey`: chunk hash, model, KV rank) as a page descriptor."""
    return PageDescriptor(key=key.chunk_hash.hex(), model=key.model_name, rank=key.kv_rank, bytes=size, tier=tier)


def subscribe(
    replica: str, export: str | None = None, *, emitter: Emitter | None = None, bus: EventBus | None = None
) -> MPEvictionSubscriber:
    """Register the eviction subscriber on `bus` (default: the server's global bus).

    Args:
        replica: the id the server's spans carry (the pool's name, e.g. `pool`).
        export: `file:PATH` or `otlp:URL` (see `kvaudit.emit.setup.exporter_for`).
        emitter: an emitter to use instead of making one from `replica` and `export`.
        bus: the event bus; LMCache's global one, enabled when the server runs with
            observability on.
    """
    import lmcache

    own = emitter is None
    if emitter is None:
        emitter = setup_emitter(replica, export, engine="lmcache", engine_version=lmcache.__version__)
    subscriber = MPEvictionSubscriber(emitter, owns_emitter=own)
    (bus or get_event_bus()).register_subscriber(subscriber)
    return subscriber
