"""A bounded queue of finished spans exported in batches by one background thread.

The serving thread only appends to a deque; encoding and I/O happen on the worker.
Unlike the SDK's `BatchSpanProcessor`, a full queue is counted rather than logged,
so the count can travel in the trace as telemetry loss.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

logger = logging.getLogger(__name__)


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
        delay_s: longest time a span waits before its batch is exported.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue: int = 8192,
        max_batch: int = 512,
        delay_s: float = 1.0,
    ) -> None:
        self.exporter = exporter
        self.stats = BatcherStats()
        self._queue: deque[ReadableSpan] = deque()
        self._max_queue = max_queue
        self._max_batch = max_batch
        self._delay_s = delay_s
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._exporting = False
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="kvaudit-exporter", daemon=True)
        self._worker.start()

    def submit(self, span: ReadableSpan, *, reserved: bool = False) -> bool:
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
        self.flush(timeout_s)
        self._closed = True
        self._wake.set()
        self._worker.join(timeout_s)
        self.exporter.shutdown()

    def _run(self) -> None:
        while not (self._closed and not self._queue):
            self._wake.wait(self._delay_s)
            self._wake.clear()
            while self._queue:
                self._export(self._take_batch())
            with self._idle:
                self._idle.notify_all()

    def _take_batch(self) -> Sequence[ReadableSpan]:
        with self._idle:
            self._exporting = True
        take = min(len(self._queue), self._max_batch)
        return [self._queue.popleft() for _ in range(take)]

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        try:
            result = self.exporter.export(batch)
        except Exception as exc:
            result = SpanExportResult.FAILURE
            if not self.stats.failed_exports:
                logger.warning("kvaudit: exporting spans failed (%s); counting further failures", exc)
        if result is SpanExportResult.SUCCESS:
            self.stats.exported_spans += len(batch)
        else:
            self.stats.failed_exports += 1
            self.stats.dropped_spans += len(batch)
        with self._idle:
            self._exporting = False
