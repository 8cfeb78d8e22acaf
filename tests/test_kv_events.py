"""vLLM KV events as a source, against real ZMQ sockets speaking vLLM's wire format.

The payloads here are written as vLLM's `msgspec` encoder writes a `KVEventBatch`
(an array `[ts, events, dp_rank]` of `type`-tagged maps, checked against vLLM itself
in test_kv_events_vllm.py); the replay server answers as vLLM's
`ZmqEventPublisher._service_replay` does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from kvaudit.emit.emitter import Emitter, setup_emitter
from kvaudit.kv_events.sequence import Gap, SequenceTracker
from kvaudit.kv_events.subscriber import KVEventSubscriber, Source
from kvaudit.kv_events.wire import block_key, decode_batch, encode_seq, key_hash_algo
from kvaudit.read.store import TraceStore

HASHES = [bytes([i]) * 32 for i in range(1, 5)]


def stored(hashes: list[bytes | int], parent: bytes | int | None, block_size: int = 16) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": list(range(len(hashes) * block_size)),
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def removed(hashes: list[bytes | int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


CLEARED = {"type": "AllBlocksCleared"}


T0 = 1_700_000_000.0


def payload(*events: dict[str, Any], ts: float = T0) -> bytes:
    return msgspec.msgpack.encode([ts, list(events), None])


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


class Publisher:
    """A publishing socket and, optionally, a replay ROUTER holding every batch published.

    An XPUB, vLLM's PUB as subscribers see it, which also tells the publisher when a
    subscription arrives: the handshake that replaces waiting out ZMQ's slow joiner.
    """

    def __init__(self, context: zmq.Context, replay: bool) -> None:
        self.pub = context.socket(zmq.XPUB)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.buffer: list[tuple[int, bytes]] = []
        self.router = context.socket(zmq.ROUTER) if replay else None
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1") if self.router else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._lock = threading.Lock()
        if self.router:
            self._thread.start()

    def wait_subscribed(self, timeout_s: float = 30.0) -> None:
        """Until a subscriber's subscription has reached this socket: what is sent from now on reaches it."""
        assert self.pub.poll(int(timeout_s * 1000)), "no subscriber subscribed"
        assert self.pub.recv()[:1] == b"\x01"  # a subscribe message (XPUB passes them up)

    def send(self, seq: int, data: bytes, *, drop: bool = False) -> None:
        """Publish batch `seq`; `drop` keeps it only in the replay buffer, as if ZMQ lost it."""
        with self._lock:
            self.buffer.append((seq, data))
        if not drop:
            self.pub.send_multipart((b"", encode_seq(seq), data))

    def _serve(self) -> None:
        assert self.router is not None
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            client, _, start = self.router.recv_multipart()
            with self._lock:
                held = [(s, d) for s, d in self.buffer if s >= int.from_bytes(start, "big")]
            for seq, data in held:
                self.router.send_multipart((client, b"", b"", encode_seq(seq), data))
            self.router.send_multipart((client, b"", b"", encode_seq(-1), b""))

    def close(self) -> None:
        self._stop.set()
        if self.router:
            self._thread.join()
            self.router.close()
        self.pub.close()


def _subscribe(context: zmq.Context, publisher: Publisher, trace: Path) -> tuple[KVEventSubscriber, dict[str, Emitter]]:
    emitters: dict[str, Emitter] = {}

    def emitter_for(replica: str) -> Emitter:
        return emitters.setdefault(replica, setup_emitter(replica, f"file:{trace}", export_delay_s=0.05))

    replay = f"tcp://127.0.0.1:{publisher.replay_port}" if publisher.replay_port else None
    source = Source(f"tcp://127.0.0.1:{publisher.port}", "r1", replay)
    subscriber = KVEventSubscriber([source], emitter_for, hash_algo="sha256", replay_timeout_s=1.0, context=context)
    publisher.wait_subscribed()  # a SUB sees only what is published after it has subscribed
    return subscriber, emitters


def _drain(subscriber: KVEventSubscriber, batches: int) -> None:
    deadline = time.monotonic() + 10
    while subscriber.stats.batches < batches and time.monotonic() < deadline:
        subscriber.poll(50)


def _read(trace: Path, emitters: dict[str, Emitter]) -> TraceStore:
    for emitter in emitters.values():
        emitter.shutdown()
    store = TraceStore([trace])
    store.refresh()
    return store


def test_stores_and_evictions_become_gpu_tier_spans(context: zmq.Context, tmp_path: Path):
    publisher = Publisher(context, replay=False)
    subscriber, emitters = _subscribe(context, publisher, tmp_path / "r1.jsonl")
    publisher.send(0, payload(stored(HASHES[:2], None)))
    publisher.send(1, payload(stored(HASHES[2:], HASHES[1]), ts=1_700_000_001.0))
    publisher.send(2, payload(removed([HASHES[3]]), removed([HASHES[2]]), ts=1_700_000_002.0))
    publisher.send(3, payload(CLEARED, ts=1_700_000_003.0))
    _drain(subscriber, 4)
    subscriber.close()
    publisher.close()
    store = _read(tmp_path / "r1.jsonl", emitters)
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
    subscriber, emitters = _subscribe(context, publisher, tmp_path / "r1.jsonl")
    publisher.send(0, payload(stored(HASHES[:1], None)))
    publisher.send(1, payload(stored(HASHES[1:2], HASHES[0])), drop=True)
    publisher.send(2, payload(stored(HASHES[2:3], HASHES[1])))
    _drain(subscriber, 2)
    subscriber.close()
    publisher.close()
    assert (subscriber.stats.gaps, subscriber.stats.lost) == (1, 1)
    store = _read(tmp_path / "r1.jsonl", emitters)
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
    subscriber, emitters = _subscribe(context, publisher, tmp_path / "r1.jsonl")
    publisher.send(2, payload(stored(HASHES[2:3], HASHES[1]), ts=T0 + 2))
    publisher.send(3, payload(removed([HASHES[0]]), ts=T0 + 3), drop=True)
    publisher.send(4, payload(stored(HASHES[3:4], HASHES[2]), ts=T0 + 4))
    _drain(subscriber, 5)
    subscriber.close()
    publisher.close()
    stats = subscriber.stats
    assert (stats.gaps, stats.replayed, stats.lost, stats.batches) == (2, 3, 0, 5)
    store = _read(tmp_path / "r1.jsonl", emitters)
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
