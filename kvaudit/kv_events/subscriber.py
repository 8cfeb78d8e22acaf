"""Subscribing to vLLM KV event publishers: receive, detect gaps, replay, translate.

One SUB socket per publisher endpoint, each with its own sequence tracker, replay
client and translator. What can be recovered from a publisher's replay buffer is
applied in order before the batch that revealed the gap; what cannot is counted as
lost batches in the replica's `kvaudit.telemetry` spans, never silently skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from kvaudit.emit.emitter import Emitter
from kvaudit.kv_events.replay import ReplayClient
from kvaudit.kv_events.sequence import Gap, SequenceTracker
from kvaudit.kv_events.to_spans import StreamTranslator
from kvaudit.kv_events.wire import decode_batch, decode_seq

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    """One vLLM publisher.

    Args:
        endpoint: its `endpoint`, seen from here. vLLM binds a wildcard endpoint
            (`tcp://*:5557`) and connects to any other; the subscriber does the
            opposite, so `tcp://HOST:5557` connects to a binding vLLM and `tcp://*:5557`
            binds for a vLLM configured to connect here. One publisher per endpoint:
            sequence numbers are per publisher.
        replica: the replica id its spans carry.
        replay: its `replay_endpoint`, seen from here, or None when it has none.
        topic: its `topic`.
    """

    endpoint: str
    replica: str
    replay: str | None = None
    topic: str = ""


@dataclass
class SubscriberStats:
    batches: int = 0
    replayed: int = 0
    gaps: int = 0
    lost: int = 0
    undecodable: int = 0
    unknown_events: int = 0
    restarts: int = 0


class _Stream:
    def __init__(
        self,
        source: Source,
        socket: zmq.Socket,
        emitter: Emitter,
        translator: StreamTranslator,
        replay: ReplayClient | None,
    ) -> None:
        self.source = source
        self.socket = socket
        self.emitter = emitter
        self.translator = translator
        self.replay = replay
        self.tracker = SequenceTracker()


class KVEventSubscriber:
    """Receives KV events from vLLM publishers and emits them as kvaudit spans.

    Args:
        sources: the publishers.
        emitter_for: the emitter of a replica id (called once per source).
        hash_algo: vLLM's `prefix_caching_hash_algo`, for the pages' `hash_algo`.
        replay_timeout_s: longest wait for a replay reply frame.
        receive_hwm: messages queued per socket before ZMQ drops (drops show up as gaps).

    Raises:
        zmq.ZMQError: an endpoint cannot be bound or connected.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        emitter_for: Callable[[str], Emitter],
        *,
        hash_algo: str | None = None,
        replay_timeout_s: float = 2.0,
        receive_hwm: int = 100_000,
        context: zmq.Context | None = None,
    ) -> None:
        self.stats = SubscriberStats()
        self._context = context or zmq.Context.instance()
        self._poller = zmq.Poller()
        self._streams: dict[zmq.Socket, _Stream] = {}
        self._monitors: list[zmq.Socket] = []
        for source in sources:
            socket = self._context.socket(zmq.SUB)
            # Created before connecting, so that no handshake goes unseen (see `wait_connected`).
            self._monitors.append(socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED))
            socket.setsockopt(zmq.RCVHWM, receive_hwm)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.SUBSCRIBE, source.topic.encode())
            if "*" in source.endpoint:
                socket.bind(source.endpoint)
            else:
                socket.connect(source.endpoint)
            emitter = emitter_for(source.replica)
            replay = ReplayClient(self._context, source.replay, timeout_s=replay_timeout_s) if source.replay else None
            stream = _Stream(source, socket, emitter, StreamTranslator(emitter, hash_algo=hash_algo), replay)
            self._streams[socket] = stream
            self._poller.register(socket, zmq.POLLIN)

    def poll(self, timeout_ms: int = 100) -> int:
        """Handle what arrives within `timeout_ms`; returns the batches received live."""
        handled = 0
        for socket, _ in self._poller.poll(timeout_ms):
            stream = self._streams[socket]
            while True:
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._receive(stream, frames)
                handled += 1
        return handled

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait until every source's socket has completed a handshake with its publisher.

        ZMQ drops what a publisher sends before a subscriber has connected (its "slow
        joiner"): a caller that needs every batch from some point on waits here first.

        Returns:
            False when a source did not connect within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while self._monitors:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not self._monitors[0].poll(remaining_ms):
                return False
            recv_monitor_message(self._monitors[0])
            self._monitors.pop(0).close()
        return True

    def run(self, stop: threading.Event) -> None:
        """Poll until `stop` is set."""
        while not stop.is_set():
            self.poll()

    def close(self) -> None:
        for socket in [*self._monitors, *self._streams]:
            socket.close()
        self._monitors.clear()
        self._streams.clear()

    def _receive(self, stream: _Stream, frames: list[bytes]) -> None:
        if len(frames) != 3:
            # Without a sequence number this cannot be placed; the next batch shows the gap.
            logger.warning("kvaudit: message of %d frames from %s ignored", len(frames), stream.source.endpoint)
            return
        observed = stream.tracker.observe(decode_seq(frames[1]))
        if observed.restarted:
            self.stats.restarts += 1
            logger.warning("kvaudit: publisher %s restarted; its cached blocks are gone", stream.source.endpoint)
            stream.translator.clear(time.time_ns())
        if observed.gap is not None:
            self._recover(stream, observed.gap)
        self._apply(stream, frames[2])

    def _recover(self, stream: _Stream, gap: Gap) -> None:
        self.stats.gaps += 1
        found = stream.replay.fetch(gap.start, gap.stop) if stream.replay else {}
        for seq in sorted(found):
            self._apply(stream, found[seq])
        self.stats.replayed += len(found)
        lost = gap.size - len(found)
        if lost:
            logger.warning(
                "kvaudit: %s: %d of batches %d..%d missed and not replayed (%s); counted as telemetry loss",
                stream.source.replica,
                lost,
                gap.start,
                gap.stop - 1,
                "no replay endpoint" if stream.replay is None else "no longer in the publisher's buffer",
            )
            self._lose(stream, lost)

    def _apply(self, stream: _Stream, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except msgspec.DecodeError as exc:
            logger.warning("kvaudit: undecodable KV event batch from %s: %s", stream.source.endpoint, exc)
            self.stats.undecodable += 1
            self._lose(stream, 1)
            return
        self.stats.batches += 1
        self.stats.unknown_events += batch.unknown
        stream.translator.translate(batch)

    def _lose(self, stream: _Stream, batches: int) -> None:
        self.stats.lost += batches
        stream.emitter.count_lost_batches(batches)
