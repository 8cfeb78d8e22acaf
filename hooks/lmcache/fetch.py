"""The fetch side: describe what one `StorageManager` fetch returned, and vet it in guard mode.

LMCache serves a prefix: `_process_tokens_internal` stops at the first missing object
of a fetch and drops the rest. Guard mode relies on exactly that: a page that fails
the in-process checks becomes a missing object, so that page and every later one of
the prefix are recomputed, and LMCache never sees them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from kvaudit.contract import Hook, KVConfig, Op, Outcome, PageDescriptor
from kvaudit.guard import violations
from kvaudit.hooks.lmcache.checksums import payload_checksum, sampled
from kvaudit.hooks.lmcache.links import LINKS, LazyPages, Link
from kvaudit.hooks.lmcache.pages import backend_label, fetch_page, missing_page, object_facts, objects_facts, tier_of
from kvaudit.hooks.lmcache.runtime import Runtime

if TYPE_CHECKING:
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_management import MemoryObj
    from lmcache.v1.storage_backend.storage_manager import StorageManager

logger = logging.getLogger(__name__)


# Where an operation began: when (`time.time_ns()`), the request id LMCache was called
# with, and the layer above's link for it; read by the wrap before LMCache's call, the
# rest of the operation recorded after it (`Emitter.record`). A plain tuple: made with
# no Python frame.
Began = tuple[int, str | None, Link | None]


def _record(
    state: Runtime,
    manager: StorageManager,
    op: Op,
    began: Began,
    location: str | None,
    last: tuple[int, int] | None,
    outcome: Outcome,
    tokens_hit: int | None,
    describe: Callable[[], Iterable[PageDescriptor]] | None = None,
) -> None:
    """Queue the operation (`last`: the token range of its last key); under a layer above
    (the link), as its child and under its request id."""
    started, engine_request_id, link = began
    if not state.records(engine_request_id, link):
        return
    state.emitter(manager.config, manager.metadata).record(
        op,
        Hook.LMCACHE_ENGINE,
        LINKS.request_id(engine_request_id, link),
        backend_label(location) if op is Op.FETCH else None,
        last[1] if last else None,
        link.parent if link is not None else None,
        started,
        outcome,
        (tokens_hit, None, None, None, None),
        describe,
    )


def failed(
    state: Runtime, manager: StorageManager, op: Op, began: Began, keys: Sequence[Any], location: str | None
) -> None:
    """Record an operation LMCache's call raised in."""
    _record(state, manager, op, began, location, state.last_range(keys), Outcome.ERROR, None)


def carries_metadata(manager: StorageManager, location: str | None) -> bool:
    """Whether objects fetched from `location` carry their own shape, dtype and format.

    Remote connectors that honour `save_chunk_meta` write no header when it is off,
    and then allocate what they read from the reader's own configuration.
    """
    backend = manager.storage_backends.get(location) if location else None
    connector = getattr(backend, "connection", None)
    connector = getattr(connector, "_connector", connector)
    if connector is None:
        return True
    from lmcache.v1.storage_backend.connector.lm_connector import LMCServerConnector

    # LMCache's own server protocol sends shape, dtype and format with every object.
    return isinstance(connector, LMCServerConnector) or bool(getattr(connector, "save_chunk_meta", True))


def finish(
    state: Runtime,
    manager: StorageManager,
    began: Began,
    keys: Sequence[CacheEngineKey],
    objs: list[MemoryObj | None],
    location: str | None,
    *,
    guard: bool,
) -> list[MemoryObj | None]:
    """Describe the fetched objects, record the fetch, and return the objects LMCache may use.

    The layer above (the link `began` names) is told every requested chunk, those not
    fetched or not used with `used=False`. Without the guard nothing is decided on the
    descriptors, so they are made later (`LazyPages`); the guard decides on each, here.
    """
    carried = carries_metadata(manager, location)
    if guard:
        return _finish_guarded(state, manager, began, keys, objs, location, carried)
    tier, hash_algo, rate = tier_of(location), state.hash_algo, state.options.checksum_rate
    recorded = []
    used_pages = tokens_hit = 0
    ranges = state.ranges_of(keys)
    for key, obj, facts, token_range in zip(keys, objs, objects_facts(objs), ranges, strict=False):
        if facts is None:
            recorded.append((key, None, token_range, False, None))
            continue
        # LMCache uses a prefix: nothing after the first object it did not get.
        used = used_pages == len(recorded)
        recorded.append((key, facts, token_range, used, payload_checksum(obj) if rate and sampled(key, rate) else None))
        if used:
            used_pages += 1
            if token_range is not None:
                tokens_hit += token_range[1] - token_range[0]

    def describe() -> list[PageDescriptor]:
        pages = []
        for key, facts, token_range, used, checksum in recorded:
            if facts is None:
                pages.append(missing_page(key, token_range))
                continue
            page = fetch_page(
                key,
                facts,
                carried_meta=carried,
                hash_algo=hash_algo,
                token_range=token_range,
                tier=tier,
                checksum=checksum,
            )
            page.used = used
            pages.append(page)
        return pages

    told = LazyPages(len(recorded), describe, all_used=used_pages == len(keys))
    # The operation's pages are the objects LMCache got; the layer above hears of every chunk.
    _end(
        state,
        manager,
        began,
        location,
        ranges[-1] if ranges else None,
        _outcome(used_pages, len(keys), False),
        tokens_hit,
        lambda: [page for page, record in zip(told, recorded, strict=True) if record[1] is not None],
        told,
    )
    return objs


