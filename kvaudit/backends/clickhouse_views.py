"""The views `spans`, `pages`, `replicas`, `read_errors` over the Collector's `otel_traces` table.

The OpenTelemetry Collector's ClickHouse exporter keeps every attribute as text in
`Map(LowCardinality(String), String)` columns (pdata's `AsString`: integers in decimal,
booleans as `true`/`false`, arrays as JSON) and page descriptors as span events in
the nested `Events` columns. These views cast them back to the columns and types of
the DuckDB views (kvaudit.read.store), so the same queries run on both. The attribute keys
come from the reader's column maps, which take them from kvaudit.contract.

What the exporter's table does not keep reads as NULL: `file` and `line` (no trace
file), the spans' dropped attribute and event counts (the exporter writes neither),
and so `read_errors` is empty. An absent array attribute is NULL, as in DuckDB:
`shape` is a `Variant(Array(Int64))`, because ClickHouse has no Nullable arrays.

One more view, `pages_keyed`, is `pages` with each page's key id (`KEY_ID`): what
kvaudit SQL's `key_id(key)` reads on ClickHouse (kvaudit.backends.clickhouse_translate).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import pyarrow as pa
from sqlglot import exp

from kvaudit.contract import EVENT_PAGE, PAGE_COLUMNS, RESOURCE_COLUMNS, SPAN_COLUMNS
from kvaudit.read.columns import ERRORS_SCHEMA

DEFAULT_TABLE: Final = "otel_traces"
# Columns of the DuckDB views that the exporter's table does not keep, with their types: NULL here.
NOT_KEPT: Final = {
    "file": pa.string(),
    "line": pa.int64(),
    "dropped_attributes": pa.int64(),
    "dropped_events": pa.int64(),
}
_ARRAY: Final = "Variant(Array(Int64))"
# A page's key as ClickHouse groups and joins it fastest: the key's 128-bit SipHash (the
# hash `uniqExact` itself keeps of a string), 0 for a NULL key; computed here, and stored
# at insert by the typed tables (kvaudit.backends.clickhouse_tables). A hash table of
# these takes a third of the time of one of the keys (docs/scale.md, "The key's id").
# Two keys with one id, or a key with the id 0, are as likely as two hashes meeting in
# `uniqExact`'s own count: about 2^-128 a pair.
KEY_ID: Final = "key_hash"
KEYED_VIEW: Final = "pages_keyed"


def key_id_sql(key: str) -> str:
    """The key id (`KEY_ID`) of the key `key` (SQL), as ClickHouse SQL."""
    return f"ifNull(reinterpretAsUInt128(sipHash128({key})), 0)"


# OTLP status codes as the exporter writes them (traceutil.StatusCodeStr).
_STATUS_CODES: Final = {"Unset": 0, "Ok": 1, "Error": 2}


def table_sql(table: str) -> str:
    """A table's name (`otel_traces`, `db.otel_traces`) as ClickHouse SQL, quoted where needed."""
    return exp.to_table(table).sql(dialect="clickhouse")


def _quote(text: str) -> str:
    return exp.Literal.string(text).sql(dialect="clickhouse")


def _attribute(column: str, key: str, kind: str) -> str:
    """The SQL reading one attribute out of a string map, cast to its column's type."""
    value = f"{column}[{_quote(key)}]"
    if kind == "int":
        return f"toInt64OrNull({value})"
    if kind == "double":
        return f"toFloat64OrNull({value})"
    if kind == "ints":
        return f"if(mapContains({column}, {_quote(key)}), CAST(JSONExtract({value}, 'Array(Int64)') AS {_ARRAY}), NULL)"
    present = f"mapContains({column}, {_quote(key)})"
    if kind == "bool":
        return f"CAST(if({present}, {value} = 'true', NULL) AS Nullable(Bool))"
    return f"if({present}, {value}, NULL)"


def _attributes(column: str, columns: dict[str, tuple[str, str]]) -> dict[str, str]:
    return {name: _attribute(column, key, kind) for name, (key, kind) in columns.items()}


def _resource_id(column: str) -> str:
    # The same id the DuckDB reader derives (kvaudit.read.decode._resource_id): the first 8
    # bytes of the MD5 of the sorted `key=value` lines, as a little-endian Int64.
    lines = f"arraySort(arrayMap((k, v) -> concat(k, '=', v), mapKeys({column}), mapValues({column})))"
    return f"reinterpretAsInt64(substring(MD5(arrayStringConcat({lines}, '\\n')), 1, 8))"


def _head(res: str) -> dict[str, str]:
    return {
        "file": _null("file"),
        "line": _null("line"),
        "resource_id": _resource_id(res),
        "replica": _attribute(res, *RESOURCE_COLUMNS["replica"]),
        "trace_id": "CAST(TraceId AS Nullable(String))",
        "span_id": "CAST(SpanId AS Nullable(String))",
    }


def _null(name: str) -> str:
    """A column the exporter's table does not keep: NULL of its type in the DuckDB views."""
    return f"CAST(NULL AS {_CH_TYPE[NOT_KEPT[name]]})"


