"""The `evictions/*` named queries over traces written through the real emitter."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvaudit.analyse.named_queries import load
from kvaudit.contract import EvictReason, Hook, Op, Outcome, PageDescriptor, SpanAttr, Tier
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter
from kvaudit.read.store import TraceStore

S = 1_000_000_000
T0 = 1_700_000_000 * S


def _op(
    emitter: Emitter,
    op: Op,
    at_s: float,
    keys: list[str],
    *,
    tier: Tier = Tier.GPU,
    reason: EvictReason | None = None,
    tokens: tuple[int, int] | None = None,
) -> None:
    """One operation at `at_s` seconds; `tokens` = (requested, hit) of a fetch."""
    attributes = {SpanAttr.EVICT_REASON: reason.value} if reason else None
    hook = Hook.VLLM_KV_EVENTS if tier is Tier.GPU else Hook.LMCACHE_BACKEND
    backend = "vllm.prefix_cache" if tier is Tier.GPU else "lmcache.local_cpu"
    operation = emitter.operation(
        op,
        hook=hook,
        backend=backend,
        attributes=attributes,
        at_ns=T0 + int(at_s * S),
        tokens_requested=tokens and tokens[0],
    )
    for key in keys:
        index = int(key[1:])
        operation.add_page(
            PageDescriptor(
                key=key,
                token_start=index * 16,
                token_end=(index + 1) * 16,
                tier=tier,
                bytes=1000 if tier is not Tier.GPU else None,
                used=True if op is Op.FETCH else None,
            )
        )
    operation.end(Outcome.HIT if op is Op.FETCH else None, tokens_hit=tokens and tokens[1])


@pytest.fixture
def store(tmp_path: Path) -> TraceStore:
    emitter = setup_emitter("r1", f"file:{tmp_path / 'r1.jsonl'}")
    _op(emitter, Op.STORE, 0, ["k0", "k1", "k2"])
    _op(emitter, Op.EVICT, 1, ["k2"])  # used again at 3 s: before its next use
    _op(emitter, Op.EVICT, 2, ["k1"], reason=EvictReason.CAPACITY)  # never used again
    _op(emitter, Op.STORE, 3, ["k0", "k2"])  # k0 still held: a GPU hit; k2 computed again
    _op(emitter, Op.FETCH, 4, ["k3"], tier=Tier.CPU, tokens=(16, 16))
    _op(emitter, Op.STORE, 4.5, ["k3"])  # loaded from the pool
    _op(emitter, Op.STORE, 5, ["k4"], tier=Tier.CPU)
    _op(emitter, Op.EVICT, 6, ["k4"], tier=Tier.CPU, reason=EvictReason.CAPACITY)
    _op(emitter, Op.FETCH, 7, [], tier=Tier.CPU, tokens=(16, 0))
    emitter.shutdown()
    trace_store = TraceStore([tmp_path])
    trace_store.refresh()
    return trace_store


def test_before_reuse(store: TraceStore):
    columns, rows = store.query(load("evictions/before_reuse"))
    assert columns[:7] == ["replica", "backend", "tier", "key", "token_start", "token_end", "reason"]
    assert [(r[3], r[6], r[9], r[12]) for r in rows] == [("k2", None, "store", 2000.0)]


def test_occupancy(store: TraceStore):
    _, rows = store.query(load("evictions/occupancy"))
    gpu = [(pages, stored, evicted) for _, _, tier, _, pages, _, stored, evicted in rows if tier == "gpu"]
    cpu = [(pages, size, evicted) for _, _, tier, _, pages, size, _, evicted in rows if tier == "cpu"]
    # One-second intervals: 0 s (3 stored), 1 s (k2 out), 2 s (k1 out), 3 s (k2 back), 4 s (k3 in).
    assert gpu == [(3, 3, 0), (2, 0, 1), (1, 0, 1), (2, 1, 0), (3, 1, 0)]
    assert cpu == [(1, 1000, 0), (0, 0, 1)]


def test_rates(store: TraceStore):
    _, rows = store.query(load("evictions/rates"))
    by_second = {round((row[1].timestamp() * S - T0) / S): row for row in rows}
    assert by_second[1][3:5] == (1, 1.0)
    assert by_second[4][6:] == (16, 16, 1.0)
    assert by_second[7][6:] == (16, 0, 0.0)


def test_hit_tier(store: TraceStore):
    _, rows = store.query(load("evictions/hit_tier"))
    assert [(key, served, tier) for _, _, key, _, _, served, _, tier in rows] == [
        ("k0", "miss", None),
        ("k1", "miss", None),
        ("k2", "miss", None),
        ("k0", "gpu", None),
        ("k2", "miss", None),
        ("k3", "pool", "cpu"),
    ]
