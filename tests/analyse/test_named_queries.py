"""The named queries against hand-built traces with known answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvaudit.analyse.capacity import capacity_curve
from kvaudit.analyse.named_queries import run_named
from kvaudit.contract import Hook, Op
from kvaudit.read.store import TraceStore

from ..support.fleet import Fleet, page
from ..support.reference_answers import brute_force_lru, tag_fetches


@pytest.fixture
def fleet(trace_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    return Fleet(trace_dir, monkeypatch)


def _rows(store: TraceStore, name: str, **variables: object) -> list[dict[str, object]]:
    columns, rows = run_named(store, name, variables)
    return [dict(zip(columns, row)) for row in rows]


def test_hit_rate_per_layer_op_and_bucket(fleet: Fleet):
    r1 = fleet.replica("r1")
    fleet.at(0).fetch(r1, [page("a", 0, used=True)], op=Op.LOOKUP, tokens_requested=128)
    fleet.at(1).fetch(r1, [page("a", 0, used=True), page("b", 1, used=False)], tokens_requested=128)
    fleet.at(2).fetch(r1, [page("a", 0, used=True)], hook=Hook.LMCACHE_ENGINE, tokens_requested=64)
    fleet.at(70).fetch(r1, [], tokens_requested=100)
    rows = _rows(fleet.open(), "hit_rate", kvaudit_bucket_s=60.0)
    got = [(r["hook"], r["op"], r["tokens_requested"], r["tokens_hit"], r["hit_rate"]) for r in rows]
    assert got == [
        ("lmcache.engine", "fetch", 64, 32, 0.5),
        ("vllm.connector", "fetch", 128, 32, 0.25),  # the rejected page was no hit
        ("vllm.connector", "fetch", 100, 0, 0.0),
        ("vllm.connector", "lookup", 128, 32, 0.25),
    ]
    assert rows[1]["bucket_start"] < rows[2]["bucket_start"]


def test_cross_replica_matrix_shares_and_classes(fleet: Fleet, trace_dir: Path):
    r1, r2, r3 = fleet.replica("r1"), fleet.replica("r2"), fleet.replica("r3")
    fleet.at(0).store(r1, [page("a", 0), page("b", 1)])
    fleet.at(0).store(r3, [page("c", 2)])
    fleet.at(5).fetch(r2, [page("a", 0, used=True), page("b", 1, used=True), page("x", 3, used=False)], "chat-1")
    fleet.at(6).fetch(r2, [page("c", 2, used=True), page("o", 4, used=True)], "rag-1")
    fleet.at(7).fetch(r1, [page("a", 0, used=True)], "chat-2")
    store = fleet.open()
    got = [
        (r["producer"], r["consumer"], r["pages"], r["tokens"], r["crossed"], r["token_share"])
        for r in _rows(store, "cross_replica_reuse")
    ]
    assert got == [
        ("r1", "r1", 1, 32, False, 0.2),
        ("r1", "r2", 2, 64, True, 0.4),
        ("r3", "r2", 1, 32, True, 0.2),
        (None, "r2", 1, 32, False, 0.2),  # an orphan: producer unknown
    ]
    store.close()
    tag_fetches(trace_dir, "workload", {"chat-1": "chat", "chat-2": "chat", "rag-1": "rag"})
    store = TraceStore([trace_dir])
    store.refresh()
    rows = _rows(store, "cross_replica_reuse", kvaudit_class_attr="workload")
    got = {(r["request_class"], r["producer"], r["consumer"]): r["token_share"] for r in rows}
    assert got == {
        ("chat", "r1", "r1"): pytest.approx(1 / 3),
        ("chat", "r1", "r2"): pytest.approx(2 / 3),
        ("rag", "r3", "r2"): 0.5,
        ("rag", None, "r2"): 0.5,
    }


def test_transfer_overhead_percentiles_throughput_and_recompute(fleet: Fleet):
    r1 = fleet.replica("r1")
    for n in range(1, 11):  # fetches of one 32-token page taking 1..10 ms
        fleet.at(n).fetch(r1, [page("a", 0, used=True)], backend="pool", duration_s=n / 1000)
    fleet.at(20).store(r1, [page("b", 1)])
    rows = _rows(fleet.open(), "transfer_overhead", kvaudit_model_params=1e9, kvaudit_gpu_flops=1e12)
    fetch = next(r for r in rows if r["op"] == "fetch")
    assert fetch["operations"] == 10 and fetch["bytes"] == 10 * 16384
    assert (fetch["p50_ms"], fetch["p90_ms"], fetch["p99_ms"]) == pytest.approx((5.5, 9.1, 9.91))
    assert fetch["gb_per_s"] == pytest.approx(10 * 16384 / 55e-3 / 1e9)
    assert fetch["ms_per_token"] == pytest.approx(55 / 320)
    # Recomputing costs 2 ms per token (2 x 1e9 FLOPs at 1e12 FLOP/s): 64 ms for 32 tokens.
    assert fetch["recompute_ms_per_token"] == pytest.approx(2.0)
    assert fetch["slower_than_recompute"] == 0.0
    rows = _rows(fleet.open(), "transfer_overhead", kvaudit_model_params=1e6, kvaudit_gpu_flops=1e12)
    fetch = next(r for r in rows if r["op"] == "fetch")
    # 0.002 ms per token, 0.064 ms per page: every fetch was slower than that.
    assert fetch["slower_than_recompute"] == 1.0
    store_row = next(r for r in rows if r["op"] == "store")
    assert store_row["slower_than_recompute"] is None and store_row["tokens"] == 32


def test_prefix_locality_counts_pages_others_stored_before(fleet: Fleet):
    r1, r2 = fleet.replica("r1"), fleet.replica("r2")
    fleet.at(0).store(r1, [page(k, i) for i, k in enumerate("abcd")], "q1")
    fleet.at(5).fetch(r2, [page("a", 0, used=True), page("b", 1, used=True)], "q2", tokens_requested=160)
    fleet.at(6).store(r2, [page("c", 2), page("e", 3), page("d", 4)], "q2")
    rows = _rows(fleet.open(), "prefix_locality")
    got = [(r["request_id"], r["prompt_tokens"], r["reusable_tokens"], r["hit_tokens"], r["locality"]) for r in rows]
    assert got == [("q1", 128, 0, 0, 0.0), ("q2", 160, 96, 64, 0.6)]
    assert [r["cumulative_share"] for r in rows] == [0.5, 1.0]


def test_reuse_times_wasted_stores_and_evictions(fleet: Fleet):
    r1, r2 = fleet.replica("r1"), fleet.replica("r2")
    fleet.at(0).store(r1, [page("a", 0), page("b", 1)])
    fleet.at(2).fetch(r2, [page("a", 0, used=True)])
    fleet.at(5).fetch(r2, [page("a", 0, used=True)])
    fleet.at(6).fetch(r1, [page("a", 0), page("b", 1)], op=Op.EVICT)
    fleet.at(8).store(r1, [page("a", 0)])  # needed again after its eviction
    [row, r2_row] = _rows(fleet.open(), "reuse")
    assert (row["replica"], row["pages_stored"], row["wasted_stores"], row["reused_pages"]) == ("r1", 3, 2, 2)
    assert row["wasted_bytes"] == 2 * 16384
    assert (row["reuse_p50_s"], row["reuse_p90_s"]) == pytest.approx((3.5, 4.7))
    assert (row["evicted_pages"], row["evicted_before_reuse"]) == (2, 1)
    assert (r2_row["replica"], r2_row["pages_stored"], r2_row["reused_pages"]) == ("r2", 0, 0)


def test_capacity_curve_equals_abrute_force_lru(fleet: Fleet):
    rng = np.random.default_rng(7)
    r1, r2 = fleet.replica("r1"), fleet.replica("r2")
    stream = []
    for t in range(150):
        key = f"k{int(rng.zipf(1.5)) % 40}"
        size = 1000 * (1 + int(key[1:]) % 3)
        emitter = r1 if t % 2 else r2
        if t % 3:
            fleet.at(t).fetch(emitter, [page(key, used=True, bytes=size)])
        else:
            fleet.at(t).store(emitter, [page(key, bytes=size)])
        stream.append((key, size))
    curve = capacity_curve(fleet.open(), sample_rate=1.0)
    assert curve.accesses == 150 and curve.sample_rate == 1.0
    for capacity in [0, 999, 1000, 2500, 5000, 12_000, 30_000, 1e9]:
        assert curve.hit_rate(capacity) == pytest.approx(brute_force_lru(stream, capacity))
    assert curve.ideal_hit_rate == brute_force_lru(stream, 1e12)
