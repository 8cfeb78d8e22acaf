"""The OTLP JSON trace schema as msgspec structs, for writing and for reading.

Field names are OTLP JSON's (lowerCamelCase). Writers put 64-bit integers as
strings and ids as hex; readers also accept numbers and base64 ids, because some
exporters write them. Structs are `gc=False` (they form no cycles): a trace file
holds millions of them and the garbage collector would otherwise rescan them all.
"""

from __future__ import annotations

import msgspec


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


class Span(_Struct):
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
    events: list[Event] = []
    droppedEventsCount: int = 0
    links: list[Link] = []
    droppedLinksCount: int = 0
    status: Status | None = None


class ScopeSpans(_Struct):
    scope: Scope | None = None
    spans: list[Span] = []
    schemaUrl: str = ""


class ResourceSpans(_Struct):
    resource: Resource | None = None
    scopeSpans: list[ScopeSpans] = []
    schemaUrl: str = ""


class TracesData(_Struct):
    resourceSpans: list[ResourceSpans] = []


ENCODER = msgspec.json.Encoder()
DECODER = msgspec.json.Decoder(TracesData)
