"""A bounded queue of finished spans exported in batches by one background thread.

The serving thread only appends to a deque: a `ReadableSpan`, or an `Unbuilt` span
whose `ReadableSpan` the worker builds before it encodes it. Building, encoding and
I/O all happen on the worker, which gives way to other threads between spans
(`give_way`): serving waits for the GIL a fraction of a millisecond at most, not the
switch interval. Unlike the SDK's `BatchSpanProcessor`, a full queue is counted rather
than logged, so the count can travel in the trace as telemetry loss.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from kvaudit.emit import give_way as give_ways
from kvaudit.emit.give_way import GiveWay

logger = logging.getLogger(__name__)


class Unbuilt(Protocol):
    """A finished span whose `ReadableSpan` is made on the exporter's thread, not the caller's."""

    def build(self) -> ReadableSpan: ...


@dataclass
class BatcherStats:
    dropped_spans: int = 0
    failed_exports: int = 0
    exported_spans: int = 0


class SpanBatcher:
    """Export spans in batches, off the caller's thread.

    Args:
        exporter: where batches go; its exceptions are counted, never raised.
        max_queue: spans held at most; a span submitted to a full queue is dropped and counted.
        max_batch: spans per `export` call.
        max_batch_events: page events per `export` call (a batch ends before the span
            that would pass it; a span with more goes alone). An exporter ends a batch
            with one call that cannot give way (a file line's framing; joining an OTLP
            request; with the official OTLP exporter, its whole encoding and protobuf's
            `SerializeToString`, whose time grows with the events), so the default keeps it
            under the switch interval; one OTLP request stays far
            within a receiver's body limit too (the Collector's default is 20 MiB; a
            descriptor is about 700 bytes).
        delay_s: longest time a span waits before its batch is exported.
        give_way: how the worker gives way to other threads (`kvaudit.emit.give_way`),
            installed as its thread's, where the exporter finds it too; default a
            `GiveWay()`.

    `undelivered`, when set, is called (on the worker thread) with each batch that
    could not be exported: the emitter's fallback for telemetry that never arrives.
    `exported`, when set, is called on the worker thread after each export, delivered
    or not: where the emitter looks at its loss counts, off the serving thread.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue: int = 8192,
        max_batch: int = 512,
        max_batch_events: int = 1024,
        delay_s: float = 1.0,
        give_way: GiveWay | None = None,
    ) -> None:
        self.exporter = exporter
        self.stats = BatcherStats()
        self._queue: deque[ReadableSpan | Unbuilt] = deque()
        self._max_queue = max_queue
        self._max_batch = max_batch
        self._max_batch_events = max_batch_events
        self._delay_s = delay_s
        self._give_way = give_way or GiveWay()
        self.undelivered: Callable[[Sequence[ReadableSpan]], None] | None = None
        self.exported: Callable[[], None] | None = None
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._exporting = False
        self._in_flight = 0
        self._abandoned = False
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="kvaudit-exporter", daemon=True)
        self._worker.start()

    def submit(self, span: ReadableSpan | Unbuilt, *, reserved: bool = False) -> bool:
        """Queue a finished span; False when it was dropped (queue full or closed).

        A `reserved` span (the emitter reporting its own losses) may go past a full
        queue, so that the report of drops is not itself dropped.
        """
        if self._closed or (len(self._queue) >= self._max_queue and not reserved):
            self.stats.dropped_spans += 1
            return False
        self._queue.append(span)
        if len(self._queue) >= self._max_batch:
            self._wake.set()
        return True

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export everything queued so far; False if it did not finish in time."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        with self._idle:
            while self._queue or self._exporting:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._wake.set()
                self._idle.wait(min(remaining, 0.05))
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Export what is queued, taking `timeout_s` at most in all (never raises).

        What could not be exported by then (still queued, or in an export that has not
        returned) is counted as dropped; the worker thread is a daemon and is left behind.
        """
        deadline = time.monotonic() + timeout_s
        self.flush(timeout_s)
        self._closed = True
        self._wake.set()
        self._worker.join(max(0.0, deadline - time.monotonic()))
        if self._worker.is_alive():
            with self._idle:
                self._abandoned = True
                left = len(self._queue) + self._in_flight
                self._queue.clear()
            self.stats.dropped_spans += left
        # Closing the exporter may block as well (a hung file system or connection).
        closer = threading.Thread(target=self._shutdown_exporter, name="kvaudit-exporter-close", daemon=True)
        closer.start()
        closer.join(max(0.0, deadline - time.monotonic()))

    def _shutdown_exporter(self) -> None:
        try:
            self.exporter.shutdown()
        except Exception as exc:
            logger.warning("kvaudit: closing the span exporter failed (%s)", exc)

    def _run(self) -> None:
        give_ways.install(self._give_way)
        while not (self._closed and not self._queue):
            self._wake.wait(self._delay_s)
            self._wake.clear()
            self._give_way.resume()
            while self._queue:
                self._export(self._take_batch())
                self._give_way()
                if self.exported is not None:
                    try:
                        self.exported()
                    except Exception as exc:
                        logger.debug("kvaudit: the after-export call failed (%s)", exc)
            with self._idle:
                self._idle.notify_all()

    def _take_batch(self) -> Sequence[ReadableSpan]:
        batch: list[ReadableSpan] = []
        events = 0
        with self._idle:
            self._exporting = True
            while self._queue and len(batch) < self._max_batch:
                self._give_way()  # between spans (built here, most of them)
                span = self._queue[0]
                if not isinstance(span, ReadableSpan):
                    try:
                        # Left in the queue while built, so that flush still waits for it.
                        span = self._queue[0] = span.build()
                    except Exception as exc:  # its maker counts its own failures; here it is a drop
                        self._queue.popleft()
                        self.stats.dropped_spans += 1
                        logger.debug("kvaudit: building a span failed (%r)", exc)
                        continue
                span_events = len(span.events)
                if batch and events + span_events > self._max_batch_events:
                    break
                batch.append(self._queue.popleft())
                events += span_events
            self._in_flight = len(batch)
        return batch

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        try:
            result = self.exporter.export(batch)
        except Exception as exc:
            result = SpanExportResult.FAILURE
            if not self.stats.failed_exports:
                logger.warning("kvaudit: exporting spans failed (%s); counting further failures", exc)
        with self._idle:
            abandoned = self._abandoned  # shutdown gave up on this batch and counted it already
            self._exporting = False
            self._in_flight = 0
        if abandoned:
            return
        if result is SpanExportResult.SUCCESS:
            self.stats.exported_spans += len(batch)
            return
        self.stats.failed_exports += 1
        self.stats.dropped_spans += len(batch)
        if self.undelivered is not None:
            try:
                self.undelivered(batch)
            except Exception as exc:
                logger.debug("kvaudit: reporting an undelivered batch failed (%s)", exc)
