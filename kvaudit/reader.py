"""Read OTLP JSON trace files into columns: spans, page descriptors, resources, errors.

Verbose JSON is the bottleneck of the analysis side (DESIGN.md section 5), so each
file is decoded once, split into byte ranges that threads decode in parallel (msgspec
for spans, the compiled page scanner for page events, without the GIL), and handed to
DuckDB as Arrow tables. Bad lines never stop a read: each becomes a `file:line: reason`
row in `read_errors`.
"""

from __future__ import annotations

import base64
import decimal
import functools
import gc
import hashlib
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvaudit import page_scan
from kvaudit.buffer_pool import BufferPool
from kvaudit.contract import EVENT_PAGE, SCHEMA_VERSION, PageAttr, Res, SpanAttr, TelemetryAttr
from kvaudit.otlp_schema import DECODER, HEAD_DECODER, AnyValue, ArrayValue, KeyValue, Span, TracesData
from kvaudit.page_scan import PageColumns, PageScanner

# Column kinds: how an OTLP AnyValue becomes a column value.
_STR, _INT, _BOOL, _INTS = "str", "int", "bool", "ints"
_ARROW_TYPE: Final = {_STR: pa.string(), _INT: pa.int64(), _BOOL: pa.bool_(), _INTS: pa.list_(pa.int64())}
_SCAN_KIND: Final = {_STR: page_scan.STR, _INT: page_scan.INT, _BOOL: page_scan.BOOL, _INTS: page_scan.INTS}

RESOURCE_COLUMNS: Final[dict[str, tuple[str, str]]] = {
    "replica": (Res.REPLICA, _STR),
    "service": (Res.SERVICE_NAME, _STR),
    "pid": (Res.PROCESS_PID, _INT),
    "schema": (Res.SCHEMA, _INT),
    "engine": (Res.ENGINE, _STR),
    "engine_version": (Res.ENGINE_VERSION, _STR),
    "model": (Res.KV_MODEL, _STR),
    "dtype": (Res.KV_DTYPE, _STR),
    "layout": (Res.KV_LAYOUT, _STR),
    "block_size": (Res.KV_BLOCK_SIZE, _INT),
    "world_size": (Res.KV_WORLD_SIZE, _INT),
    "rank": (Res.KV_RANK, _INT),
    "hash_algo": (Res.KV_HASH_ALGO, _STR),
    "layers": (Res.KV_LAYERS, _INT),
    "kv_heads": (Res.KV_KV_HEADS, _INT),
    "head_size": (Res.KV_HEAD_SIZE, _INT),
}
SPAN_ATTR_COLUMNS: Final[dict[str, tuple[str, str]]] = {
    "op": (SpanAttr.OP, _STR),
    "request_id": (SpanAttr.REQUEST_ID, _STR),
    "hook": (SpanAttr.HOOK, _STR),
    "backend": (SpanAttr.BACKEND, _STR),
    "tokens_requested": (SpanAttr.TOKENS_REQUESTED, _INT),
    "tokens_hit": (SpanAttr.TOKENS_HIT, _INT),
    "tokens_stored": (SpanAttr.TOKENS_STORED, _INT),
    "tokens_local": (SpanAttr.TOKENS_LOCAL, _INT),
    "pages": (SpanAttr.PAGES, _INT),
    "bytes": (SpanAttr.BYTES, _INT),
    "outcome": (SpanAttr.OUTCOME, _STR),
    "evict_reason": (SpanAttr.EVICT_REASON, _STR),
    "block_size": (SpanAttr.BLOCK_SIZE, _INT),
    "telemetry_dropped_spans": (TelemetryAttr.DROPPED_SPANS, _INT),
    "telemetry_failed_exports": (TelemetryAttr.FAILED_EXPORTS, _INT),
    "telemetry_errors": (TelemetryAttr.ERRORS, _INT),
    "telemetry_lost_batches": (TelemetryAttr.LOST_BATCHES, _INT),
}
PAGE_ATTR_COLUMNS: Final[dict[str, tuple[str, str]]] = {
    "key": (PageAttr.KEY, _STR),
    "hash_algo": (PageAttr.HASH_ALGO, _STR),
    "token_start": (PageAttr.TOKEN_START, _INT),
    "token_end": (PageAttr.TOKEN_END, _INT),
    "model": (PageAttr.MODEL, _STR),
    "dtype": (PageAttr.DTYPE, _STR),
    "shape": (PageAttr.SHAPE, _INTS),
    "layout": (PageAttr.LAYOUT, _STR),
    "bytes": (PageAttr.BYTES, _INT),
    "world_size": (PageAttr.WORLD_SIZE, _INT),
    "rank": (PageAttr.RANK, _INT),
    "layers": (PageAttr.LAYERS, _INT),
    "kv_heads": (PageAttr.KV_HEADS, _INT),
    "head_size": (PageAttr.HEAD_SIZE, _INT),
    "used": (PageAttr.USED, _BOOL),
    "checksum": (PageAttr.CHECKSUM, _STR),
    "transfer": (PageAttr.TRANSFER, _STR),
    "address": (PageAttr.ADDRESS, _INT),
    "tier": (PageAttr.TIER, _STR),
}

