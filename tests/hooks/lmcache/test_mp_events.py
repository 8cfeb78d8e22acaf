"""Operations of LMCache's multiprocess server, from its event bus (LMCache 0.5.6).

L1: a real `L1Manager` (the server's L1 component) on a real, enabled event bus,
deleting and clearing objects it holds. L2: an `L2_KEYS_DELETED` event published with
the metadata LMCache's L2 adapter base class gives it (no L2 adapter runs here).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lmcache", reason="LMCache is installed by scripts/install-lmcache.sh")
torch = pytest.importorskip("torch")

from kvaudit.read.store import TraceStore  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*LoggingHandler.*:DeprecationWarning")]

PAGE_BYTES = 2 * 2 * 256 * 32 * 2


@pytest.fixture
def bus() -> Iterator[Any]:
    from lmcache.v1.mp_observability.event_bus import EventBusConfig, init_event_bus

    os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
    bus = init_event_bus(EventBusConfig(enabled=True))
    bus.start()
    yield bus
    # LMCache's default: observability off.
    init_event_bus(EventBusConfig(enabled=False))


def test_l1_stores_and_l1_and_l2_evictions_become_spans(bus: Any, tmp_path: Path):
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from lmcache.v1.distributed.config import L1ManagerConfig, L1MemoryManagerConfig
    from lmcache.v1.distributed.l1_manager import L1Manager
    from lmcache.v1.mp_observability.event import Event, EventType

    from kvaudit.hooks.lmcache.mp_events import subscribe

    layout = MemoryLayoutDesc(shapes=[torch.Size([2, 2, 256, 32])], dtypes=[torch.bfloat16])
    subscribe(
        "pool",
        f"file:{tmp_path}/pool.jsonl",
        bus=bus,
        layouts=lambda model, world_size: (
            (layout.dtypes, layout.shapes) if (model, world_size) == ("tiny", 1) else None
        ),
        chunk_size=256,
        hash_algo="blake3",
    )
    memory = L1MemoryManagerConfig(size_in_bytes=1 << 20, use_lazy=False, shm_name="")  # no POSIX shm segment
    manager = L1Manager(L1ManagerConfig(memory_config=memory))
    kv_rank = ObjectKey.ComputeKVRank(world_size=1, global_rank=0, local_world_size=1, local_rank=0)
    keys = [ObjectKey(chunk_hash=bytes([i]) * 32, model_name="tiny", kv_rank=kv_rank) for i in range(3)]
    try:
        manager.reserve_write(keys, [False] * 3, layout)
        manager.finish_write(keys)
        manager.delete(keys[:2])
        manager.clear()
    finally:
        manager.close()
    bus.publish(Event(EventType.L2_KEYS_DELETED, metadata={"keys": keys[:1], "backend": "fs", "shared": True}))
    bus.stop()  # drains the queue, then shuts the subscriber down (which flushes its spans)

    store = TraceStore([tmp_path])
    store.refresh()
    _, rows = store.query(
        "SELECT p.backend, p.key, p.tier, p.bytes, p.model, p.world_size, p.rank, p.kv_group, s.evict_reason"
        " FROM pages p JOIN spans s USING (span_id) WHERE p.op = 'evict' ORDER BY p.time_ns, p.key"
    )
    assert rows == [
        ("lmcache.mp.l1", keys[0].chunk_hash.hex(), "cpu", PAGE_BYTES, "tiny", 1, 0, 0, None),
        ("lmcache.mp.l1", keys[1].chunk_hash.hex(), "cpu", PAGE_BYTES, "tiny", 1, 0, 0, None),
        ("lmcache.mp.l1", keys[2].chunk_hash.hex(), "cpu", PAGE_BYTES, "tiny", 1, 0, 0, None),
        ("lmcache.mp.l2.fs", keys[0].chunk_hash.hex(), "remote", PAGE_BYTES, "tiny", 1, 0, 0, None),
    ]
    # The stores: one span, each object described by the layout registered for its model.
    _, stores = store.query(
        "SELECT p.hook, p.key, p.dtype, p.shape, p.layout, p.bytes, p.hash_algo FROM pages p"
        " WHERE p.op = 'store' ORDER BY p.key"
    )
    assert stores == [
        ("lmcache.mp_server", key.chunk_hash.hex(), "bfloat16", [2, 2, 256, 32], "KV_2LTD", PAGE_BYTES, "blake3")
        for key in keys
    ]
    _, replicas = store.query("SELECT DISTINCT replica, engine FROM replicas")
    assert replicas == [("pool", "lmcache")]