def view_statements(table: str = DEFAULT_TABLE) -> dict[str, str]:
    """`CREATE TEMPORARY VIEW` statements for each view, over the exporter's table `table`, then `pages_keyed`."""
    statements = {name: f"CREATE TEMPORARY VIEW {name} AS {body}" for name, body in view_queries(table).items()}
    statements[KEYED_VIEW] = (
        f"CREATE TEMPORARY VIEW {KEYED_VIEW} AS SELECT *, {key_id_sql('key')} AS {KEY_ID} FROM pages"
    )
    return statements


def view_queries(
    table: str = DEFAULT_TABLE, lists: Mapping[str, str] | None = None, *, rows: str | None = None
) -> dict[str, str]:
    """The query of each view over the exporter's table `table`.

    Args:
        lists: select lists to use instead of a view's own (`select_list`): the typed
            tables take in a view's rows at insert, of the columns they store.
        rows: a query of the table's rows to read instead of the whole table (a backfill
            reads a partition at a time).
    """
    source = f"({rows})" if rows is not None else table_sql(table)
    # A span stored twice (an OTLP retry the Collector took twice) is read once
    # (kvaudit.read.span_identity): one row per (trace id, span id), and that row's pages.
    once = f"(SELECT * FROM {source} LIMIT 1 BY TraceId, SpanId)"
    lists = {name: select_list(columns) for name, columns in view_expressions().items()} | dict(lists or {})
    events = "Events.Timestamp AS event_time, Events.Name AS event_name, Events.Attributes AS event_attributes"
    return {
        "spans": f"SELECT {lists['spans']} FROM {once}",
        "pages": f"SELECT {lists['pages']} FROM {once} ARRAY JOIN {events} WHERE event_name = {_quote(EVENT_PAGE)}",
        # Few distinct resources exist (one per process): take them before decoding.
        "replicas": f"SELECT DISTINCT {lists['replicas']} FROM (SELECT DISTINCT ResourceAttributes FROM {source})",
        "read_errors": f"SELECT {lists['read_errors']} WHERE 0",
    }


def view_columns() -> dict[str, list[str]]:
    """The column names of each view, in order: those of the DuckDB views."""
    return {name: list(columns) for name, columns in view_expressions().items()}


def view_expressions() -> dict[str, dict[str, str]]:
    """Each view's columns, in order, each with the ClickHouse expression computing it from the exporter's table.

    The columns the DuckDB views compute from others (`pages.time`, `spans.start_time`,
    ...) are computed from the same columns here, so that a view over typed tables
    (kvaudit.backends.clickhouse_tables) takes these expressions as they are.
    """
    status = ", ".join(f"StatusCode = {_quote(name)}, {code}" for name, code in _STATUS_CODES.items())
    known = ", ".join(_quote(key) for key, _ in SPAN_COLUMNS.values())
    on_pages = {name: SPAN_COLUMNS[name] for name in ("op", "hook", "backend", "request_id", "outcome")}
    return {
        "spans": {
            **_head("ResourceAttributes"),
            "parent_span_id": "nullIf(ParentSpanId, '')",
            "name": "CAST(SpanName AS Nullable(String))",
            "start_ns": "toUnixTimestamp64Nano(Timestamp)",
            "end_ns": "start_ns + CAST(Duration AS Int64)",
            "status_code": f"CAST(multiIf({status}, NULL) AS Nullable(Int64))",
            "dropped_attributes": _null("dropped_attributes"),
            "dropped_events": _null("dropped_events"),
            **_attributes("SpanAttributes", SPAN_COLUMNS),
            "start_time": "fromUnixTimestamp64Nano(start_ns, 'UTC')",
            "end_time": "fromUnixTimestamp64Nano(end_ns, 'UTC')",
            "duration_ms": "(end_ns - start_ns) / 1e6",
            "attributes": f"CAST(mapFilter((k, v) -> k NOT IN ({known}), SpanAttributes) AS Map(String, String))",
        },
        "pages": {
            **_head("ResourceAttributes"),
            **_attributes("SpanAttributes", on_pages),
            "time_ns": "toUnixTimestamp64Nano(event_time)",
            **_attributes("event_attributes", PAGE_COLUMNS),
            "time": "fromUnixTimestamp64Nano(time_ns, 'UTC')",
        },
        "replicas": {
            "resource_id": _resource_id("ResourceAttributes"),
            **_attributes("ResourceAttributes", RESOURCE_COLUMNS),
        },
        "read_errors": {field.name: f"CAST(NULL AS {_CH_TYPE[field.type]})" for field in ERRORS_SCHEMA},
    }


def select_list(columns: dict[str, str]) -> str:
    """`expression AS name, ...` for columns as `view_expressions` gives them."""
    return ", ".join(name if expression == name else f"{expression} AS {name}" for name, expression in columns.items())


_CH_TYPE: Final = {pa.string(): "Nullable(String)", pa.int64(): "Nullable(Int64)"}