RESOURCES_SCHEMA: Final = pa.schema(
    [("resource_id", pa.int64())] + [(name, _ARROW_TYPE[kind]) for name, (_, kind) in RESOURCE_COLUMNS.items()]
)
_SPAN_HEAD: Final = [
    ("file", pa.string()),
    ("line", pa.int64()),
    ("resource_id", pa.int64()),
    ("replica", pa.string()),
    ("trace_id", pa.string()),
    ("span_id", pa.string()),
    ("parent_span_id", pa.string()),
    ("name", pa.string()),
    ("start_ns", pa.int64()),
    ("end_ns", pa.int64()),
    ("status_code", pa.int64()),
    ("dropped_attributes", pa.int64()),
    ("dropped_events", pa.int64()),
]
SPANS_SCHEMA: Final = pa.schema(
    _SPAN_HEAD
    + [(name, _ARROW_TYPE[kind]) for name, (_, kind) in SPAN_ATTR_COLUMNS.items()]
    + [("attributes", pa.map_(pa.string(), pa.string()))]
)
_PAGE_HEAD: Final = [
    ("file", pa.string()),
    ("line", pa.int64()),
    ("resource_id", pa.int64()),
    ("replica", pa.string()),
    ("trace_id", pa.string()),
    ("span_id", pa.string()),
    # The operation's own attributes, repeated on its pages so queries need no join.
    ("op", pa.string()),
    ("hook", pa.string()),
    ("backend", pa.string()),
    ("request_id", pa.string()),
    ("outcome", pa.string()),
    ("time_ns", pa.int64()),
]
PAGES_SCHEMA: Final = pa.schema(
    _PAGE_HEAD + [(name, _ARROW_TYPE[kind]) for name, (_, kind) in PAGE_ATTR_COLUMNS.items()]
)
ERRORS_SCHEMA: Final = pa.schema([("file", pa.string()), ("line", pa.int64()), ("reason", pa.string())])


CHUNK_BYTES: Final = 16 * 1024 * 1024
# A range is a chunk and the rest of the line it ends in. Idle, these buffers hold at
# most 2 * CHUNK_BYTES per CPU.
_BUFFER_BYTES: Final = 2 * CHUNK_BYTES  # larger buffers, for a range with a huge line, are not kept
_BUFFERS: Final = BufferPool(keep=os.cpu_count() or 1, max_bytes=_BUFFER_BYTES)
# The page scanner's machine code takes ~0.5 s to load from numba's disk cache (and ~40 s
# to compile on a fresh install); msgspec's full decode reads this much faster than that.
SCAN_MIN_BYTES: Final = 4 * 1024 * 1024


@dataclass
class Tables:
    """What a read produced, as Arrow tables with the schemas above."""

    resources: pa.Table
    spans: pa.Table
    pages: pa.Table
    errors: pa.Table

    @classmethod
    def concat(cls, parts: Sequence[Tables]) -> Tables:
        def cat(name: str, schema: pa.Schema) -> pa.Table:
            tables = [getattr(part, name) for part in parts]
            return pa.concat_tables(tables) if tables else schema.empty_table()

        return cls(
            cat("resources", RESOURCES_SCHEMA),
            cat("spans", SPANS_SCHEMA),
            cat("pages", PAGES_SCHEMA),
            cat("errors", ERRORS_SCHEMA),
        )


