"""The OTLP JSON trace schema as msgspec structs, for writing and for reading.

Field names are OTLP JSON's (lowerCamelCase). Writers put 64-bit integers as
strings and ids as hex; readers also accept numbers and base64 ids, because some
exporters write them. Structs are `gc=False` (they form no cycles): a trace file
holds millions of them and the garbage collector would otherwise rescan them all.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

# An attribute's integer is an int64 (`AnyValue.int_value`); a larger one cannot be sent.
_INT64 = range(-(1 << 63), 1 << 63)


def int64(value: int) -> int:
    """`value`, if an attribute can carry it.

    Raises:
        ValueError: it is out of an int64's range.
    """
    if value not in _INT64:
        raise ValueError(f"an integer of {value.bit_length()} bits is out of an int64's range")
    return value


# What a span's `events` decode as: the events themselves, or (for the reader's first
# pass, which leaves page events to kvaudit.read.page_scan) their raw JSON, skipped unparsed.
EventsT = TypeVar("EventsT")


class _Struct(msgspec.Struct, omit_defaults=True, gc=False):
    pass


class ArrayValue(_Struct):
    values: list[AnyValue] = []


class KeyValueList(_Struct):
    values: list[KeyValue] = []


class AnyValue(_Struct):
    stringValue: str | None = None
    boolValue: bool | None = None
    intValue: int | str | None = None
    doubleValue: float | str | None = None
    arrayValue: ArrayValue | None = None
    kvlistValue: KeyValueList | None = None
    bytesValue: str | None = None


class KeyValue(_Struct):
    key: str
    value: AnyValue = msgspec.field(default_factory=AnyValue)


class Resource(_Struct):
    attributes: list[KeyValue] = []
    droppedAttributesCount: int = 0


class Scope(_Struct):
    name: str = ""
    version: str = ""
    attributes: list[KeyValue] = []


class Event(_Struct):
    timeUnixNano: int | str = 0
    name: str = ""
    attributes: list[KeyValue] = []
    droppedAttributesCount: int = 0


class Link(_Struct):
    traceId: str = ""
    spanId: str = ""
    traceState: str = ""
    attributes: list[KeyValue] = []
    droppedAttributesCount: int = 0
    flags: int = 0


class Status(_Struct):
    message: str = ""
    code: int | str = 0


class Span(_Struct, Generic[EventsT]):
    traceId: str = ""
    spanId: str = ""
    traceState: str = ""
    parentSpanId: str = ""
    flags: int = 0
    name: str = ""
    kind: int | str = 0
    startTimeUnixNano: int | str = 0
    endTimeUnixNano: int | str = 0
    attributes: list[KeyValue] = []
    droppedAttributesCount: int = 0
    events: EventsT = []  # type: ignore[assignment]
    droppedEventsCount: int = 0
    links: list[Link] = []
    droppedLinksCount: int = 0
    status: Status | None = None


class ScopeSpans(_Struct, Generic[EventsT]):
    scope: Scope | None = None
    spans: list[Span[EventsT]] = []
    schemaUrl: str = ""


class ResourceSpans(_Struct, Generic[EventsT]):
    resource: Resource | None = None
    scopeSpans: list[ScopeSpans[EventsT]] = []
    schemaUrl: str = ""


class TracesData(_Struct, Generic[EventsT]):
    resourceSpans: list[ResourceSpans[EventsT]] = []


ENCODER = msgspec.json.Encoder()
DECODER = msgspec.json.Decoder(TracesData[list[Event]])
HEAD_DECODER = msgspec.json.Decoder(TracesData[msgspec.Raw])
