"""OTLP protobuf, as OTLP/HTTP carries it: an `ExportTraceServiceRequest`'s wire bytes.

Written field by field (protobuf's encoding: a tag, then a varint, a fixed-width number or
a length and bytes) rather than through `opentelemetry-proto`'s classes, which the official
encoder builds one per span, event and attribute, in Python, all in one call that holds
the GIL throughout. Here an attribute's bytes are made once for the values that
repeat (`EncodedOnce`), and spans one at a time, with a call after each (the exporter thread
gives way there, `kvaudit.emit.give_way`). Tests hold the bytes equal to the official
encoder's serialization of the same spans.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from kvaudit.otlp.encoded_once import EncodedOnce
from kvaudit.otlp.schema import int64
from kvaudit.otlp.span_fields import KIND, STATUS_CODE, flags

_KIND = {kind: bytes((0x30, value)) for kind, value in KIND.items()}  # Span.kind, field 6
_FIXED32 = struct.Struct("<I").pack
_FIXED64 = struct.Struct("<Q").pack
_DOUBLE = struct.Struct("<d").pack


def spans_to_request(spans: Sequence[ReadableSpan], each: Callable[[], None] | None = None) -> bytes:
    """An `ExportTraceServiceRequest` holding `spans`, grouped by resource and scope as the official encoder does.

    `each` is called after each span is encoded.
    """
    grouped: dict[Any, dict[Any, list[bytes]]] = defaultdict(lambda: defaultdict(list))
    for span in spans:
        grouped[span.resource][span.instrumentation_scope].append(_span(span))
        if each is not None:
            each()
    request = []
    for resource, by_scope in grouped.items():
        parts = [_field(0x0A, _attributes_field(0x0A, resource.attributes))]
        for scope, encoded in by_scope.items():
            scope_parts = [_field(0x0A, _scope(scope)), *(_field(0x12, span) for span in encoded)]
            if scope is not None and scope.schema_url:
                scope_parts.append(_string(0x1A, scope.schema_url))
            parts.append(_field(0x12, b"".join(scope_parts)))
        if resource.schema_url:
            parts.append(_string(0x1A, resource.schema_url))
        request.append(_field(0x0A, b"".join(parts)))
    return b"".join(request)


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b""
    return b"".join(
        (
            _string(0x0A, scope.name),
            _string(0x12, scope.version or ""),
            _attributes_field(0x1A, getattr(scope, "attributes", None)),
        )
    )


def _span(span: ReadableSpan) -> bytes:
    context = span.context
    parent = span.parent
    parts = [
        b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + context.span_id.to_bytes(8, "big"),
    ]
    if context.trace_state:
        parts.append(_string(0x1A, ",".join(f"{key}={value}" for key, value in context.trace_state.items())))
    if parent is not None:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    parts.append(_string(0x2A, span.name))
    parts.append(_KIND[span.kind])
    if span.start_time:
        parts.append(b"\x39" + _FIXED64(span.start_time))
    if span.end_time:
        parts.append(b"\x41" + _FIXED64(span.end_time))
    parts.append(_attributes_field(0x4A, span.attributes))
    if span.dropped_attributes:
        parts.append(b"\x50" + _varint(span.dropped_attributes))
    parts.extend(_field(0x5A, _event(event)) for event in span.events)
    if span.dropped_events:
        parts.append(b"\x60" + _varint(span.dropped_events))
    parts.extend(_field(0x6A, _link(link)) for link in span.links)
    if span.dropped_links:
        parts.append(b"\x70" + _varint(span.dropped_links))
    status = span.status
    code = STATUS_CODE[status.status_code]
    parts.append(
        _field(
            0x7A,
            (_string(0x12, status.description) if status.description else b"")
            + (b"\x18" + _varint(code) if code else b""),
        )
    )
    parts.append(b"\x85\x01" + _FIXED32(flags(parent)))  # Span.flags, field 16
    return b"".join(parts)


def _event(event: Any) -> bytes:
    body = b"\x09" + _FIXED64(event.timestamp) + _string(0x12, event.name) + _attributes_field(0x1A, event.attributes)
    if event.dropped_attributes:
        body += b"\x20" + _varint(event.dropped_attributes)
    return body


def _link(link: Any) -> bytes:
    context = link.context
    body = (
        b"\x0a\x10"
        + context.trace_id.to_bytes(16, "big")
        + b"\x12\x08"
        + context.span_id.to_bytes(8, "big")
        + _attributes_field(0x22, link.attributes)
    )
    if link.dropped_attributes:
        body += b"\x28" + _varint(link.dropped_attributes)
    return body + b"\x35" + _FIXED32(flags(context))  # Link.flags, field 6


def _attributes_field(tag: int, attributes: Mapping[str, Any] | None) -> bytes:
    """A repeated `KeyValue` field: each kept encoding is its length and body, the tag goes between."""
    encoded = _KEY_VALUES.all(attributes)
    if not encoded:
        return b""
    separator = _TAGS[tag]
    return separator + separator.join(encoded)


_TAGS = {tag: bytes((tag,)) for tag in (0x0A, 0x1A, 0x22, 0x4A)}


def _key_value(key: str, value: Any) -> bytes:
    """A `KeyValue`'s length and body (its tag is its container's)."""
    body = _string(0x0A, key) + _field(0x12, _any_value(value))
    return _varint(len(body)) + body


_KEY_VALUES: EncodedOnce[bytes] = EncodedOnce(_key_value)


def _any_value(value: Any) -> bytes:
    # In the official encoder's order: bool before int (a bool is an int), str before the sequences.
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(0x0A, value.encode())
    if isinstance(value, int):
        return b"\x18" + _varint(int64(value) & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _field(0x3A, value)
    if isinstance(value, Mapping):
        return _field(0x32, _attributes_field(0x0A, value))
    return _field(0x2A, b"".join(_field(0x0A, _any_value(item)) for item in value))


def _string(tag: int, text: str) -> bytes:
    """A string field, left out when empty as protobuf leaves out a default."""
    return _field(tag, text.encode()) if text else b""


def _field(tag: int, data: bytes) -> bytes:
    """A length-delimited field, written even when empty: a message the official encoder sets, a oneof's string."""
    size = len(data)
    if size < 0x80:
        return bytes((tag, size)) + data
    return bytes((tag,)) + _varint(size) + data


def _varint(number: int) -> bytes:
    if number < 0x80:
        return bytes((number,))
    out = bytearray()
    while number >= 0x80:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)
