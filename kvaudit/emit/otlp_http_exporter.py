"""The official OTLP/HTTP span exporter, sending kvaudit's own protobuf encoding of the spans."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from kvaudit.emit import give_way
from kvaudit.otlp.encode_protobuf import spans_to_request


class OTLPHttpExporter(OTLPSpanExporter):
    """`OTLPSpanExporter` (its configuration from `OTEL_EXPORTER_OTLP_*`, session, compression,
    timeout and retries), with the request encoded by `spans_to_request`.

    The official `export` encodes a batch with `opentelemetry-proto`'s classes, an object per
    span, event and attribute, in one call with the GIL held: a serving thread back from the
    GPU waits for it (docs/design.md section 2). Here the same bytes are made span by span, the
    exporter thread giving way between spans (`give_way`), and handed to the official
    sending: `export` gives the official method no spans to encode, and its one POST,
    `_export` (the first argument the request's bytes, in every release from 1.27 to 1.40),
    sends the bytes made here instead of the empty request. The request waits for it in a
    thread-local: the official `export` posts on the thread that called it, and the SDK's
    `SimpleSpanProcessor` may call `export` from several threads at once.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending = threading.local()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._pending.request = spans_to_request(spans, give_way.current())
        try:
            return super().export(())
        finally:
            self._pending.request = None

    def _export(self, serialized_data: bytes, *args: Any, **kwargs: Any) -> Any:
        request = getattr(self._pending, "request", None)
        return super()._export(serialized_data if request is None else request, *args, **kwargs)
