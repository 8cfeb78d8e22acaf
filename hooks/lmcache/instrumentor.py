"""The fetch and lookup hook: reversible wraps of LMCache's `StorageManager`.

LMCache has no extension point on its read path, so, in the manner of OpenTelemetry's
instrumentors, `instrument()` wraps the class methods every fetch and lookup goes
through and `uninstrument()` puts the originals back. Both are idempotent. A wrap
never lets an exception of its own reach LMCache: it falls back to the original
result.

Wrapped: `StorageManager.batched_get` and `get` (blocking fetches; guard mode acts
here), `get_non_blocking` and `layerwise_batched_get` (observed when their futures
finish, not guarded), `batched_contains` (lookups); and, only to learn what those
cannot see, the token databases' `process_tokens` (each key's token range, the hash
algorithm; with `prevent`, it puts the geometry tag into their keys) and
`LMCacheEngine.store`/`retrieve`/`lookup` (the request id). And
`LocalCPUBackend.remove` / `LocalDiskBackend.remove`, every page leaving those stores
(evictions; see `evict`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Generator
from typing import Any, Final

from kvaudit.contract import Op
from kvaudit.emit.emitter import Emitter
from kvaudit.hooks.lmcache import evict, fetch, pages, prevent, runtime
from kvaudit.hooks.lmcache.links import LINKS

logger = logging.getLogger(__name__)

SUPPORTED_VERSIONS: Final = ("0.5.6",)

_originals: dict[tuple[type, str], Callable[..., Any]] = {}


def refusal(version: str) -> str | None:
    """Why the hook does not instrument LMCache `version`, or None when it does (`kvaudit doctor` asks too)."""
    if version in SUPPORTED_VERSIONS:
        return None
    return f"LMCache {version} is not supported (supported: {', '.join(SUPPORTED_VERSIONS)})"


def is_instrumented() -> bool:
    return bool(_originals)


def instrument(
    *,
    replica: str | None = None,
    export: str | None = None,
    emitter: Emitter | None = None,
    guard: bool = False,
    checksum_rate: float = 0.0,
    registry: str | None = None,
    prevent: bool = False,
    sample_rate: float = 1.0,
) -> bool:
    """Install the fetch and lookup hooks; False (and one log line) on an unsupported LMCache.

    Args:
        replica: the replica id (`service.instance.id`); default LMCache's instance id.
        export: `file:PATH` or `otlp:URL` (see `kvaudit.emit.setup.exporter_for`).
        emitter: an emitter to use instead of making one from `replica` and `export`.
        guard: turn fetched pages that fail the in-process checks into misses.
        checksum_rate: share of pages whose payload gets an xxh3 checksum (0 to 1).
        registry: a directory shared by the replicas where stores leave their
            descriptors, so the guard can compare a fetched page with its store.
        prevent: put the engine's geometry fingerprint into every key it makes, so
            pages of replicas that cannot read each other's never hit (`prevent`).
        sample_rate: the share of requests recorded, 0 to 1, chosen by request id
            (docs/design.md section 3.10); the guard judges them all.
    """
    if _originals:
        return True
    import lmcache

    reason = refusal(lmcache.__version__)
    if reason is not None:
        logger.error("kvaudit: %s; LMCache hooks not installed", reason)
        return False
    from lmcache.v1.cache_engine import LMCacheEngine
    from lmcache.v1.memory_management import TensorMemoryObj
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
    from lmcache.v1.storage_backend.storage_manager import StorageManager
    from lmcache.v1.token_database import ChunkedTokenDatabase, SegmentTokenDatabase

    options = runtime.Options(replica, export, guard, checksum_rate, registry, prevent, sample_rate)
    runtime.install(runtime.Runtime(options, emitter))
    pages.READ_IN_PLACE[:] = [TensorMemoryObj]
    _wrap(StorageManager, "batched_get", _batched_get)
    _wrap(StorageManager, "get", _get)
    _wrap(StorageManager, "get_non_blocking", _get_non_blocking)
    _wrap(StorageManager, "layerwise_batched_get", _layerwise_batched_get)
    _wrap(StorageManager, "batched_contains", _batched_contains)
    for name in ("store", "retrieve", "lookup"):
        _wrap(LMCacheEngine, name, _with_request_id)
    _wrap(ChunkedTokenDatabase, "process_tokens", _process_tokens)
    _wrap(SegmentTokenDatabase, "process_tokens", _process_tokens)
    _wrap(LocalCPUBackend, "remove", _remove)
    _wrap(LocalDiskBackend, "remove", _remove)
    return True


def uninstrument() -> None:
    """Restore every wrapped method and flush what was recorded."""
    for (cls, name), original in _originals.items():
        setattr(cls, name, original)
    _originals.clear()
    pages.READ_IN_PLACE.clear()
    runtime.clear()


def _wrap(cls: type, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = cls.__dict__[name]
    _originals[(cls, name)] = original
    setattr(cls, name, functools.wraps(original)(make(original)))


def _began(op: Op) -> fetch.Began:
    """Where an operation begins (`fetch.Began`): read before LMCache's call, on its thread."""
    engine_request_id = runtime.REQUEST_ID.get()
    link = LINKS.get(engine_request_id, op) if op is Op.FETCH else None
    return time.time_ns(), engine_request_id, link


