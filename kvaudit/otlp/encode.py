"""OTLP JSON lines, as the OpenTelemetry Collector's file exporter writes them.

OTLP JSON is protobuf's JSON mapping with three differences (OTLP specification,
"JSON Protobuf Encoding"): trace and span ids are hex rather than base64, enums are
integers, and 64-bit integers are strings. Lines are rendered from msgspec structs
(`otlp_schema`) rather than through `google.protobuf.json_format`, which costs about
twenty times more per page descriptor; tests hold the output equal to what the
`opentelemetry-proto` encoders produce for the same spans.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec
from google.protobuf import json_format
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace import ReadableSpan

from kvaudit.otlp import schema as s
from kvaudit.otlp.encoded_once import EncodedOnce
from kvaudit.otlp.span_fields import KIND, STATUS_CODE, flags


def spans_to_line(spans: Sequence[ReadableSpan], each: Callable[[], None] | None = None) -> bytearray:
    """One OTLP JSON line (with its newline) holding `spans`, grouped by resource and scope.

    Spans are encoded one at a time (`_Pieces`); `each` is called after each one (the
    exporter thread gives way there, `kvaudit.emit.give_way`).
    """
    grouped: dict[Any, dict[Any, list[ReadableSpan]]] = defaultdict(lambda: defaultdict(list))
    for span in spans:
        grouped[span.resource][span.instrumentation_scope].append(span)
    pieces = _Pieces(each)
    data = s.TracesData(
        [
            s.ResourceSpans(
                resource=s.Resource(_attributes(resource.attributes)),
                scopeSpans=[
                    s.ScopeSpans(
                        scope=s.Scope(scope.name, scope.version or "") if scope is not None else None,
                        spans=[pieces.encode(_span(span)) for span in scope_spans],
                        schemaUrl=(scope.schema_url or "") if scope is not None else "",
                    )
                    for scope, scope_spans in by_scope.items()
                ],
                schemaUrl=resource.schema_url or "",
            )
            for resource, by_scope in grouped.items()
        ]
    )
    return pieces.line(data)


class _Pieces:
    """A line's spans, each encoded as soon as it is built, then framed in one buffer.

    Only one span's objects are alive at a time, and the line is written into a buffer
    sized for it, with no growing by doubling: framing a line is one copy of its spans.
    """

    def __init__(self, each: Callable[[], None] | None = None) -> None:
        self._each = each
        self._size = 0

    def encode(self, span: s.Span) -> msgspec.Raw:
        raw = msgspec.Raw(s.ENCODER.encode(span))
        self._size += len(raw)
        if self._each is not None:
            self._each()
        return raw

    def line(self, data: s.TracesData) -> bytearray:
        line = bytearray(self._size + 4096)  # the spans and what frames them
        s.ENCODER.encode_into(data, line)
        line += b"\n"
        return line


def _span(span: ReadableSpan) -> s.Span:
    context = span.context
    parent = span.parent
    status = span.status
    return s.Span(
        traceId=f"{context.trace_id:032x}",
        spanId=f"{context.span_id:016x}",
        parentSpanId=f"{parent.span_id:016x}" if parent is not None else "",
        flags=flags(parent),
        name=span.name,
        kind=KIND[span.kind],
        startTimeUnixNano=str(span.start_time or 0),
        endTimeUnixNano=str(span.end_time or 0),
        attributes=_attributes(span.attributes),
        droppedAttributesCount=span.dropped_attributes,
        events=[
            s.Event(
                str(event.timestamp),
                event.name,
                _attributes(event.attributes),
                event.dropped_attributes,
            )
            for event in span.events
        ],
        droppedEventsCount=span.dropped_events,
        links=[
            s.Link(
                f"{link.context.trace_id:032x}",
                f"{link.context.span_id:016x}",
                attributes=_attributes(link.attributes),
                flags=flags(link.context),
            )
            for link in span.links
        ],
        droppedLinksCount=span.dropped_links,
        status=s.Status(status.description or "", STATUS_CODE[status.status_code]),
    )


def _key_value(key: str, value: Any) -> s.KeyValue:
    return s.KeyValue(key, _value(value))


_KEY_VALUES: EncodedOnce[s.KeyValue] = EncodedOnce(_key_value)
_attributes = _KEY_VALUES.all


def _value(value: Any) -> s.AnyValue:
    kind = type(value)
    if kind is str:
        return s.AnyValue(stringValue=value)
    if kind is bool:
        return s.AnyValue(boolValue=value)
    if kind is int:
        return s.AnyValue(intValue=str(s.int64(value)))
    if kind is float:
        return s.AnyValue(doubleValue=_double(value))
    if isinstance(value, str):  # str subclasses such as StrEnum members
        return s.AnyValue(stringValue=str(value))
    if isinstance(value, int):
        return _value(bool(value) if isinstance(value, bool) else int(value))
    if isinstance(value, float):
        return s.AnyValue(doubleValue=_double(float(value)))
    if isinstance(value, bytes):
        return s.AnyValue(bytesValue=base64.b64encode(value).decode())
    if isinstance(value, Mapping):
        return s.AnyValue(kvlistValue=s.KeyValueList(_attributes(value)))
    return s.AnyValue(arrayValue=s.ArrayValue([_value(item) for item in value]))


def _double(value: float) -> float | str:
    """A double as OTLP JSON writes it: NaN and the infinities as the strings protobuf's JSON
    mapping gives them (a JSON number cannot hold them; msgspec would write null)."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