@dataclass
class _Columns:
    """What one byte range of one file shares across its lines: errors, and resource rows
    (a cache: a resource is in the range's table only if a line that uses it is read)."""

    file: str
    resources: dict[int, list[Any]] = field(default_factory=dict)
    errors: list[tuple[str, int, str]] = field(default_factory=list)


def _table(schema: pa.Schema, rows: Sequence[Sequence[Any]]) -> pa.Table:
    if not rows:
        return schema.empty_table()
    columns = zip(*rows)
    return pa.Table.from_arrays([_array(column, f.type) for column, f in zip(columns, schema)], schema=schema)


def _array(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    """An Arrow array from decoded values: OTLP int64s arrive as strings (or numbers)."""
    if pa.types.is_list(type_):
        return _list_array(values, type_)
    sample = next((v for v in values if v is not None), None)
    if isinstance(sample, str) and type_ != pa.string():
        try:
            return pa.array(values, type=pa.string()).cast(type_)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass  # mixed strings and numbers: convert one by one below
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([_as_text(v) for v in values], type=pa.string()).cast(type_)


def _list_array(values: Sequence[ArrayValue | None], type_: pa.DataType) -> pa.Array:
    """A list column from OTLP array values, built from flat items and offsets (no list per row)."""
    flat = [item.intValue for value in values if value is not None for item in value.values]
    lengths = [0 if value is None else len(value.values) for value in values]
    offsets = pa.array([0, *itertools.accumulate(lengths)], type=pa.int32())
    items = _array(flat, type_.value_type)
    mask = pa.array([value is None for value in values])
    return pa.ListArray.from_arrays(offsets, items, type=type_, mask=mask)


def _as_text(value: Any) -> Any:
    if isinstance(value, list):
        return [None if v is None else str(v) for v in value]
    return None if value is None else str(value)


# --- decoding -----------------------------------------------------------------------

# Which AnyValue field holds each kind; integers stay as decoded (str or int) and are
# cast to int64 by Arrow, column by column, which is far cheaper than int() per value.
_FIELD_OF_KIND: Final = {_STR: "stringValue", _INT: "intValue", _BOOL: "boolValue", _INTS: "arrayValue"}


def _slots(columns: dict[str, tuple[str, str]]) -> dict[str, tuple[int, str]]:
    return {attr: (i, _FIELD_OF_KIND[kind]) for i, (attr, kind) in enumerate(columns.values())}


def _fill(
    attributes: list[KeyValue],
    slots: dict[str, tuple[int, str]],
    width: int,
    extra: dict[str, str] | None = None,
) -> list[Any]:
    row: list[Any] = [None] * width
    for kv in attributes:
        slot = slots.get(kv.key)
        if slot is not None:
            row[slot[0]] = getattr(kv.value, slot[1])
        elif extra is not None:
            extra[kv.key] = attribute_text(kv.value)
    return row


def attribute_text(value: AnyValue) -> str:
    """An attribute value as text, the way the OpenTelemetry Collector renders it (pdata's
    `AsString`, which its ClickHouse exporter stores): integers in decimal, booleans as
    `true`/`false`, arrays and maps as JSON, so both backends see the same text."""
    if value.stringValue is not None:
        return value.stringValue
    if value.boolValue is not None:
        return "true" if value.boolValue else "false"
    if value.intValue is not None:
        return str(int(value.intValue))
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
        return int(value.intValue)
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
    text = "\n".join(sorted(f"{kv.key}={attribute_text(kv.value)}" for kv in attributes))
    return int.from_bytes(hashlib.md5(text.encode()).digest()[:8], "little", signed=True)


_SPAN_SLOTS: Final = _slots(SPAN_ATTR_COLUMNS)
_PAGE_SLOTS: Final = _slots(PAGE_ATTR_COLUMNS)
_RESOURCE_SLOTS: Final = _slots(RESOURCE_COLUMNS)
# Where each page column that comes from its span lies in a span row.
_PAGE_COLUMNS_FROM_SPAN: Final = [SPANS_SCHEMA.get_field_index(name) for name, _ in _PAGE_HEAD[:-1]]
_N_PAGE: Final = len(PAGE_ATTR_COLUMNS)
_SCHEMA_SLOT: Final = list(RESOURCE_COLUMNS).index("schema")
_REPLICA_SLOT: Final = list(RESOURCE_COLUMNS).index("replica")


class UnreadableLineError(ValueError):
    """A line that is not OTLP JSON trace data kvaudit can read."""


@dataclass
class _Line:
    """One decoded line: its span rows, and its page rows when msgspec decoded its events
    too; otherwise `scanned` is its number among the lines the page scanner read."""

    number: int
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


def _spans(columns: _Columns, line: _Line, data: TracesData) -> Iterator[tuple[list[Any], Span]]:
    """Each span of a decoded line as its row of the `spans` table, in document order;
    the line's resources go to `line.resources`."""
    n_resource = len(RESOURCE_COLUMNS)
    n_span = len(SPAN_ATTR_COLUMNS)
    file = columns.file
    for resource_spans in data.resourceSpans:
        res_attrs = resource_spans.resource.attributes if resource_spans.resource else []
        rid = _resource_id(res_attrs)
        resource = columns.resources.get(rid)
        if resource is None:
            resource = _fill(res_attrs, _RESOURCE_SLOTS, n_resource)
            schema = resource[_SCHEMA_SLOT]
            if schema is not None and str(schema) != str(SCHEMA_VERSION):
                raise UnreadableLineError(
                    f"unknown kvaudit schema version {schema} (this kvaudit reads {SCHEMA_VERSION})"
                )
            columns.resources[rid] = resource
        line.resources[rid] = resource
        replica = resource[_REPLICA_SLOT]
        for scope_spans in resource_spans.scopeSpans:
            for span in scope_spans.spans:
                extra: dict[str, str] = {}
                attrs = _fill(span.attributes, _SPAN_SLOTS, n_span, extra)
                row = [
                    file,
                    line.number,
                    rid,
                    replica,
                    hex_id(span.traceId, 16),
                    hex_id(span.spanId, 8),
                    hex_id(span.parentSpanId, 8) or None,
                    span.name,
                    int(span.startTimeUnixNano),
                    int(span.endTimeUnixNano),
                    int(span.status.code) if span.status is not None else 0,
                    span.droppedAttributesCount,
                    span.droppedEventsCount,
                    *attrs,
                    list(extra.items()) if extra else None,
                ]
                yield row, span


def _read_line(
    columns: _Columns, line: _Line, raw: bytes | memoryview, decoder: msgspec.json.Decoder, cut: bool
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
                head = [span_row[i] for i in _PAGE_COLUMNS_FROM_SPAN]
                for event in span.events:
                    if event.name == EVENT_PAGE:
                        pages.append([*head, event.timeUnixNano, *_fill(event.attributes, _PAGE_SLOTS, _N_PAGE)])
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


def read_range(path: str, start: int, end: int, final: bool, scan: bool = True) -> tuple[Tables, int, int]:
    """Decode the lines in bytes [start, end) of `path`, numbering them from 1.

    `start` must be a line start. The range ends at its last newline, unless `final`
    is set and `end` is the end of the file: then an unterminated last line is read
    too (and reported as truncated if it does not decode).

    With `scan`, msgspec decodes spans with their events left as raw JSON, the page
    scanner (kvaudit.page_scan) reads page events into columns, and lines it gives up
    on get msgspec's full decode; without it, every line gets the full decode.

    Returns:
        The tables, the offset just past the last line consumed, the lines consumed.
    """
    with _BUFFERS.buffer(end - start + page_scan.PAD) as data:
        size = _read_into(data, path, start, end - start)
        stop = data.rfind(b"\n", 0, size) + 1
        bounds = list(_line_bounds(data, stop))
        truncated = final and stop < size
        if truncated:
            bounds.append((stop, size))
        tables = _read_lines(path, data, bounds, size if truncated else 0, scan)
        return tables, start + (size if truncated else stop), len(bounds)


def _read_lines(path: str, data: bytearray, bounds: list[tuple[int, int]], cut_at: int, scan: bool) -> Tables:
    """The tables of the lines data[first:last] for each (first, last) of `bounds`, numbered
    from 1; a line ending at `cut_at` (not 0) is the unterminated end of the file.

    With `scan`, the page scanner reads every line first. msgspec then decodes the
    spans and resources of each line it read, without the events arrays it read
    strictly; a line it gave up on, or that decodes otherwise (an error, another span
    count), gets msgspec's full decode, which also words its error.
    """
    columns = _Columns(path)
    view = memoryview(data)
    candidates = [(n, first, last) for n, (first, last) in enumerate(bounds, start=1) if not _blank(view[first:last])]
    scanned = None
    if scan:
        buf = np.frombuffer(data, dtype=np.uint8)
        scanned = page_scanner().scan(buf, [first for _, first, _ in candidates], [last for _, _, last in candidates])
    lines: list[_Line] = []
    for k, (number, first, last) in enumerate(candidates):
        line = _Line(number)
        cut = last == cut_at
        if scanned is not None and scanned.spans[k] >= 0:
            head = scanned.head(k, view, first, last)
            if _read_line(columns, line, head, HEAD_DECODER, cut) is None and len(line.spans) == scanned.spans[k]:
                line.scanned = k
                lines.append(line)
                continue
        reason = _read_line(columns, line, view[first:last], DECODER, cut)
        if reason is None:
            lines.append(line)
        else:
            columns.errors.append((path, number, reason))
    return _tables(columns, lines, scanned)


def _tables(columns: _Columns, lines: list[_Line], scanned: PageColumns | None) -> Tables:
    """The range's tables: scanned page rows get their span's columns by (line, span)."""
    spans = _table(SPANS_SCHEMA, [row for line in lines for row in line.spans])
    pages = _table(PAGES_SCHEMA, [row for line in lines if line.pages is not None for row in line.pages])
    if scanned is not None:
        # Per scanned line, where its span rows start (-1: its scanned rows are not used).
        first_span = np.full(len(scanned.spans), -1, dtype=np.int64)
        offset = 0
        for line in lines:
            if line.scanned is not None:
                first_span[line.scanned] = offset
            offset += len(line.spans)
        rows = first_span[scanned.line] + scanned.span
        time_ns, attributes = pa.array(scanned.time_ns), scanned.columns
        used = first_span[scanned.line] >= 0
        if not used.all():
            rows, time_ns = rows[used], time_ns.filter(pa.array(used))
            attributes = [column.filter(pa.array(used)) for column in attributes]
        heads = spans.select(_PAGE_COLUMNS_FROM_SPAN).take(rows)
        fast = pa.Table.from_arrays([*heads.columns, time_ns, *attributes], schema=PAGES_SCHEMA)
        if pages.num_rows:
            # Keep file order: rows of lines the scanner gave up on belong between its own.
            fast = pa.concat_tables([fast, pages])
            fast = fast.take(pc.sort_indices(fast, [("line", "ascending")]))
        pages = fast
    return Tables(
        _table(RESOURCES_SCHEMA, [[rid, *row] for rid, row in _line_resources(lines).items()]),
        spans,
        pages,
        _table(ERRORS_SCHEMA, columns.errors),
    )


def _line_resources(lines: list[_Line]) -> dict[int, list[Any]]:
    resources: dict[int, list[Any]] = {}
    for line in lines:
        resources.update(line.resources)
    return resources


def _read_into(data: bytearray, path: str, start: int, size: int) -> int:
    """Read bytes [start, start + size) of `path` into `data` and zero the PAD bytes after
    them, as the page scanner wants; returns the bytes read (fewer if the file is shorter now)."""
    got = 0
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        while got < size and (n := f.readinto(memoryview(data)[got:size])):
            got += n
    data[got : got + page_scan.PAD] = bytes(page_scan.PAD)
    return got


def _line_bounds(data: bytearray, stop: int) -> Iterator[tuple[int, int]]:
    pos = 0
    while pos < stop:
        nl = data.index(b"\n", pos)
        yield pos, nl
        pos = nl + 1


def _blank(line: memoryview) -> bool:
    # Lines start with `{`; only one that starts with white space needs a closer look.
    return not line or (line[0] in b" \t\r\x0b\x0c" and not bytes(line).strip())


@functools.cache
def page_scanner() -> PageScanner:
    """The page event scanner for the `pages` columns (compiled on first use, then cached on disk)."""
    columns = [(attr, _SCAN_KIND[kind]) for attr, kind in PAGE_ATTR_COLUMNS.values()]
    return PageScanner(columns, scratch_bytes=_BUFFER_BYTES)


# --- planning reads over files ------------------------------------------------------


@dataclass
class Cursor:
    """How far a file has been read: byte offset and the number of the next line."""

    offset: int = 0
    next_line: int = 1
    identity: tuple[int, int] | None = None  # (device, inode): a replaced file starts over


def expand_paths(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Files named by paths, directories (their `*.json*` files, recursively) and globs.

    Raises:
        FileNotFoundError: a path matches nothing.
    """
    files: list[str] = []
    for spec in paths:
        path = Path(spec)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.json*") if p.is_file())
        elif any(ch in str(spec) for ch in "*?["):
            anchor = Path(path.anchor or ".")
            pattern = str(path.relative_to(anchor)) if path.is_absolute() else str(spec)
            found = sorted(p for p in anchor.glob(pattern) if p.is_file())
        elif path.is_file():
            found = [path]
        else:
            raise FileNotFoundError(f"{spec}: no such file or directory")
        files.extend(str(p) for p in found)
    return list(dict.fromkeys(files))


def read_files(
    files: Sequence[str],
    cursors: dict[str, Cursor] | None = None,
    *,
    final: bool = True,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    sink: Callable[[Tables], None] | None = None,
) -> Tables:
    """Read what is new in `files` since `cursors` (updated in place).

    Args:
        files: trace files.
        cursors: per-file read positions; None reads every file from the start.
        final: read an unterminated last line too (a one-shot read); when False it
            is left for the next call, because its writer may be mid-write.
        workers: threads to decode with (default: one per CPU). The page scanner and
            file reads run without the GIL, and they are most of a read.
        progress: called with the number of bytes of each range decoded.
        sink: called with each range's tables, in file order, as soon as they are read
            (while the next ranges are still decoding).

    Returns:
        All the tables read.
    """
    cursors = {} if cursors is None else cursors
    tasks = list(_plan(files, cursors))
    size = sum(end - start for _, start, end in tasks)
    workers = min(workers or os.cpu_count() or 1, len(tasks))
    scan = size >= SCAN_MIN_BYTES
    if scan:
        page_scanner().compile()  # once, before the threads want it
    parts: list[Tables] = []
    with _collection_paused(), ThreadPoolExecutor(max(workers, 1)) as pool:
        results = pool.map(read_range, *zip(*tasks), [final] * len(tasks), [scan] * len(tasks))
        for (path, start, end), (tables, stop, lines) in zip(tasks, results):
            cursor = cursors[path]
            part = _renumber(tables, cursor.next_line - 1)
            if sink:
                sink(part)
            cursor.offset = stop
            cursor.next_line += lines
            parts.append(part)
            if progress:
                progress(end - start)
    return Tables.concat(parts)


@contextmanager
def _collection_paused() -> Iterator[None]:
    """No cyclic garbage collection meanwhile: decoding allocates many acyclic objects, and
    collection passes would only rescan them."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _renumber(tables: Tables, base: int) -> Tables:
    """Shift line numbers of a range by the lines of the file before it."""
    if not base:
        return tables

    def shift(table: pa.Table) -> pa.Table:
        index = table.schema.get_field_index("line")
        return table.set_column(index, "line", pc.add(table.column(index), base))

    return Tables(tables.resources, shift(tables.spans), shift(tables.pages), shift(tables.errors))


def _plan(files: Sequence[str], cursors: dict[str, Cursor]) -> Iterator[tuple[str, int, int]]:
    """Byte ranges to decode, each ending at a line end, in file order."""
    for path in files:
        stat = os.stat(path)
        cursor = cursors.setdefault(path, Cursor())
        identity = (stat.st_dev, stat.st_ino)
        if cursor.identity != identity or stat.st_size < cursor.offset:
            cursor.offset, cursor.next_line, cursor.identity = 0, 1, identity
        start = cursor.offset
        with open(path, "rb") as f:
            while start < stat.st_size:
                end = min(start + CHUNK_BYTES, stat.st_size)
                if end < stat.st_size:
                    f.seek(end)
                    end += len(f.readline())
                yield path, start, end
                start = end