def _call(
    state: runtime.Runtime,
    manager: Any,
    op: Op,
    began: fetch.Began,
    keys: Any,
    location: Any,
    original: Callable[..., Any],
    *args: Any,
) -> Any:
    """The original call; an exception of LMCache's is recorded as the operation's error, then propagates."""
    try:
        return original(*args)
    except BaseException:
        try:
            fetch.failed(state, manager, op, began, keys, location)
        except Exception as exc:  # the hook's own failure must not hide LMCache's
            runtime.failed(op.value, exc)
        raise


def _finish(
    state: runtime.Runtime, manager: Any, began: fetch.Began, keys: Any, objs: Any, location: Any, guard: bool
) -> Any:
    try:
        return fetch.finish(state, manager, began, keys, objs, location, guard=guard)
    except Exception as exc:  # the hook's own failure must not become LMCache's
        runtime.failed("fetch", exc)
        return objs


def _batched_get(original: Callable[..., Any]) -> Callable[..., Any]:
    def batched_get(self: Any, keys: Any, location: str | None = None) -> Any:
        state = runtime.current()
        if state is None:
            return original(self, keys, location)
        began = _began(Op.FETCH)
        if not state.options.guard and not state.records(began[1], began[2]):
            return original(self, keys, location)  # a request not recorded, and nothing to judge
        objs = _call(state, self, Op.FETCH, began, keys, location, original, self, keys, location)
        return _finish(state, self, began, keys, objs, location, state.options.guard)

    return batched_get


def _get(original: Callable[..., Any]) -> Callable[..., Any]:
    def get(self: Any, key: Any, location: str | None = None) -> Any:
        state = runtime.current()
        if state is None:
            return original(self, key, location)
        began = _began(Op.FETCH)
        if not state.options.guard and not state.records(began[1], began[2]):
            return original(self, key, location)  # a request not recorded, and nothing to judge
        obj = _call(state, self, Op.FETCH, began, [key], location, original, self, key, location)
        return _finish(state, self, began, [key], [obj], location, state.options.guard)[0]

    return get


