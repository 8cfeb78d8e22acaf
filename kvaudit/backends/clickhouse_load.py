"""Loading OTLP JSON trace files into ClickHouse the way the Collector's exporter does.

`otel_traces_rows` maps each span to one row of the exporter's `otel_traces` table,
as its traces exporter (exporter/clickhouseexporter in opentelemetry-collector-contrib)
maps OTLP: ids as lower-case hex, every attribute value as pdata's `AsString` text,
span events into the nested `Events` columns, start time and duration in nanoseconds,
kind and status as their names. Tests use it to put the very traces the DuckDB tests
read into chdb; users can use it to move trace files into a ClickHouse that the
Collector already writes to.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final

import msgspec
import pyarrow as pa

from kvaudit.backends.clickhouse import ClickHouseBackend
from kvaudit.contract import Res
from kvaudit.otlp.schema import DECODER, KeyValue, Span
from kvaudit.read.decode import attribute_text, hex_id
from kvaudit.read.files import expand_paths

# The exporter's own table (internal/sql_templates/traces_table.sql, with its default
# engine and no TTL): the same columns, codecs, indexes, partitioning and order.
OTEL_TRACES_DDL: Final = """
CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
) ENGINE = MergeTree()
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp))
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1
"""

_STRING_MAP: Final = pa.map_(pa.string(), pa.string())
_TIME: Final = pa.timestamp("ns")
OTEL_TRACES_SCHEMA: Final = pa.schema(
    [
        ("Timestamp", _TIME),
        ("TraceId", pa.string()),
        ("SpanId", pa.string()),
        ("ParentSpanId", pa.string()),
        ("TraceState", pa.string()),
        ("SpanName", pa.string()),
        ("SpanKind", pa.string()),
        ("ServiceName", pa.string()),
        ("ResourceAttributes", _STRING_MAP),
        ("ScopeName", pa.string()),
        ("ScopeVersion", pa.string()),
        ("SpanAttributes", _STRING_MAP),
        ("Duration", pa.uint64()),
        ("StatusCode", pa.string()),
        ("StatusMessage", pa.string()),
        ("Events.Timestamp", pa.list_(_TIME)),
        ("Events.Name", pa.list_(pa.string())),
        ("Events.Attributes", pa.list_(_STRING_MAP)),
        ("Links.TraceId", pa.list_(pa.string())),
        ("Links.SpanId", pa.list_(pa.string())),
        ("Links.TraceState", pa.list_(pa.string())),
        ("Links.Attributes", pa.list_(_STRING_MAP)),
    ]
)
# OTLP enums by number, named as the exporter names them (traceutil.SpanKindStr, StatusCodeStr).
_KINDS: Final = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
_STATUSES: Final = ("Unset", "Ok", "Error")


def create_table(backend: ClickHouseBackend, table: str | None = None) -> None:
    """Create the exporter's traces table (if absent) in the backend's database."""
    backend.connection.command(OTEL_TRACES_DDL.format(table=table or backend.table))


def load_files(backend: ClickHouseBackend, paths: Sequence[str]) -> int:
    """Append the spans of OTLP JSON trace files to the backend's traces table.

    Returns:
        The number of spans loaded. Unreadable lines are skipped, as a Collector
        receiving them would reject them.

    Raises:
        FileNotFoundError: a path matches nothing.
        BackendError: the rows cannot be inserted.
    """
    table = otel_traces_rows(expand_paths(paths))
    if table.num_rows:
        backend.connection.insert(backend.table, table)
    return table.num_rows


def otel_traces_rows(files: Sequence[str]) -> pa.Table:
    """The `otel_traces` rows of every span in `files`."""
    rows = [row for path in files for row in _file_rows(path)]
    columns = list(zip(*rows)) if rows else [[] for _ in OTEL_TRACES_SCHEMA]
    return pa.Table.from_arrays(
        [pa.array(column, type=field.type) for column, field in zip(columns, OTEL_TRACES_SCHEMA)],
        schema=OTEL_TRACES_SCHEMA,
    )


def _file_rows(path: str) -> Iterator[tuple[Any, ...]]:
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                data = DECODER.decode(line)
            except msgspec.DecodeError:
                continue
            for resource_spans in data.resourceSpans:
                resource = _text_map(resource_spans.resource.attributes if resource_spans.resource else [])
                for scope_spans in resource_spans.scopeSpans:
                    scope = scope_spans.scope
                    for span in scope_spans.spans:
                        yield _row(span, resource, scope.name if scope else "", scope.version if scope else "")


def _row(span: Span, resource: list[tuple[str, str]], scope_name: str, scope_version: str) -> tuple[Any, ...]:
    start, end = int(span.startTimeUnixNano), int(span.endTimeUnixNano)
    status = span.status
    return (
        start,
        hex_id(span.traceId, 16),
        hex_id(span.spanId, 8),
        hex_id(span.parentSpanId, 8),
        span.traceState,
        span.name,
        _KINDS[int(span.kind)],
        dict(resource).get(Res.SERVICE_NAME, ""),
        resource,
        scope_name,
        scope_version,
        _text_map(span.attributes),
        end - start,
        _STATUSES[int(status.code)] if status is not None else _STATUSES[0],
        status.message if status is not None else "",
        [int(event.timeUnixNano) for event in span.events],
        [event.name for event in span.events],
        [_text_map(event.attributes) for event in span.events],
        [hex_id(link.traceId, 16) for link in span.links],
        [hex_id(link.spanId, 8) for link in span.links],
        [link.traceState for link in span.links],
        [_text_map(link.attributes) for link in span.links],
    )


def _text_map(attributes: list[KeyValue]) -> list[tuple[str, str]]:
    return [(kv.key, attribute_text(kv.value)) for kv in attributes]