def _finish_guarded(
    state: Runtime,
    manager: StorageManager,
    began: Began,
    keys: Sequence[CacheEngineKey],
    objs: list[MemoryObj | None],
    location: str | None,
    carried: bool,
) -> list[MemoryObj | None]:
    """`finish` with the guard on: each page is described and vetted before LMCache may use it."""
    link = began[2]
    tier = tier_of(location)
    consumer = state.kv_config(manager.config, manager.metadata)
    rate = state.options.checksum_rate
    prefix_intact = True
    rejected_at: int | None = None
    used_pages = tokens_hit = 0
    told: list[PageDescriptor] = []
    fetched: list[PageDescriptor] = []
    for index, (key, obj) in enumerate(zip(keys, objs, strict=False)):
        if obj is None:
            prefix_intact = False
            if link is not None:
                told.append(missing_page(key, state.range_of(key)))
            continue
        token_range = state.range_of(key)
        page = fetch_page(
            key,
            object_facts(obj),
            carried_meta=carried,
            hash_algo=state.hash_algo,
            token_range=token_range,
            tier=tier,
            checksum=payload_checksum(obj) if sampled(key, rate) else None,
        )
        page.used = prefix_intact and rejected_at is None
        if page.used:
            reasons = _vet(state, manager, key, obj, page, consumer, token_range)
            if reasons:
                rejected_at = index
                page.used = False
                logger.warning(
                    "kvaudit guard: page %s rejected (%s); it and the %d later pages of its prefix will be recomputed",
                    page.key,
                    ", ".join(reasons),
                    len(keys) - index - 1,
                )
        if page.used:
            used_pages += 1
            if token_range is not None:
                tokens_hit += token_range[1] - token_range[0]
        fetched.append(page)
        told.append(page)
    if rejected_at is not None:
        objs = list(objs)
        for index in range(rejected_at, len(objs)):
            obj = objs[index]
            if obj is not None:
                # LMCache releases only the objects it is given back.
                obj.ref_count_down()
                objs[index] = None
    outcome = _outcome(used_pages, len(keys), rejected_at is not None)
    last = state.last_range(keys)
    _end(state, manager, began, location, last, outcome, tokens_hit, fetched.__iter__, told)
    return objs


def _end(
    state: Runtime,
    manager: StorageManager,
    began: Began,
    location: str | None,
    last: tuple[int, int] | None,
    outcome: Outcome,
    tokens_hit: int,
    describe: Callable[[], Iterable[PageDescriptor]],
    told: Sequence[PageDescriptor],
) -> None:
    """Record the fetch, then tell the layer above (if any) every requested chunk."""
    _record(state, manager, Op.FETCH, began, location, last, outcome, tokens_hit, describe)
    link = began[2]
    if link is not None:
        link.on_pages(told)


def _vet(
    state: Runtime,
    manager: StorageManager,
    key: CacheEngineKey,
    obj: MemoryObj,
    page: PageDescriptor,
    consumer: KVConfig,
    token_range: tuple[int, int] | None,
) -> list[str]:
    expected_shape = None
    if token_range is not None and consumer.layout == "KV_2LTD":
        expected_shape = tuple(manager.metadata.get_shapes(token_range[1] - token_range[0])[0])
    stored = state.registry.get(key) if state.registry is not None else None
    if stored is not None and stored.checksum is not None and page.checksum is None:
        # The producer hashed this page: hash it here too, whatever the sample says.
        page.checksum = payload_checksum(obj)
    return violations(page, PageDescriptor.from_config(consumer, shape=expected_shape), stored)


def _outcome(used: int, requested: int, rejected: bool) -> Outcome:
    if requested and used == requested:
        return Outcome.HIT
    if used:
        return Outcome.PARTIAL
    return Outcome.REJECTED if rejected else Outcome.MISS


def end_lookup(state: Runtime, manager: StorageManager, began: Began, keys: Sequence[CacheEngineKey], hit: int) -> None:
    """Record a lookup that found the first `hit` of `keys`."""
    last = state.last_range(keys)
    if not hit:
        _record(state, manager, Op.LOOKUP, began, None, last, Outcome.MISS, 0)
        return
    found = state.range_of(keys[hit - 1])
    outcome = Outcome.HIT if hit == len(keys) else Outcome.PARTIAL
    _record(state, manager, Op.LOOKUP, began, None, last, outcome, found[1] if found else 0)
