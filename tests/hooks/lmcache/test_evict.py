"""LMCache evictions against real LMCache 0.5.6: a local CPU pool of four pages, forced to evict.

The engine (tests/support/lmcache_engine.py) copies KV with the CPU copy connector of
`kvaudit.hooks.lmcache.testing` (it stands in for LMCache's CUDA copy kernel only).
Sequence A (3 pages) is stored, then B (3 pages): the pool holds four, so A's first two
pages are evicted to make room. A is then looked up (a miss: its prefix is gone) and stored again, which is
what makes those evictions "before their next use"; `clear()` removes the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lmcache", reason="LMCache is installed by scripts/install-lmcache.sh")
torch = pytest.importorskip("torch")

from kvaudit.analyse.named_queries import load  # noqa: E402
from kvaudit.read.store import TraceStore  # noqa: E402

from ...support.lmcache_engine import CHUNK, PAGE_BYTES, POOL_GB, hooked_engine, kv, sequence  # noqa: E402
from ...support.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*LoggingHandler.*:DeprecationWarning")]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TraceStore]:
    traces = tmp_path_factory.mktemp("lmcache_evict")
    with hooked_engine(traces, "evict", max_local_cpu_size=POOL_GB) as engine:
        engine.store(sequence(1), kvcache=kv())
        engine.store(sequence(2), kvcache=kv())
        assert engine.lookup(sequence(2)) == 3 * CHUNK
        assert engine.lookup(sequence(1)) == 0  # A's first page is gone, and with it the prefix
        engine.store(sequence(1), kvcache=kv())  # A computed again
        engine.clear()
    trace_store = TraceStore([traces])
    trace_store.refresh()
    yield trace_store
    trace_store.close()


def _stored_keys(store: TraceStore) -> list[str]:
    """Keys of the stored pages, in the order of their first store (one store's pages share its time)."""
    _, rows = store.query(
        "SELECT key FROM pages WHERE op = 'store' GROUP BY key ORDER BY min(time_ns), min(token_start)"
    )
    return [key for (key,) in rows]


def test_a_full_pool_evicts_for_capacity(store: TraceStore):
    a0, a1 = _stored_keys(store)[:2]
    _, rows = store.query(
        "SELECT p.key, p.tier, p.bytes, p.token_start, p.backend, p.hook FROM pages p JOIN spans s USING (span_id)"
        " WHERE p.op = 'evict' AND s.evict_reason = 'capacity' ORDER BY p.time_ns LIMIT 2"
    )
    assert rows == [
        (a0, "cpu", PAGE_BYTES, 0, "lmcache.local_cpu", "lmcache.backend"),
        (a1, "cpu", PAGE_BYTES, CHUNK, "lmcache.local_cpu", "lmcache.backend"),
    ]


def test_clear_is_an_explicit_removal_that_empties_the_pool(store: TraceStore):
    _, removed = store.query(
        "SELECT count(*) FROM pages p JOIN spans s USING (span_id) WHERE s.evict_reason = 'remove'"
    )
    assert removed == [(4,)]
    _, final = store.query(
        "SELECT arg_max(pages, interval_start), arg_max(bytes, interval_start), sum(evicted)"
        f" FROM ({load('evictions/occupancy').rstrip().rstrip(';')}) WHERE backend = 'lmcache.local_cpu'"
    )
    pages, size, evicted = final[0]
    assert (pages, size) == (0, 0)
    _, total = store.query("SELECT count(*) FROM pages WHERE op = 'evict'")
    assert evicted == total[0][0]


def test_evicted_before_next_use_is_what_the_test_forced(store: TraceStore):
    a0, a1, a2, b0, b1, _ = _stored_keys(store)
    _, rows = store.query(
        "SELECT key, reason, next_use_op FROM ("
        + load("evictions/before_reuse").rstrip().rstrip(";")
        + ") ORDER BY evicted_at"
    )
    # B evicted A0 and A1; storing A again first evicted A2 (then the least recently
    # used), B0 and B1 to make room, then stored A2 again. A's three pages were needed
    # again after leaving; B's two were not.
    assert rows == [(a0, "capacity", "store"), (a1, "capacity", "store"), (a2, "capacity", "store")]
    _, evicted = store.query("SELECT key FROM pages WHERE op = 'evict' AND key IN ($b0, $b1)", {"b0": b0, "b1": b1})
    assert sorted(evicted) == sorted([(b0,), (b1,)])


def test_uninstrument_restores_the_backends():
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

    from kvaudit.hooks import lmcache as hook

    originals = (LocalCPUBackend.__dict__["remove"], LocalDiskBackend.__dict__["remove"])
    assert hook.instrument(replica="idem", export="file:/dev/null")
    assert LocalCPUBackend.__dict__["remove"] is not originals[0]
    hook.uninstrument()
    assert (LocalCPUBackend.__dict__["remove"], LocalDiskBackend.__dict__["remove"]) == originals


def test_a_full_disk_evicts_for_capacity(tmp_path: Path):
    def stored(engine: Any, tokens: list[int]) -> None:
        # Disk writes finish in the background.
        wait_until(lambda: engine.lookup(tokens) >= len(tokens), what="the disk backend took the pages")

    disk = {"local_cpu": False, "local_disk": str(tmp_path / "disk"), "max_local_disk_size": POOL_GB}
    with hooked_engine(tmp_path, "evict-disk", **disk) as engine:
        engine.store(sequence(1), kvcache=kv())
        stored(engine, sequence(1))
        engine.store(sequence(2), kvcache=kv())
        stored(engine, sequence(2))
    store = TraceStore([tmp_path / "r1.jsonl"])
    store.refresh()
    a_keys = set(_stored_keys(store)[:3])
    _, rows = store.query(
        "SELECT p.key, p.tier, p.bytes, p.backend, s.evict_reason FROM pages p JOIN spans s USING (span_id)"
        " WHERE p.op = 'evict' ORDER BY p.time_ns"
    )
    # Two of A's pages make room for B (which two depends on how the lookups touched them).
    assert len(rows) == 2 and {row[0] for row in rows} <= a_keys
    assert {row[1:] for row in rows} == {("disk", PAGE_BYTES, "lmcache.local_disk", "capacity")}
