"""Typed tables in ClickHouse, filled at insert from the Collector's `otel_traces`: `kvaudit_pages` and the rest.

Over the exporter's table every query decodes the attribute maps of every event it
reads (`clickhouse_views`), 5-10 times the per-row cost of typed columns
(docs/scale.md). These tables hold the views' rows already decoded: a materialized
view on `otel_traces` computes, for each inserted block, the very expressions the
views use, and appends the rows to a table whose columns are the read stage's
(`kvaudit.read.columns`, generated from the contract's column maps), so nothing here
names a column twice. The backend reads them when present (`clickhouse.py`).

- `kvaudit_pages`: one row per page event, partitioned by UTC day, ordered by replica,
  key and time, as `kvaudit ingest --parquet` sorts its files: a replica's pages lie
  together (a replica filter reads its range), and a point lookup reads a granule of
  each replica. Beside the views' columns it stores each page's key id (`KEY_ID`,
  computed at insert), which the view `pages_keyed` reads.
- `kvaudit_spans`: one row per span, partitioned by UTC day, ordered by replica and start.
- `kvaudit_replicas`: one row per process (ReplacingMergeTree: repeats merge away).

Each table and materialized view carries a comment naming its source table and a
fingerprint of its layout; the backend takes only tables whose comments match what
this version of kvaudit would create, so an older layout falls back to the views
instead of answering differently.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
from sqlglot import exp

from kvaudit.backends.clickhouse_views import (
    DEFAULT_TABLE,
    KEY_ID,
    KEYED_VIEW,
    NOT_KEPT,
    key_id_sql,
    select_list,
    table_sql,
    view_expressions,
    view_queries,
)
from kvaudit.read.columns import PAGES_SCHEMA, RESOURCES_SCHEMA, SPANS_SCHEMA

# Strings with as many values as rows (ids, hashes): stored plainly. Every other string
# (replicas, ops, models, dtypes, layouts, ...) has few values and is LowCardinality.
_MANY_VALUES: Final = frozenset({"key", "trace_id", "span_id", "parent_span_id", "request_id", "checksum"})
# Codecs by measurement (docs/scale.md, "Typed tables": bench/scale_codecs.py on the
# bench's fleet): ZSTD(1) halves LZ4's size for the ids and hashes that dominate, and
# ZSTD(3) gains little more; a time column also halves again under Delta where its rows
# follow one another in time (a replica's spans), and neither gains nor loses by it where
# they do not (a replica's pages, by key).
_CODECS: Final = {
    pa.string(): "ZSTD(1)",
    pa.int64(): "ZSTD(1)",
    pa.bool_(): "ZSTD(1)",
    pa.float64(): "ZSTD(1)",
    pa.list_(pa.int64()): "ZSTD(1)",
    pa.map_(pa.string(), pa.string()): "ZSTD(1)",
}
_TIME_CODEC: Final = "Delta, ZSTD(1)"
_TIMES: Final = frozenset({"time_ns", "start_ns", "end_ns"})
_TYPES: Final = {
    pa.string(): "String",
    pa.int64(): "Int64",
    pa.bool_(): "Bool",
    pa.float64(): "Float64",
    # As in the views: ClickHouse has no Nullable arrays, and an absent shape is NULL.
    pa.list_(pa.int64()): "Variant(Array(Int64))",
    pa.map_(pa.string(), pa.string()): "Map(String, String)",
}
_UNNULLABLE: Final = (pa.list_(pa.int64()), pa.map_(pa.string(), pa.string()))


def _day(column: str) -> str:
    return f"toDate(fromUnixTimestamp64Nano({column}, 'UTC'))"


@dataclass(frozen=True)
class TypedTable:
    """One typed table: the view it serves, its columns (the read stage's), its layout."""

    view: str
    name: str
    schema: pa.Schema
    order_by: str
    partition_by: str | None = None
    engine: str = "MergeTree"
    required: frozenset[str] = frozenset()  # columns never NULL in the views: stored without a null map
    identity: str = "trace_id, span_id"  # what a row came from: the rows a backfill must not copy twice
    # A time column and the least and greatest value of it a partition of the exporter's
    # table can give (SQL over that table): the typed rows a backfill compares with.
    time_range: tuple[str, str, str] | None = None
    # Columns beyond the view's, computed by ClickHouse at insert (`MATERIALIZED`, so
    # neither an insert nor `SELECT *` names them): name -> type, expression and codec.
    derived: tuple[tuple[str, str], ...] = ()

    @property
    def columns(self) -> list[pa.Field]:
        """The stored columns: the read stage's, but those the exporter's table does not keep."""
        return [field for field in self.schema if field.name not in NOT_KEPT]

    @property
    def derived_columns(self) -> list[str]:
        """The `derived` columns as `CREATE TABLE` declares them."""
        return [f"{name} {definition}" for name, definition in self.derived]

    @property
    def mv_name(self) -> str:
        return f"{self.name}_mv"


TYPED_TABLES: Final = (
    TypedTable(
        "pages",
        "kvaudit_pages",
        PAGES_SCHEMA,
        order_by="replica, key, time_ns",
        partition_by=_day("time_ns"),
        required=frozenset({"resource_id", "time_ns"}),
        # A hash is random bits: no codec shrinks it.
        derived=((KEY_ID, f"UInt128 MATERIALIZED {key_id_sql('key')} CODEC(NONE)"),),
        time_range=(
            "time_ns",
            "toUnixTimestamp64Nano(minIf(arrayMin(`Events.Timestamp`), notEmpty(`Events.Timestamp`)))",
            "toUnixTimestamp64Nano(maxIf(arrayMax(`Events.Timestamp`), notEmpty(`Events.Timestamp`)))",
        ),
    ),
    TypedTable(
        "spans",
        "kvaudit_spans",
        SPANS_SCHEMA,
        order_by="replica, start_ns",
        partition_by=_day("start_ns"),
        required=frozenset({"resource_id", "start_ns", "end_ns"}),
        time_range=("start_ns", "toUnixTimestamp64Nano(min(Timestamp))", "toUnixTimestamp64Nano(max(Timestamp))"),
    ),
    TypedTable(
        "replicas",
        "kvaudit_replicas",
        RESOURCES_SCHEMA,
        order_by="resource_id",
        engine="ReplacingMergeTree",
        required=frozenset({"resource_id"}),
        identity="resource_id",
    ),
)


def column_type(table: TypedTable, field: pa.Field) -> str:
    """The ClickHouse type of a stored column: the view's type, LowCardinality where values repeat."""
    base = _TYPES[field.type]
    if field.name not in table.required and field.type not in _UNNULLABLE:
        base = f"Nullable({base})"
    if field.type == pa.string() and field.name not in _MANY_VALUES:
        base = f"LowCardinality({base})"
    return base


def codec(field: pa.Field) -> str:
    """The compression codec of a stored column."""
    return _TIME_CODEC if field.name in _TIMES else _CODECS[field.type]


def create_table(table: TypedTable, source: str = DEFAULT_TABLE) -> str:
    """`CREATE TABLE IF NOT EXISTS` for one typed table."""
    columns = ",\n    ".join(
        [f"{field.name} {column_type(table, field)} CODEC({codec(field)})" for field in table.columns]
        + table.derived_columns
    )
    partition = f"\nPARTITION BY {table.partition_by}" if table.partition_by else ""
    return (
        f"CREATE TABLE IF NOT EXISTS {table.name} (\n    {columns}\n) ENGINE = {table.engine}(){partition}\n"
        f"ORDER BY ({table.order_by})\nSETTINGS allow_nullable_key = 1\nCOMMENT {_quote(comment(table, source))}"
    )


def create_materialized_view(table: TypedTable, source: str = DEFAULT_TABLE) -> str:
    """`CREATE MATERIALIZED VIEW IF NOT EXISTS` filling one typed table at each insert into `source`."""
    return (
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {table.mv_name} TO {table.name}\n"
        f"AS {insert_query(table, source)}\nCOMMENT {_quote(comment(table, source))}"
    )


def insert_query(table: TypedTable, source: str = DEFAULT_TABLE, *, rows: str | None = None) -> str:
    """The rows of `table` from the exporter's table `source` (or from `rows`, a query of some of its rows):
    the view's query, of the stored columns."""
    stored = {field.name for field in table.columns}
    expressions = {name: e for name, e in view_expressions()[table.view].items() if name in stored}
    return view_queries(source, {table.view: select_list(expressions)}, rows=rows)[table.view]


def missing_rows(table: TypedTable, source: str, partition: str) -> str:
    """The rows of one partition of `source` that `table` lacks: what a backfill inserts.

    What a row came from identifies it (`TypedTable.identity`: its span, or its process),
    so a partition copied twice, or one that the materialized view filled in part, gives
    only what is missing. Only the typed rows of the partition's time range are read to
    tell, so memory holds one partition's ids.
    """
    of_partition = f"FROM {table_sql(source)} WHERE _partition_id = {_quote(partition)}"
    copied = f"SELECT {table.identity} FROM {table.name}"
    if table.time_range is not None:
        column, low, high = table.time_range
        copied += f" WHERE {column} BETWEEN (SELECT {low} {of_partition}) AND (SELECT {high} {of_partition})"
    rows = insert_query(table, source, rows=f"SELECT * {of_partition}")
    return f"SELECT * FROM ({rows}) WHERE ({table.identity}) NOT IN ({copied})"


def setup_statements(source: str = DEFAULT_TABLE) -> list[str]:
    """Every statement `kvaudit clickhouse setup` runs, in order: each table, then what fills it."""
    statements = []
    for table in TYPED_TABLES:
        statements += [create_table(table, source), create_materialized_view(table, source)]
    return statements


def typed_view_statements() -> dict[str, str]:
    """`CREATE TEMPORARY VIEW` statements for the views over the typed tables: the same columns and values."""
    statements = {}
    for table in TYPED_TABLES:
        stored = {field.name for field in table.columns}
        columns = {
            name: name if name in stored else expression for name, expression in view_expressions()[table.view].items()
        }
        distinct = "DISTINCT " if table.view == "replicas" else ""
        once = f" LIMIT 1 BY {_one_row_by(table)}" if table.view in ("spans", "pages") else ""
        statements[table.view] = (
            f"CREATE TEMPORARY VIEW {table.view} AS SELECT {distinct}{select_list(columns)} FROM {table.name}{once}"
        )
        if table.view == "pages":
            statements[KEYED_VIEW] = (
                f"CREATE TEMPORARY VIEW {KEYED_VIEW} AS SELECT {select_list(columns)}, {KEY_ID} FROM {table.name}{once}"
            )
    return statements


def _one_row_by(table: TypedTable) -> str:
    """What keeps one row per span identity (kvaudit.read.span_identity) in a typed table, where a
    span the Collector stored twice is twice: a span's identity, and for a page event of a span
    every column stored (the table keeps no position of the event in its span)."""
    if table.view == "spans":
        return "trace_id, span_id"
    return ", ".join(field.name for field in table.columns if field.type not in _UNNULLABLE)


def existing_query() -> str:
    """The typed tables and materialized views of the current database, as `name, comment` rows."""
    names = ", ".join(_quote(name) for table in TYPED_TABLES for name in (table.name, table.mv_name))
    return f"SELECT name, comment FROM system.tables WHERE database = currentDatabase() AND name IN ({names})"


def typed_tables_unusable(existing: Mapping[str, str], source: str = DEFAULT_TABLE) -> str | None:
    """Why the typed tables cannot serve the views of `source`, or None when they can.

    Args:
        existing: name -> comment of those present (`existing_query`).
    """
    expected = {name: comment(table, source) for table in TYPED_TABLES for name in (table.name, table.mv_name)}
    absent = [name for name in expected if name not in existing]
    if len(absent) == len(expected):
        return f"no typed tables for {source} ({', '.join(t.name for t in TYPED_TABLES)})"
    if absent:
        return f"typed tables incomplete: no {', '.join(absent)}"
    other = [name for name, text in expected.items() if existing[name] != text]
    if other:
        return f"typed tables {', '.join(other)} are of another layout or source table than this kvaudit's"
    return None


def comment(table: TypedTable, source: str) -> str:
    """What a typed table and its materialized view say about themselves: their source and layout."""
    layout = "\n".join(
        [table.engine, table.order_by, table.partition_by or ""]
        + [f"{field.name} {column_type(table, field)} {codec(field)}" for field in table.columns]
        + table.derived_columns
        + [insert_query(table, source)]
    )
    fingerprint = hashlib.sha256(layout.encode()).hexdigest()[:16]
    return f"kvaudit {table.view} from {source}, layout {fingerprint}"


def _quote(text: str) -> str:
    return exp.Literal.string(text).sql(dialect="clickhouse")
