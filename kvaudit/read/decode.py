"""msgspec's decode of OTLP JSON lines into rows of the `kv_*` tables (see `columns`).

The page scanner (`page_scan`) reads most page events faster; every line gets this
decode for its spans and resources, and a line the scanner gives up on gets it whole,
which also words its error.
"""

from __future__ import annotations

import base64
import decimal
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from kvaudit.contract import EVENT_PAGE, PAGE_COLUMNS, RESOURCE_COLUMNS, SPAN_COLUMNS, Kind
from kvaudit.errors import InputError
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
from kvaudit.otlp.schema import DECODER, AnyValue, KeyValue, Span, TracesData
from kvaudit.read.columns import INTEGER_PATTERN, PAGE_HEAD, PAGES_SCHEMA, SPANS_SCHEMA


@dataclass
class RangeRows:
    """What the lines decoded together share: errors (each with the line's place among
    them, to keep their order), and resource rows (a cache: a resource is in the table
    only if a line that uses it is read)."""

    resources: dict[int, list[Any]] = field(default_factory=dict)
    errors: list[tuple[int, str, int, str]] = field(default_factory=list)  # (place, file, line, reason)


# Which AnyValue field holds each kind; integers stay as decoded (str or int) and are
# cast to int64 by Arrow, column by column, which is far cheaper than int() per value
# (`columns.table_of`; a line with a value it cannot type is then found by `untypable`).
_FIELD_OF_KIND: Final = {
    Kind.STR: "stringValue",
    Kind.INT: "intValue",
    Kind.BOOL: "boolValue",
    Kind.INTS: "arrayValue",
    Kind.DOUBLE: "doubleValue",
}
_INTEGER: Final = re.compile(INTEGER_PATTERN)


def _slots(columns: dict[str, tuple[str, str]]) -> dict[str, tuple[int, str]]:
    return {attr: (i, _FIELD_OF_KIND[kind]) for i, (attr, kind) in enumerate(columns.values())}


def _fill(
    attributes: list[KeyValue],
    slots: dict[str, tuple[int, str]],
    width: int,
    what: str,
    extra: dict[str, str] | None = None,
) -> list[Any]:
    reason = too_many_attributes(len(attributes), what)
    if reason is not None:
        raise UnreadableLineError(reason)
    row: list[Any] = [None] * width
    for kv in attributes:
        value = kv.value
        if (value.arrayValue is not None or value.kvlistValue is not None) and not _nests_within(value, MAX_NESTING):
            raise UnreadableLineError(NESTED_TOO_DEEP)
        slot = slots.get(kv.key)
        if slot is not None:
            # A repeated key: the last one wins, as when the OpenTelemetry SDK sets an attribute again.
            row[slot[0]] = getattr(value, slot[1])
        elif extra is not None:
            extra[kv.key] = attribute_text(value, kv.key)
    return row


def _nests_within(value: AnyValue, depth: int) -> bool:
    """Whether the arrays and maps of `value` nest at most `depth` deep."""
    if value.arrayValue is not None:
        items = value.arrayValue.values
    elif value.kvlistValue is not None:
        items = [kv.value for kv in value.kvlistValue.values]
    else:
        return True
    return depth > 0 and all(_nests_within(item, depth - 1) for item in items)


def int64(value: int | str, name: str) -> int:
    """An OTLP int64 (a JSON number, or a string of decimal digits) as an int.

    Raises:
        UnreadableLineError: `value` is not an integer, or not one of 64 bits.
    """
    reason = bad_integer(value)
    if reason is not None:
        raise UnreadableLineError(f"bad value: {name} {reason}")
    return int(value)


def bad_integer(value: Any, time: bool = False) -> str | None:
    """Why `value`, decoded from an OTLP int64 field, is not one (None if it is; and None is)."""
    if value is None:
        return None
    if isinstance(value, str) and not _INTEGER.fullmatch(value):
        return f"{value[:40]!r} is not an integer"
    return out_of_range(int(value), time)


def attribute_text(value: AnyValue, key: str = "intValue") -> str:
    """An attribute value as text, the way the OpenTelemetry Collector renders it (pdata's
    `AsString`, which its ClickHouse exporter stores): integers in decimal, booleans as
    `true`/`false`, arrays and maps as JSON, so both backends see the same text.

    Raises:
        UnreadableLineError: an integer that is not an OTLP int64 (named as `key`).
    """
    if value.stringValue is not None:
        return value.stringValue
    if value.boolValue is not None:
        return "true" if value.boolValue else "false"
    if value.intValue is not None:
        return str(int64(value.intValue, key))
    if value.doubleValue is not None:
        return _double_text(float(value.doubleValue))
    if value.bytesValue is not None:
        return value.bytesValue
    if value.arrayValue is not None or value.kvlistValue is not None:
        return msgspec.json.encode(_raw(value)).decode()
    return ""


