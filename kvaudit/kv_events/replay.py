"""Asking a vLLM publisher's replay socket for batches the subscriber missed.

vLLM's publisher keeps its last `buffer_steps` batches and serves them on a ROUTER
socket (`replay_endpoint`): a request is the first wanted sequence number (8 bytes,
big-endian); the answer is every buffered batch from there on as `[topic, seq,
payload]`, then an end marker whose sequence number is -1.
"""

from __future__ import annotations

import logging
from typing import Final

import zmq

from kvaudit.kv_events.wire import decode_seq, encode_seq

logger = logging.getLogger(__name__)

END_SEQ: Final = -1


class ReplayClient:
    """Fetches missed batches from one replay endpoint.

    Args:
        context: the ZMQ context.
        endpoint: the publisher's `replay_endpoint` (vLLM binds it; this connects).
        timeout_s: longest wait for each reply frame; past it the replay is abandoned.
    """

    def __init__(self, context: zmq.Context, endpoint: str, *, timeout_s: float = 2.0) -> None:
        self._context = context
        self.endpoint = endpoint
        self._timeout_ms = int(timeout_s * 1000)

    def fetch(self, start: int, stop: int) -> dict[int, bytes]:
        """Payloads of the batches `start` up to `stop` (exclusive) that the publisher still holds.

        Never raises for a publisher that is gone or slow: what did not arrive is simply
        absent from the result, for the caller to count as lost.
        """
        found: dict[int, bytes] = {}
        # A fresh socket per replay: replies to an abandoned request must not be read as
        # replies to the next one.
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        try:
            socket.connect(self.endpoint)
            socket.send_multipart((b"", encode_seq(start)))
            while socket.poll(self._timeout_ms):
                frames = socket.recv_multipart()
                if len(frames) != 4:
                    logger.warning("kvaudit: malformed replay reply from %s (%d frames)", self.endpoint, len(frames))
                    continue
                seq = decode_seq(frames[2])
                if seq == END_SEQ:
                    return found
                if start <= seq < stop:
                    found[seq] = frames[3]
                elif seq >= stop:
                    # Later batches are delivered live; no need to wait for the rest.
                    return found
            logger.warning("kvaudit: replay from %s timed out after seq %d", self.endpoint, start)
            return found
        except zmq.ZMQError as exc:
            logger.warning("kvaudit: replay from %s failed: %s", self.endpoint, exc)
            return found
        finally:
            socket.close()
