"""The readers' limits (kvaudit.otlp.limits) applied to received protobuf, before the receiver answers.

A span the readers would refuse makes the whole line it is written in unreadable, so
the receiver takes it out of the request and rejects it by name (OTLP partial
success): what it acknowledges is what the readers read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

from kvaudit.contract import Res
from kvaudit.otlp.limits import (
    MAX_NESTING,
    NESTED_TOO_DEEP,
    SPAN_ID_BYTES,
    TRACE_ID_BYTES,
    bad_id,
    bad_schema,
    out_of_range,
    too_many_attributes,
)


def resource_problem(resource_spans: ResourceSpans) -> str | None:
    """Why no reader could read this resource (so none of its spans), or None."""
    attributes = resource_spans.resource.attributes
    reason = _attributes_problem(attributes, "resource")
    if reason is not None:
        return f"resource: {reason}"
    for kv in attributes:
        if kv.key == Res.SCHEMA and kv.value.WhichOneof("value") == "int_value":
            reason = bad_schema(kv.value.int_value)
            if reason is not None:
                return f"resource: {reason}"
    return None


def span_problem(span: Span) -> str | None:
    """Why no reader could read `span`, or None."""
    for value, size, name in (
        (span.trace_id, TRACE_ID_BYTES, "traceId"),
        (span.span_id, SPAN_ID_BYTES, "spanId"),
        (span.parent_span_id, SPAN_ID_BYTES, "parentSpanId"),
    ):
        reason = bad_id(len(value), size, name)
        if reason is not None:
            return reason
    times = ((span.start_time_unix_nano, "startTimeUnixNano"), (span.end_time_unix_nano, "endTimeUnixNano"))
    for number, name in times:
        reason = out_of_range(number, time=True)
        if reason is not None:
            return f"bad value: {name} {reason}"
    reason = _attributes_problem(span.attributes, "span")
    if reason is not None:
        return reason
    for event in span.events:
        reason = out_of_range(event.time_unix_nano, time=True)
        if reason is not None:
            return f"bad value: event timeUnixNano {reason}"
        reason = _attributes_problem(event.attributes, "event")
        if reason is not None:
            return reason
    return None


def describe(span: Span) -> str:
    """A span as a rejection names it: its name and id."""
    return f"span {span.name[:80]!r} ({span.span_id.hex() or 'no id'})"


def _attributes_problem(attributes: Sequence[KeyValue], what: str) -> str | None:
    reason = too_many_attributes(len(attributes), what)
    if reason is not None:
        return reason
    if not all(_nests_within(kv.value, MAX_NESTING) for kv in attributes):
        return NESTED_TOO_DEEP
    return None


def _nests_within(value: AnyValue, depth: int) -> bool:
    """Whether the arrays and maps of `value` nest at most `depth` deep (as the readers count)."""
    which = value.WhichOneof("value")
    if which == "array_value":
        items: Iterable[AnyValue] = value.array_value.values
    elif which == "kvlist_value":
        items = (kv.value for kv in value.kvlist_value.values)
    else:
        return True
    return depth > 0 and all(_nests_within(item, depth - 1) for item in items)