def _get_non_blocking(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_non_blocking(self: Any, key: Any, location: str | None = None) -> Any:
        state = runtime.current()
        if state is None:
            return original(self, key, location)
        began = _began(Op.FETCH)
        future = _call(state, self, Op.FETCH, began, [key], location, original, self, key, location)
        _observe(state, self, began, [key], future, location)
        return future

    return get_non_blocking


def _layerwise_batched_get(original: Callable[..., Any]) -> Callable[..., Any]:
    def layerwise_batched_get(self: Any, keys: Any, location: str | None = None) -> Generator[Any, None, None]:
        state = runtime.current()
        # LMCache reads the layerwise path from its local CPU backend when no location is given.
        where = location or "LocalCPUBackend"
        for layer_keys, future in zip(keys, original(self, keys, location), strict=False):
            if state is not None:
                _observe(state, self, _began(Op.FETCH), layer_keys, future, where)
            yield future

    return layerwise_batched_get


def _observe(
    state: runtime.Runtime, manager: Any, began: fetch.Began, keys: Any, future: Any, location: str | None
) -> None:
    """Describe a non-blocking fetch when its future finishes (observed only: LMCache has the objects by then)."""
    if future is None:
        _finish(state, manager, began, keys, [None] * len(keys), location, False)
        return

    def done(finished: Any) -> None:
        failed = finished.cancelled() or finished.exception() is not None
        result = [None] * len(keys) if failed else finished.result()
        objs = result if isinstance(result, list) else [result]
        _finish(state, manager, began, keys, objs + [None] * (len(keys) - len(objs)), location, False)

    future.add_done_callback(done)


def _batched_contains(original: Callable[..., Any]) -> Callable[..., Any]:
    def batched_contains(self: Any, keys: Any, search_range: Any = None, pin: bool = False) -> Any:
        state = runtime.current()
        if state is None:
            return original(self, keys, search_range, pin)
        began = _began(Op.LOOKUP)
        if not state.records(began[1], None):
            return original(self, keys, search_range, pin)  # a request not recorded
        hit, mapping = _call(state, self, Op.LOOKUP, began, keys, None, original, self, keys, search_range, pin)
        try:
            fetch.end_lookup(state, self, began, keys, hit)
        except Exception as exc:  # the hook's own failure must not become LMCache's
            runtime.failed("lookup", exc)
        return hit, mapping

    return batched_contains


def _remove(original: Callable[..., Any]) -> Callable[..., Any]:
    def remove(self: Any, key: Any, force: bool = True) -> bool:
        state = runtime.current()
        if state is None:
            return original(self, key, force)
        try:
            size = evict.held_bytes(self, key)
        except Exception as exc:  # the hook's own failure must not become LMCache's
            runtime.failed("eviction size", exc)
            size = None
        removed = original(self, key, force)
        if removed:
            try:
                evict.record(state, self, key, size, force)
            except Exception as exc:  # the hook's own failure must not become LMCache's
                runtime.failed("eviction", exc)
        return removed

    return remove


def _with_request_id(original: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        request_id = kwargs.get("req_id") or kwargs.get("lookup_id")
        if request_id is None:
            return original(self, *args, **kwargs)
        token = runtime.REQUEST_ID.set(str(request_id))
        try:
            return original(self, *args, **kwargs)
        finally:
            runtime.REQUEST_ID.reset(token)

    return call


def _process_tokens(original: Callable[..., Any]) -> Callable[..., Any]:
    def process_tokens(self: Any, *args: Any, **kwargs: Any) -> Generator[Any, None, None]:
        state = runtime.current()
        if state is None or not kwargs.get("make_key", True):
            yield from original(self, *args, **kwargs)
            return
        if state.hash_algo is None:
            state.hash_algo = _hash_algo_name(self)
        if state.options.prevent:
            try:
                args, kwargs = prevent.tagged(self, args, kwargs)
            except Exception as exc:  # the hook's own failure must not become LMCache's: keys stay untagged
                runtime.failed("geometry tag", exc)
        # Each key's range stored here, not through a call: one runs for every chunk LMCache
        # hashes, on its serving thread.
        ranges = state.ranges_to_fill()
        for start, end, key in original(self, *args, **kwargs):
            ranges[key.chunk_hash] = (start, end)
            yield start, end, key

    return process_tokens


def _hash_algo_name(database: Any) -> str:
    # LMCache falls back to Python's `hash` whatever it was configured with when vLLM's
    # hash functions cannot be imported: name the function actually used.
    name = getattr(database.hash_func, "__name__", "unknown")
    return "builtin" if name == "hash" else name
