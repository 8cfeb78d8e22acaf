"""The eviction side: pages leaving LMCache's local CPU and disk backends.

Both backends remove a page through their `remove(key, force)`: with `force=False`
from their own allocation path, to make room (a capacity eviction), with
`force=True` when asked from outside (`StorageManager.remove`/`batched_remove`/
`clear`, `remove_after_retrieve`, moves and compression): an explicit removal. Each
removal that took a page out becomes one `kvaudit.evict` span with its descriptor.

Not seen: LMCache 0.5.6 has no path that takes a failed store back (the failure of
LMCache #4991), so `invalidated` never occurs here; the layerwise
`LocalCPUBackend.batched_allocate` evicts by popping its map directly, past `remove`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvaudit.contract import EvictReason, Hook, Op, PageDescriptor, SpanAttr
from kvaudit.hooks.lmcache.pages import backend_label, key_hex, tier_of
from kvaudit.hooks.lmcache.runtime import REQUEST_ID, Runtime

if TYPE_CHECKING:
    from lmcache.utils import CacheEngineKey


def held_bytes(backend: Any, key: CacheEngineKey) -> int | None:
    """Size of the page `backend` holds under `key`, read before `remove` drops it."""
    hot_cache = getattr(backend, "hot_cache", None)  # LocalCPUBackend: memory objects
    if hot_cache is not None:
        obj = hot_cache.get(key)
        return None if obj is None else obj.get_size()
    meta = backend.dict.get(key)  # LocalDiskBackend: file metadata
    return None if meta is None else meta.size


def record(state: Runtime, backend: Any, key: CacheEngineKey, size: int | None, force: bool) -> None:
    """One evict span for a page `backend` removed."""
    # The disk backend keeps no engine configuration of its own; its CPU backend does.
    engine_side = getattr(backend, "local_cpu_backend", backend)
    name = type(backend).__name__
    reason = EvictReason.REMOVE if force else EvictReason.CAPACITY
    op = state.emitter(engine_side.config, engine_side.metadata).operation(
        Op.EVICT,
        hook=Hook.LMCACHE_BACKEND,
        backend=backend_label(name),
        # Set when a request's own retrieve removes what it read (`remove_after_retrieve`).
        request_id=REQUEST_ID.get(),
        attributes={SpanAttr.EVICT_REASON: reason.value},
    )
    start, end = state.range_of(key) or (None, None)
    op.add_page(
        PageDescriptor(
            key=key_hex(key),
            hash_algo=state.hash_algo,
            token_start=start,
            token_end=end,
            model=key.model_name,
            bytes=size,
            world_size=key.world_size,
            rank=key.worker_id,
            tier=tier_of(name),
        )
    )
    op.end()
