"""A span exporter writing OTLP JSON lines, one export batch per line."""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from kvaudit.emit import give_way
from kvaudit.emit.line_file import LineFile
from kvaudit.otlp.encode import spans_to_line

DEFAULT_MAX_BYTES = 256 * 1024 * 1024


class OTLPJsonFileExporter(SpanExporter):
    """Write spans as the Collector's file exporter does, rotating by size.

    Never raises on construction: a file that cannot be opened yet (a read-only or
    missing directory) is tried again at each export, and each export that cannot be
    written raises `OSError` with nothing of it in the file, for the batcher to count.

    Args:
        path: the trace file; `{pid}` is expanded, and a file held by another process
            is never shared (see `LineFile`).
        max_bytes: rotation size.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._file = LineFile(path, max_bytes=max_bytes)

    @property
    def path(self) -> str:
        return str(self._file.path)

    @property
    def lost_spans(self) -> int:
        """Spans written into a trace file that was deleted afterwards (noticed at the next write)."""
        return self._file.stats.lost_items

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        # On the emitter's exporter thread, which gives way between spans as it encodes them.
        self._file.write(spans_to_line(spans, give_way.current()), items=len(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