def _double_text(value: float) -> str:
    # Go's FormatFloat(v, 'f', -1, 64): shortest digits, never an exponent.
    if value != value or value in (float("inf"), float("-inf")):
        return {"inf": "+Inf", "-inf": "-Inf"}.get(str(value), "NaN")
    text = format(decimal.Decimal(repr(value)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _raw(value: AnyValue) -> Any:
    if value.arrayValue is not None:
        return [_raw(item) for item in value.arrayValue.values]
    if value.kvlistValue is not None:
        return {kv.key: _raw(kv.value) for kv in value.kvlistValue.values}
    if value.intValue is not None:
        return int64(value.intValue, "intValue")
    for item in (value.stringValue, value.boolValue, value.doubleValue, value.bytesValue):
        if item is not None:
            return item
    return None


def hex_id(value: str, size: int) -> str:
    """Ids as hex whether the writer used hex (OTLP JSON) or base64 (protobuf JSON)."""
    if len(value) == 2 * size or not value:
        return value.lower()
    return base64.b64decode(value).hex()


def _resource_id(attributes: list[KeyValue]) -> int:
    # Computed from the attributes' text so that ClickHouse, which keeps only that text
    # (kvaudit.backends.clickhouse_views), derives the same id for the same process.
    text = "\n".join(sorted(f"{kv.key}={attribute_text(kv.value, kv.key)}" for kv in attributes))
    return int.from_bytes(hashlib.md5(text.encode()).digest()[:8], "little", signed=True)


_SPAN_SLOTS: Final = _slots(SPAN_COLUMNS)
_PAGE_SLOTS: Final = _slots(PAGE_COLUMNS)
_RESOURCE_SLOTS: Final = _slots(RESOURCE_COLUMNS)
# Where each page column that comes from its span lies in a span row.
PAGE_COLUMNS_FROM_SPAN: Final = [SPANS_SCHEMA.get_field_index(name) for name, _ in PAGE_HEAD[:-1]]
_N_PAGE: Final = len(PAGE_COLUMNS)
_SCHEMA_SLOT: Final = list(RESOURCE_COLUMNS).index("schema")
_REPLICA_SLOT: Final = list(RESOURCE_COLUMNS).index("replica")
_RESOURCE_INTS: Final = [
    (slot, attr) for slot, (attr, kind) in enumerate(RESOURCE_COLUMNS.values()) if kind == Kind.INT
]


class UnreadableLineError(InputError):
    """A line that is not OTLP JSON trace data kvaudit can read."""


@dataclass
class DecodedLine:
    """One decoded line (or document) of `file`: its span rows, and its page rows when
    msgspec decoded its events too; otherwise `scanned` is its number among the lines
    the page scanner read. `place` orders it among the lines decoded together."""

    file: str
    number: int
    place: int
    spans: list[list[Any]] = field(default_factory=list)
    pages: list[list[Any]] | None = None
    resources: dict[int, list[Any]] = field(default_factory=dict)
    scanned: int | None = None


def _decode(decoder: msgspec.json.Decoder, raw: bytes | memoryview) -> TracesData:
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise UnreadableLineError(f"not OTLP trace data: {exc}") from None
    except msgspec.DecodeError as exc:
        raise UnreadableLineError(f"invalid JSON: {exc}") from None
    except RecursionError:  # deeper than msgspec goes, far deeper than MAX_NESTING
        raise UnreadableLineError(NESTED_TOO_DEEP) from None


def _spans(columns: RangeRows, line: DecodedLine, data: TracesData) -> Iterator[tuple[list[Any], Span]]:
    """Each span of a decoded line as its row of the `spans` table, in document order;
    the line's resources go to `line.resources`."""
    n_resource = len(RESOURCE_COLUMNS)
    n_span = len(SPAN_COLUMNS)
    file = line.file
    for resource_spans in data.resourceSpans:
        res_attrs = resource_spans.resource.attributes if resource_spans.resource else []
        rid = _resource_id(res_attrs)
        resource = columns.resources.get(rid)
        if resource is None:
            resource = _fill(res_attrs, _RESOURCE_SLOTS, n_resource, "resource")
            reason = bad_schema(resource[_SCHEMA_SLOT])
            if reason is not None:
                raise UnreadableLineError(reason)
            for slot, name in _RESOURCE_INTS:
                if resource[slot] is not None:
                    resource[slot] = int64(resource[slot], name)
            columns.resources[rid] = resource
        line.resources[rid] = resource
        replica = resource[_REPLICA_SLOT]
        for scope_spans in resource_spans.scopeSpans:
            for span in scope_spans.spans:
                extra: dict[str, str] = {}
                attrs = _fill(span.attributes, _SPAN_SLOTS, n_span, "span", extra)
                row = [
                    file,
                    line.number,
                    rid,
                    replica,
                    _id(span.traceId, TRACE_ID_BYTES, "traceId"),
                    _id(span.spanId, SPAN_ID_BYTES, "spanId"),
                    _id(span.parentSpanId, SPAN_ID_BYTES, "parentSpanId") or None,
                    span.name,
                    _time(span.startTimeUnixNano, "startTimeUnixNano"),
                    _time(span.endTimeUnixNano, "endTimeUnixNano"),
                    int64(span.status.code, "status.code") if span.status is not None else 0,
                    int64(span.droppedAttributesCount, "droppedAttributesCount"),
                    int64(span.droppedEventsCount, "droppedEventsCount"),
                    *attrs,
                    list(extra.items()) if extra else None,
                ]
                yield row, span


def _id(value: str, size: int, name: str) -> str:
    """A span's id as hex, if it is one of `size` bytes (or absent).

    Raises:
        UnreadableLineError: it is not.
    """
    try:
        text = hex_id(value, size)
    except ValueError:  # neither hex of this size nor base64 (binascii.Error)
        raise UnreadableLineError(f"bad value: {name} {value[:40]!r} is not an id") from None
    reason = bad_id(len(text) // 2, size, name)
    if reason is not None:
        raise UnreadableLineError(reason)
    return text


def _time(value: int | str, name: str) -> int:
    reason = bad_integer(value, time=True)
    if reason is not None:
        raise UnreadableLineError(f"bad value: {name} {reason}")
    return int(value)


def read_line(
    columns: RangeRows, line: DecodedLine, raw: bytes | memoryview, decoder: msgspec.json.Decoder, cut: bool
) -> str | None:
    """Decode a line into `line.spans`, and `line.pages` when `decoder` decodes events too.

    Returns:
        None, or why the line is unreadable (truncated when `cut`: it is the
        unterminated end of a file); then it leaves `line` empty.
    """
    line.spans, line.pages, line.resources = [], None, {}
    reason = None
    try:
        data = _decode(decoder, raw)
        spans: list[list[Any]] = []
        pages: list[list[Any]] = []
        for span_row, span in _spans(columns, line, data):
            spans.append(span_row)
            if decoder is DECODER:
                head = [span_row[i] for i in PAGE_COLUMNS_FROM_SPAN]
                for event in span.events:
                    if event.name == EVENT_PAGE:
                        pages.append(
                            [*head, event.timeUnixNano, *_fill(event.attributes, _PAGE_SLOTS, _N_PAGE, "event")]
                        )
    except UnreadableLineError as exc:
        reason = "truncated last line (writer stopped mid-line?)" if cut else str(exc)
    except (ValueError, TypeError, AttributeError) as exc:
        reason = f"bad value: {exc}"
    if reason is not None:
        line.resources = {}
        return reason
    line.spans = spans
    line.pages = pages if decoder is DECODER else None
    return None


# The integer columns msgspec's values reach Arrow in untyped (see `_FIELD_OF_KIND`):
# (index in the row, the field they come from, whether it is a time, whether a list).
_SPAN_INTS: Final = [
    (SPANS_SCHEMA.get_field_index(name), attr, False, False)
    for name, (attr, kind) in SPAN_COLUMNS.items()
    if kind == Kind.INT
]
_PAGE_INTS: Final = [(PAGES_SCHEMA.get_field_index("time_ns"), "timeUnixNano", True, False)] + [
    (PAGES_SCHEMA.get_field_index(name), attr, False, kind == Kind.INTS)
    for name, (attr, kind) in PAGE_COLUMNS.items()
    if kind in (Kind.INT, Kind.INTS)
]


def untypable(line: DecodedLine) -> str | None:
    """Why a decoded line has a value its column cannot hold (None if it has none)."""
    for rows, checks in ((line.spans, _SPAN_INTS), (line.pages or [], _PAGE_INTS)):
        for row in rows:
            for index, name, time, many in checks:
                value = row[index]
                values = [item.intValue for item in value.values] if many and value is not None else [value]
                for item in values:
                    reason = bad_integer(item, time)
                    if reason is not None:
                        return f"bad value: {name} {reason}"
    return None
