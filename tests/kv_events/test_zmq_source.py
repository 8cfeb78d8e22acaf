"""vLLM KV events as a source, against real ZMQ sockets speaking vLLM's wire format.

The payloads are written as vLLM's `msgspec` encoder writes a `KVEventBatch`
(tests/support/kv_event_messages.py, checked against vLLM itself in
tests/kv_events/test_vllm_engine.py); the replay server answers as vLLM's
`ZmqEventPublisher._service_replay` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq

from kvaudit.kv_events.sequence import Gap, SequenceTracker
from kvaudit.kv_events.wire import block_key, decode_batch, key_hash_algo

from ..support.kv_event_messages import CLEARED, HASHES, T0, payload, removed, stored
from ..support.kv_publisher import Publisher, drain, read_trace, subscribe


def test_decode_known_and_unknown_events():
    batch = decode_batch(payload(stored(HASHES[:2], None), {"type": "BlockReused", "x": 1}, CLEARED))
    assert [type(e).__name__ for e in batch.events] == ["BlockStored", "AllBlocksCleared"]
    assert batch.unknown == 1
    with pytest.raises(msgspec.DecodeError):
        decode_batch(b"\x93not a batch")


def test_keys_of_digests_and_truncated_ints():
    digest = bytes(range(32))
    low64 = int.from_bytes(digest, "big") & ((1 << 64) - 1)
    assert block_key(digest) == digest.hex()
    assert block_key(low64) == digest.hex()[-16:]
    assert key_hash_algo(digest, "sha256") == "sha256"
    assert key_hash_algo(low64, "sha256") == "sha256_low64"


def test_sequence_gaps_and_restarts():
    tracker = SequenceTracker()
    assert tracker.observe(0).gap is None
    assert tracker.observe(3).gap == Gap(1, 3)
    restarted = tracker.observe(0)
    assert restarted.restarted and restarted.gap is None
    late = SequenceTracker().observe(5)
    assert late.gap == Gap(0, 5) and late.gap.size == 5


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_stores_and_evictions_become_gpu_tier_spans(context: zmq.Context, tmp_path: Path):
    publisher = Publisher(context, replay=False)
    subscriber, emitters = subscribe(context, publisher, tmp_path / "r1.jsonl")
    publisher.send(0, payload(stored(HASHES[:2], None)))
    publisher.send(1, payload(stored(HASHES[2:], HASHES[1]), ts=1_700_000_001.0))
    publisher.send(2, payload(removed([HASHES[3]]), removed([HASHES[2]]), ts=1_700_000_002.0))
    publisher.send(3, payload(CLEARED, ts=1_700_000_003.0))
    drain(subscriber, 4)
    subscriber.close()
    publisher.close()
    store = read_trace(tmp_path / "r1.jsonl", emitters)
    _, pages = store.query(
        "SELECT op, key, token_start, token_end, tier, hash_algo, time_ns FROM pages ORDER BY time_ns, token_start"
    )
    keys = [h.hex() for h in HASHES]
    start = 1_700_000_000 * 10**9
    assert pages == [
        ("store", keys[0], 0, 16, "gpu", "sha256", start),
        ("store", keys[1], 16, 32, "gpu", "sha256", start),
        ("store", keys[2], 32, 48, "gpu", "sha256", start + 10**9),
        ("store", keys[3], 48, 64, "gpu", "sha256", start + 10**9),
        # Two removals of one batch are one evict span; their ranges are remembered from the stores.
        ("evict", keys[2], 32, 48, "gpu", "sha256", start + 2 * 10**9),
        ("evict", keys[3], 48, 64, "gpu", "sha256", start + 2 * 10**9),
        # The reset evicts what was still cached.
        ("evict", keys[0], 0, 16, "gpu", "sha256", start + 3 * 10**9),
        ("evict", keys[1], 16, 32, "gpu", "sha256", start + 3 * 10**9),
    ]
    _, spans = store.query(
        "SELECT op, hook, backend, pages, tokens_stored, block_size, evict_reason FROM spans"
        " WHERE op IS NOT NULL ORDER BY start_ns"
    )
    assert spans == [
        ("store", "vllm.kv_events", "vllm.prefix_cache", 2, 32, 16, None),
        ("store", "vllm.kv_events", "vllm.prefix_cache", 2, 32, 16, None),
        ("evict", "vllm.kv_events", "vllm.prefix_cache", 2, None, None, None),
        ("evict", "vllm.kv_events", "vllm.prefix_cache", 2, None, None, "cleared"),
    ]
    assert subscriber.stats.lost == 0 and subscriber.stats.gaps == 0


def test_dropped_batch_without_replay_is_telemetry_loss(context: zmq.Context, tmp_path: Path):
    publisher = Publisher(context, replay=False)
    subscriber, emitters = subscribe(context, publisher, tmp_path / "r1.jsonl")
    publisher.send(0, payload(stored(HASHES[:1], None)))
    publisher.send(1, payload(stored(HASHES[1:2], HASHES[0])), drop=True)
    publisher.send(2, payload(stored(HASHES[2:3], HASHES[1])))
    drain(subscriber, 2)
    subscriber.close()
    publisher.close()
    assert (subscriber.stats.gaps, subscriber.stats.lost) == (1, 1)
    store = read_trace(tmp_path / "r1.jsonl", emitters)
    _, lost = store.query("SELECT max(telemetry_lost_batches) FROM spans WHERE replica = 'r1'")
    assert lost == [(1,)]
    # The block after the gap is still recorded, without the token range that its lost parent held.
    _, pages = store.query("SELECT key, token_start FROM pages ORDER BY time_ns, key")
    assert sorted(pages) == sorted([(HASHES[0].hex(), 0), (HASHES[2].hex(), None)])


def test_late_subscriber_and_dropped_batch_recovered_by_replay(context: zmq.Context, tmp_path: Path):
    publisher = Publisher(context, replay=True)
    # Published before the subscriber exists: only the replay buffer has them.
    publisher.send(0, payload(stored(HASHES[:1], None), ts=T0), drop=True)
    publisher.send(1, payload(stored(HASHES[1:2], HASHES[0]), ts=T0 + 1), drop=True)
    subscriber, emitters = subscribe(context, publisher, tmp_path / "r1.jsonl")
    publisher.send(2, payload(stored(HASHES[2:3], HASHES[1]), ts=T0 + 2))
    publisher.send(3, payload(removed([HASHES[0]]), ts=T0 + 3), drop=True)
    publisher.send(4, payload(stored(HASHES[3:4], HASHES[2]), ts=T0 + 4))
    drain(subscriber, 5)
    subscriber.close()
    publisher.close()
    stats = subscriber.stats
    assert (stats.gaps, stats.replayed, stats.lost, stats.batches) == (2, 3, 0, 5)
    store = read_trace(tmp_path / "r1.jsonl", emitters)
    _, pages = store.query("SELECT op, key, token_start FROM pages ORDER BY time_ns")
    assert [(op, start) for op, _, start in pages] == [
        ("store", 0),
        ("store", 16),
        ("store", 32),
        ("evict", 0),
        ("store", 48),
    ]
    _, lost = store.query("SELECT count(*) FROM spans WHERE telemetry_lost_batches > 0")
    assert lost == [(0,)]
