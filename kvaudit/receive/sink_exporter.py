"""A span exporter writing into the receiver's `TraceSink`: spans made inside `kvaudit collect`.

Spans that `kvaudit collect` makes itself (from vLLM's KV events) land in the same
per-replica files as the spans replicas send it, through the same writer, so one
process never opens a replica's file twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from kvaudit.otlp.encode import line_to_traces_data, spans_to_line
from kvaudit.receive.trace_sink import TraceSink


class SinkExporter(SpanExporter):
    def __init__(self, sink: TraceSink) -> None:
        self._sink = sink

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._sink.write(line_to_traces_data(spans_to_line(spans)))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """The sink belongs to the receiver, which closes it."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
