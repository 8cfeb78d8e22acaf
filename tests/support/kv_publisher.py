"""A publisher speaking vLLM's KV event protocol on real ZMQ sockets, and a subscriber's side to read it.

The publisher sends batches as vLLM's `ZmqEventPublisher` does (`[topic, seq, payload]`)
and answers replay requests as its `_service_replay` does; what is published is read by
kvaudit's own `KVEventSubscriber` into a trace file.
"""

from __future__ import annotations

import threading
from pathlib import Path

import zmq

from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter
from kvaudit.kv_events.subscriber import KVEventSubscriber, Source
from kvaudit.kv_events.wire import encode_seq
from kvaudit.read.store import TraceStore

from .waiting import wait_until


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


def subscribe(context: zmq.Context, publisher: Publisher, trace: Path) -> tuple[KVEventSubscriber, dict[str, Emitter]]:
    emitters: dict[str, Emitter] = {}

    def emitter_for(replica: str) -> Emitter:
        return emitters.setdefault(replica, setup_emitter(replica, f"file:{trace}", export_delay_s=0.05))

    replay = f"tcp://127.0.0.1:{publisher.replay_port}" if publisher.replay_port else None
    source = Source(f"tcp://127.0.0.1:{publisher.port}", "r1", replay)
    subscriber = KVEventSubscriber([source], emitter_for, hash_algo="sha256", replay_timeout_s=1.0, context=context)
    publisher.wait_subscribed()  # a SUB sees only what is published after it has subscribed
    return subscriber, emitters


def drain(subscriber: KVEventSubscriber, batches: int) -> None:
    """Let `subscriber` handle what arrives until it has received `batches` batches."""

    def received() -> bool:
        subscriber.poll(50)
        return subscriber.stats.batches >= batches

    wait_until(received, what=f"{batches} batches received", interval=0)


def read_trace(trace: Path, emitters: dict[str, Emitter]) -> TraceStore:
    for emitter in emitters.values():
        emitter.shutdown()
    store = TraceStore([trace])
    store.refresh()
    return store
