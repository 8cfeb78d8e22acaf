"""ClickHouse behind the OpenTelemetry Collector, as a kvaudit backend.

The Collector's ClickHouse exporter writes spans into `otel_traces`; kvaudit defines
its views over that table as temporary views of its own session (nothing is created
in the database) and runs kvaudit SQL translated to ClickHouse's dialect. Two
connections: a ClickHouse server through clickhouse-connect (`clickhouse://` URLs),
and chdb, the ClickHouse engine in-process (tests, local files).

The sandbox (`sandboxed`, what alert rules run in): the query, one query by DuckDB's
parser, is translated and run as `SELECT * FROM (...) LIMIT n` with the query-level
settings `readonly = 1` (reads only: no writes, no DDL, no settings changed, and no
table functions that reach files or the network, `file()`, `url()`, `s3()`,
`remote()`; `readonly = 2` would still allow those) and `max_execution_time`, after
which the server stops it, `max_memory_usage` and `max_temporary_data_on_disk_size_for_query`
(the rule's memory and spill limits, per query). The temporary views kvaudit made in its session stay
readable. What else the rule can read is what the connecting user's grants allow:
give kvaudit a user that may read only the traces table.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from abc import ABC, abstractmethod
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import sqlglot

from kvaudit.backends.base import (
    RULE_MEMORY_BYTES,
    RULE_SPILL_BYTES,
    Backend,
    BackendError,
    Params,
    QueryTimeoutError,
    Rows,
    one_query,
)
from kvaudit.backends.clickhouse_tables import existing_query, typed_tables_unusable, typed_view_statements
from kvaudit.backends.clickhouse_translate import WRITE, Statement, to_clickhouse
from kvaudit.backends.clickhouse_views import DEFAULT_TABLE, view_columns, view_statements
from kvaudit.errors import BadValueError, InputError

logger = logging.getLogger(__name__)

# DuckDB's semantics where ClickHouse's defaults differ: an outer join's missing side
# is NULL (not the type's default), an aggregate over no rows is NULL (not 0), a name
# that is both a column and an alias of the same SELECT is the column (`sum(x) AS x`
# would otherwise nest aggregates), and the views' nullable arrays (Variant) may be
# grouped and sorted by, as lists in DuckDB.
SETTINGS: Final[dict[str, Any]] = {
    "prefer_column_name_to_alias": 1,
    "join_use_nulls": 1,
    "aggregate_functions_null_for_empty": 1,
    "allow_suspicious_types_in_group_by": 1,
    "allow_suspicious_types_in_order_by": 1,
}
# ClickHouse's error for a query stopped at max_execution_time (code 159).
TIMEOUT_EXCEEDED: Final = "TIMEOUT_EXCEEDED"
SCHEMES: Final = ("clickhouse", "clickhouses")
CHDB_SCHEME: Final = "chdb"
DEFAULT_PORTS: Final = {"clickhouse": 8123, "clickhouses": 8443}


class Connection(ABC):
    """One ClickHouse session: what `ClickHouseBackend` needs from a client."""

    @abstractmethod
    def arrow(self, sql: str) -> pa.Table:
        """The rows of one ClickHouse query. Raises BackendError."""

    @abstractmethod
    def command(self, sql: str) -> None:
        """Run one ClickHouse statement. Raises BackendError."""

    @abstractmethod
    def insert(self, table: str, data: pa.Table) -> None:
        """Append Arrow rows to an existing table. Raises BackendError."""

    @abstractmethod
    def close(self) -> None: ...


class ServerConnection(Connection):
    """A ClickHouse server over HTTP (clickhouse-connect), in a session of its own."""

    def __init__(self, url: str) -> None:
        import clickhouse_connect  # imported here: only `clickhouse://` users need it

        parts = urlparse(url)
        try:
            self._client = clickhouse_connect.get_client(
                host=parts.hostname or "localhost",
                port=parts.port or DEFAULT_PORTS[parts.scheme],
                username=unquote(parts.username or "default"),
                password=unquote(parts.password or ""),
                database=parts.path.strip("/") or "default",
                secure=parts.scheme == "clickhouses",
                settings=SETTINGS,
            )
        except Exception as exc:  # the client raises its own and its HTTP library's errors
            raise BackendError(f"{parts.hostname}:{parts.port}: cannot connect to ClickHouse ({exc})") from None

    def arrow(self, sql: str) -> pa.Table:
        return self._call(self._client.query_arrow, sql)

    def command(self, sql: str) -> None:
        self._call(self._client.command, sql)

    def insert(self, table: str, data: pa.Table) -> None:
        self._call(self._client.insert_arrow, table, data)

    def close(self) -> None:
        self._client.close()

    @staticmethod
    def _call(method: Any, *args: Any) -> Any:
        from clickhouse_connect.driver.exceptions import ClickHouseError

        try:
            return method(*args)
        except ClickHouseError as exc:
            raise BackendError(_first_line(exc)) from None


class ChdbConnection(Connection):
    """The ClickHouse engine in this process (chdb), over a database directory or a temporary one."""

    def __init__(self, path: str | None = None) -> None:
        from chdb import session  # imported here: only chdb users need it

        self.path = path  # None: a database in memory
        self._session = session.Session(path) if path else session.Session()
        for name, value in SETTINGS.items():
            self.command(f"SET {name} = {value}")

    def arrow(self, sql: str) -> pa.Table:
        try:
            return self._session.query(sql, "ArrowTable")
        except RuntimeError as exc:  # chdb reports every engine error as RuntimeError
            if TIMEOUT_EXCEEDED in str(exc):
                self._drain()
            raise BackendError(_first_line(exc)) from None

    def _drain(self) -> None:
        """Take the stale output a query stopped at max_execution_time leaves behind: chdb (4.4)
        hands it to the next query as its result (garbled Arrow), and to that one only."""
        with contextlib.suppress(RuntimeError, ValueError):  # the stale output, read as this query's
            self._session.query("SELECT 1", "CSV")

    def command(self, sql: str) -> None:
        self.arrow(sql)

    def insert(self, table: str, data: pa.Table) -> None:
        # chdb reads Python data only through files or its Python() table function; a
        # Parquet file keeps every type (maps, nested arrays, nanosecond timestamps).
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "rows.parquet")
            pq.write_table(data, path)
            self.command(f"INSERT INTO {table} SELECT * FROM file({_literal(path)}, Parquet)")

    def close(self) -> None:
        self._session.close()


class ClickHouseBackend(Backend):
    """kvaudit's views over the Collector's `otel_traces` table, queried with kvaudit SQL.

    Args:
        connection: the session to run in.
        table: the exporter's traces table (its `traces_table_name`, `otel_traces` by default).
        typed: read the typed tables `kvaudit clickhouse setup` makes (`clickhouse_tables`)
            where they exist with this kvaudit's layout; False reads the exporter's table
            even then (benchmarks compare the two).

    The views are created in the session at the first query, so that the table may be
    created after the backend (tests, `clickhouse_load`); a missing table is reported then.
    Without typed tables the views decode the exporter's attribute maps, and the backend
    says so once (a log line). One session serves every thread (`cursor()` is the backend
    itself): its calls take turns.
    """

    dialect = WRITE
    inlines_ctes = True  # `clickhouse_translate`: `[NOT] MATERIALIZED` is dropped, and ClickHouse inlines CTEs

    def __init__(self, connection: Connection, table: str = DEFAULT_TABLE, *, typed: bool = True) -> None:
        self.connection = connection
        self.table = table
        self.typed = typed
        self.reads_typed_tables: bool | None = None  # known from the first query on
        self._columns = view_columns()  # and those of the temporary tables and views made here
        self._lock = threading.RLock()

    def _create_views(self) -> None:
        statements = view_statements(self.table)
        unusable = typed_tables_unusable(self.existing_typed(), self.table) if self.typed else "not asked for"
        if unusable is None:
            statements |= typed_view_statements()
        elif self.typed:
            logger.warning(
                "ClickHouse: %s, so every query decodes the attribute maps of %s (5-10x the cost per row);"
                " see `kvaudit clickhouse setup`",
                unusable,
                self.table,
            )
        for statement in statements.values():
            self.connection.command(statement)
        self.reads_typed_tables = unusable is None

    def existing_typed(self) -> dict[str, str]:
        """The typed tables and materialized views present in the database (name -> comment)."""
        found = self.connection.arrow(existing_query())
        return dict(zip(found.column("name").to_pylist(), found.column("comment").to_pylist()))

    def arrow(self, sql: str, params: Params | None = None) -> pa.Table:
        with self._lock:
            if self.reads_typed_tables is None:
                self._create_views()
            result = pa.table({})
            for statement in self._translate(sql, params):
                if statement.returns_rows:
                    result = self.connection.arrow(statement.sql)
                else:
                    self.connection.command(statement.sql)
            return result

    def sandboxed(self, sql: str, *, timeout_s: float, max_rows: int) -> pa.Table:
        statements = self._translate(one_query(sql), None)
        if len(statements) != 1 or not statements[0].returns_rows:
            raise BackendError("not one query")
        # Newlines around the query: a comment at its end must not swallow the parenthesis.
        bounded = (
            f"SELECT * FROM (\n{statements[0].sql}\n) LIMIT {int(max_rows)}"
            f" SETTINGS readonly = 1, max_execution_time = {timeout_s:g}, max_memory_usage = {RULE_MEMORY_BYTES},"
            f" max_temporary_data_on_disk_size_for_query = {RULE_SPILL_BYTES}"
        )
        with self._lock:
            self.arrow("SELECT 1")  # the kvaudit views first, made outside the sandbox
            try:
                return self.connection.arrow(bounded)
            except BackendError as exc:
                if TIMEOUT_EXCEEDED in str(exc):
                    raise QueryTimeoutError(f"stopped after {timeout_s:g}s (the time limit)") from None
                raise

    def _translate(self, sql: str, params: Params | None) -> list[Statement]:
        try:
            return to_clickhouse(sql, params, self._columns)
        except sqlglot.errors.SqlglotError as exc:
            raise BackendError(f"cannot translate the query to ClickHouse: {_first_line(exc)}") from None

    def temp_view(self, name: str, sql: str) -> None:
        statements = self._translate(sql, None)
        if len(statements) != 1 or not statements[0].returns_rows:
            raise BackendError(f"view {name}: not one query")
        with self._lock:
            self.arrow("SELECT 1")  # the kvaudit views first: the new one may read them
            # Temporary views cannot be replaced in place; dropping a temporary one leaves the database alone.
            self.connection.command(f"DROP TEMPORARY VIEW IF EXISTS {_identifier(name)}")
            self.connection.command(f"CREATE TEMPORARY VIEW {_identifier(name)} AS {statements[0].sql}")
            self._columns[name] = self.connection.arrow(f"SELECT * FROM {_identifier(name)} LIMIT 0").column_names

    def cursor(self) -> ClickHouseBackend:
        return self

    def query(self, sql: str, params: Params | None = None) -> tuple[list[str], Rows]:
        """As `Backend.query`; timestamps come as naive UTC datetimes, as from DuckDB."""
        table = self.arrow(sql, params)
        return table.column_names, list(zip(*(_python_values(column) for column in table.columns)))

    def temp_table(self, name: str, table: pa.Table) -> None:
        columns = ", ".join(f"{_identifier(f.name)} {_column_type(f.type)}" for f in table.schema)
        with self._lock:
            self.connection.command(
                f"CREATE OR REPLACE TEMPORARY TABLE {_identifier(name)} ({columns}) ENGINE = Memory"
            )
            if table.num_rows:
                self.connection.insert(_identifier(name), table)
            self._columns[name] = table.column_names

    def interrupt(self) -> None:
        """Nothing: a query runs to its end (an alert rule's to its time limit, `max_execution_time`)."""

    def close(self) -> None:
        self.connection.close()


def connect(url: str) -> ClickHouseBackend:
    """The backend for `clickhouse://[USER[:PASSWORD]@]HOST[:PORT]/DB[?table=otel_traces]`,
    or `chdb:///PATH[?table=otel_traces]`: the ClickHouse engine in this process over the
    database directory PATH (chdb's, as a session there left it).

    `clickhouses://` uses TLS. The port is the HTTP interface's (8123, or 8443 with TLS).

    Raises:
        BadValueError: not a ClickHouse URL.
        InputError: no chdb database directory at PATH.
        BackendError: the server cannot be reached or has no such table.
    """
    parts = urlparse(url)
    table = traces_table(url)
    if parts.scheme == CHDB_SCHEME and parts.path:
        if not os.path.isdir(parts.path):
            raise InputError(f"{parts.path}: no chdb database directory")
        return ClickHouseBackend(ChdbConnection(parts.path), table)
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise BadValueError(f"{url}: expected clickhouse://HOST:PORT/DB or chdb:///PATH")
    return ClickHouseBackend(ServerConnection(url), table)


def traces_table(url: str) -> str:
    """The exporter's traces table a ClickHouse URL names (`?table=`, `otel_traces` by default)."""
    return parse_qs(urlparse(url).query).get("table", [DEFAULT_TABLE])[0]


_CH_TYPES: Final = {
    pa.string(): "Nullable(String)",
    pa.int64(): "Nullable(Int64)",
    pa.float64(): "Nullable(Float64)",
    pa.bool_(): "Nullable(Bool)",
}


def _python_values(column: pa.ChunkedArray) -> list[Any]:
    if pa.types.is_timestamp(column.type) and column.type.tz is not None:
        # The views' times are UTC; DuckDB hands out naive datetimes of microseconds.
        column = column.cast(pa.timestamp("us"), safe=False)
    return column.to_pylist()


def _column_type(type_: pa.DataType) -> str:
    try:
        return _CH_TYPES[type_]
    except KeyError:
        raise BackendError(f"no ClickHouse column type for {type_}") from None


def _identifier(name: str) -> str:
    return sqlglot.exp.to_identifier(name, quoted=True).sql(dialect=WRITE)


def _literal(text: str) -> str:
    return sqlglot.exp.Literal.string(text).sql(dialect=WRITE)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