# --- from protobuf (what the OTLP/HTTP receiver gets) -------------------------------


def proto_to_line(message: trace_pb2.TracesData) -> bytes:
    """One OTLP JSON line for a `TracesData` or `ExportTraceServiceRequest` message."""
    return bytes(resource_spans_to_line(message.resource_spans))


def resource_spans_to_line(resource_spans: Iterable[trace_pb2.ResourceSpans]) -> bytearray:
    """One OTLP JSON line holding these `ResourceSpans` (a receiver's group of one replica).

    Spans are encoded one at a time into a buffer sized for the line (`_Pieces`): the
    receiver's peak memory per request stays near what its memory budget assumes
    (bench/bench_receive.py).
    """
    pieces = _Pieces()
    data = s.TracesData(
        [
            s.ResourceSpans(
                resource=s.Resource(_pb_attributes(rs.resource.attributes), rs.resource.dropped_attributes_count),
                scopeSpans=[
                    s.ScopeSpans(
                        scope=s.Scope(ss.scope.name, ss.scope.version, _pb_attributes(ss.scope.attributes)),
                        spans=[pieces.encode(_pb_span(pb_span)) for pb_span in ss.spans],
                        schemaUrl=ss.schema_url,
                    )
                    for ss in rs.scope_spans
                ],
                schemaUrl=rs.schema_url,
            )
            for rs in resource_spans
        ]
    )
    return pieces.line(data)


def _pb_span(span: trace_pb2.Span) -> s.Span:
    return s.Span(
        traceId=span.trace_id.hex(),
        spanId=span.span_id.hex(),
        traceState=span.trace_state,
        parentSpanId=span.parent_span_id.hex(),
        flags=span.flags,
        name=span.name,
        kind=span.kind,
        startTimeUnixNano=str(span.start_time_unix_nano),
        endTimeUnixNano=str(span.end_time_unix_nano),
        attributes=_pb_attributes(span.attributes),
        droppedAttributesCount=span.dropped_attributes_count,
        events=[
            s.Event(
                str(event.time_unix_nano),
                event.name,
                _pb_attributes(event.attributes),
                event.dropped_attributes_count,
            )
            for event in span.events
        ],
        droppedEventsCount=span.dropped_events_count,
        links=[
            s.Link(
                link.trace_id.hex(),
                link.span_id.hex(),
                link.trace_state,
                _pb_attributes(link.attributes),
                link.dropped_attributes_count,
                link.flags,
            )
            for link in span.links
        ],
        droppedLinksCount=span.dropped_links_count,
        status=s.Status(span.status.message, span.status.code) if span.HasField("status") else None,
    )


def _pb_attributes(attributes: Iterable[common_pb2.KeyValue]) -> list[s.KeyValue]:
    return [s.KeyValue(kv.key, _pb_value(kv.value)) for kv in attributes]


def _pb_value(value: common_pb2.AnyValue) -> s.AnyValue:
    which = value.WhichOneof("value")
    if which == "string_value":
        return s.AnyValue(stringValue=value.string_value)
    if which == "bool_value":
        return s.AnyValue(boolValue=value.bool_value)
    if which == "int_value":
        return s.AnyValue(intValue=str(value.int_value))
    if which == "double_value":
        return s.AnyValue(doubleValue=_double(value.double_value))
    if which == "array_value":
        return s.AnyValue(arrayValue=s.ArrayValue([_pb_value(item) for item in value.array_value.values]))
    if which == "kvlist_value":
        return s.AnyValue(kvlistValue=s.KeyValueList(_pb_attributes(value.kvlist_value.values)))
    if which == "bytes_value":
        return s.AnyValue(bytesValue=base64.b64encode(value.bytes_value).decode())
    return s.AnyValue()


# --- to protobuf (validation) -------------------------------------------------------


def line_to_traces_data(line: bytes | str) -> trace_pb2.TracesData:
    """Parse one OTLP JSON line into the official `TracesData`, reading ids as hex.

    Also accepts base64 ids (protobuf's canonical JSON mapping). Raises ValueError
    when the line is not a valid `TracesData`.
    """
    try:
        data = json.loads(line)
        for resource_spans in data.get("resourceSpans", ()):
            for scope_spans in resource_spans.get("scopeSpans", ()):
                for span in scope_spans.get("spans", ()):
                    _ids_to_base64(span)
                    for link in span.get("links", ()):
                        _ids_to_base64(link)
        return json_format.ParseDict(data, trace_pb2.TracesData())
    except (json_format.ParseError, ValueError, TypeError, AttributeError, binascii.Error) as exc:
        raise ValueError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc


def _ids_to_base64(obj: dict[str, Any]) -> None:
    for field in ("traceId", "spanId", "parentSpanId"):
        value = obj.get(field)
        if value and len(value) in (16, 32):
            # Hex lengths; base64 of 8 or 16 bytes is 12 or 24 characters long.
            obj[field] = base64.b64encode(bytes.fromhex(value)).decode()
