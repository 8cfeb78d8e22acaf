"""The views `spans`, `pages`, `replicas`, `read_errors` over the Collector's `otel_traces` table.

The OpenTelemetry Collector's ClickHouse exporter keeps every attribute as text in
`Map(LowCardinality(String), String)` columns (pdata's `AsString`: integers in decimal,
booleans as `true`/`false`, arrays as JSON) and page descriptors as span events in
the nested `Events` columns. These views cast them back to the columns and types of
the DuckDB views (kvaudit.store), so the same queries run on both. The attribute keys
come from the reader's column maps, which take them from kvaudit.contract.

What the exporter's table does not keep reads as NULL: `file` and `line` (no trace
file), the spans' dropped attribute and event counts (the exporter writes neither),
and so `read_errors` is empty. An absent array attribute is NULL, as in DuckDB:
`shape` is a `Variant(Array(Int64))`, because ClickHouse has no Nullable arrays.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa
from sqlglot import exp

from kvaudit.contract import EVENT_PAGE, PAGE_COLUMNS, RESOURCE_COLUMNS, SPAN_COLUMNS
from kvaudit.read.columns import ERRORS_SCHEMA

DEFAULT_TABLE: Final = "otel_traces"
_ARRAY: Final = "Variant(Array(Int64))"
# OTLP status codes as the exporter writes them (traceutil.StatusCodeStr).
_STATUS_CODES: Final = {"Unset": 0, "Ok": 1, "Error": 2}


def _quote(text: str) -> str:
    return exp.Literal.string(text).sql(dialect="clickhouse")


def _attribute(column: str, key: str, kind: str) -> str:
    """The SQL reading one attribute out of a string map, cast to its column's type."""
    value = f"{column}[{_quote(key)}]"
    if kind == "int":
        return f"toInt64OrNull({value})"
    if kind == "ints":
        return f"if(mapContains({column}, {_quote(key)}), CAST(JSONExtract({value}, 'Array(Int64)') AS {_ARRAY}), NULL)"
    present = f"mapContains({column}, {_quote(key)})"
    if kind == "bool":
        return f"CAST(if({present}, {value} = 'true', NULL) AS Nullable(Bool))"
    return f"if({present}, {value}, NULL)"


def _attributes(column: str, columns: dict[str, tuple[str, str]]) -> list[str]:
    return [f"{_attribute(column, key, kind)} AS {name}" for name, (key, kind) in columns.items()]


def _resource_id(column: str) -> str:
    # The same id the DuckDB reader derives (kvaudit.reader._resource_id): the first 8
    # bytes of the MD5 of the sorted `key=value` lines, as a little-endian Int64.
    lines = f"arraySort(arrayMap((k, v) -> concat(k, '=', v), mapKeys({column}), mapValues({column})))"
    return f"reinterpretAsInt64(substring(MD5(arrayStringConcat({lines}, '\\n')), 1, 8))"


def _head(res: str) -> list[str]:
    return [
        "CAST(NULL AS Nullable(String)) AS file",
        "CAST(NULL AS Nullable(Int64)) AS line",
        f"{_resource_id(res)} AS resource_id",
        f"{_attribute(res, *RESOURCE_COLUMNS['replica'])} AS replica",
        "CAST(TraceId AS Nullable(String)) AS trace_id",
        "CAST(SpanId AS Nullable(String)) AS span_id",
    ]


def view_statements(table: str = DEFAULT_TABLE) -> dict[str, str]:
    """`CREATE TEMPORARY VIEW` statements for each view, over the exporter's table `table`."""
    source = exp.to_table(table).sql(dialect="clickhouse")
    lists = _select_lists()
    events = "Events.Timestamp AS event_time, Events.Name AS event_name, Events.Attributes AS event_attributes"
    bodies = {
        "spans": f"SELECT {', '.join(lists['spans'])} FROM {source}",
        "pages": f"SELECT {', '.join(lists['pages'])} FROM {source}"
        f" ARRAY JOIN {events} WHERE event_name = {_quote(EVENT_PAGE)}",
        # Few distinct resources exist (one per process): take them before decoding.
        "replicas": f"SELECT DISTINCT {', '.join(lists['replicas'])}"
        f" FROM (SELECT DISTINCT ResourceAttributes FROM {source})",
        "read_errors": f"SELECT {', '.join(lists['read_errors'])} WHERE 0",
    }
    return {name: f"CREATE TEMPORARY VIEW {name} AS {body}" for name, body in bodies.items()}


def view_columns() -> dict[str, list[str]]:
    """The column names of each view, in order: those of the DuckDB views."""
    return {name: [item.rsplit(" AS ", 1)[1] for item in items] for name, items in _select_lists().items()}


def _select_lists() -> dict[str, list[str]]:
    status = ", ".join(f"StatusCode = {_quote(name)}, {code}" for name, code in _STATUS_CODES.items())
    known = ", ".join(_quote(key) for key, _ in SPAN_COLUMNS.values())
    on_pages = {name: SPAN_COLUMNS[name] for name in ("op", "hook", "backend", "request_id", "outcome")}
    return {
        "spans": [
            *_head("ResourceAttributes"),
            "nullIf(ParentSpanId, '') AS parent_span_id",
            "CAST(SpanName AS Nullable(String)) AS name",
            "toUnixTimestamp64Nano(Timestamp) AS start_ns",
            "start_ns + CAST(Duration AS Int64) AS end_ns",
            f"CAST(multiIf({status}, NULL) AS Nullable(Int64)) AS status_code",
            "CAST(NULL AS Nullable(Int64)) AS dropped_attributes",
            "CAST(NULL AS Nullable(Int64)) AS dropped_events",
            *_attributes("SpanAttributes", SPAN_COLUMNS),
            "toDateTime64(Timestamp, 9, 'UTC') AS start_time",
            "fromUnixTimestamp64Nano(end_ns, 'UTC') AS end_time",
            "Duration / 1e6 AS duration_ms",
            f"CAST(mapFilter((k, v) -> k NOT IN ({known}), SpanAttributes) AS Map(String, String)) AS attributes",
        ],
        "pages": [
            *_head("ResourceAttributes"),
            *_attributes("SpanAttributes", on_pages),
            "toUnixTimestamp64Nano(event_time) AS time_ns",
            *_attributes("event_attributes", PAGE_COLUMNS),
            "toDateTime64(event_time, 9, 'UTC') AS time",
        ],
        "replicas": [
            f"{_resource_id('ResourceAttributes')} AS resource_id",
            *_attributes("ResourceAttributes", RESOURCE_COLUMNS),
        ],
        "read_errors": [f"CAST(NULL AS {_CH_TYPE[field.type]}) AS {field.name}" for field in ERRORS_SCHEMA],
    }


_CH_TYPE: Final = {pa.string(): "Nullable(String)", pa.int64(): "Nullable(Int64)"}
