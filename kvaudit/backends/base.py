"""What every backend offers: kvaudit's SQL over the views `spans`, `pages`, `replicas`, `read_errors`.

A backend is where the views live: DuckDB over trace files, an ingested database or
Parquet (`DuckDBBackend`), or ClickHouse behind the OpenTelemetry Collector
(`ClickHouseBackend`). Callers always write kvaudit SQL, which is DuckDB's dialect
(the named queries and the audit rules are written once, in it); each backend
translates it to its own `dialect` where that differs (see `clickhouse_translate`).

Query parameters are the named queries' variables: `getvariable('kvaudit_...')` in
the SQL, given as `params={"kvaudit_...": value}`. Beyond DuckDB's own, kvaudit SQL has
one function, `recent(ts, span)`: `ts` lies within `span` (an INTERVAL) before the
newest span's end, so a window follows the traces, live or replayed.

Every surface (`sql`, `audit`, `report`, `alerts`, `exporter`, `tui`) reads through
this interface and nothing else, so each works on every backend.

SQL kvaudit did not write (an alert rule's `expr`) runs through `sandboxed`: one query
that reads the views and nothing else, stopped at a time limit, its rows capped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

from kvaudit.errors import InputError

if TYPE_CHECKING:
    import pyarrow as pa

    from kvaudit.read.columns import Tables

Params = Mapping[str, Any]
Rows = list[tuple[Any, ...]]
# What `recent(ts, span)` means, in kvaudit SQL: each backend defines the function as this.
RECENT = "ts > (SELECT max(end_time) FROM spans) - span"
# What one alert rule's query may take (the sandbox sets them before each rule): memory,
# and disk for what it spills past that. Without them DuckDB would let a rule take 80%
# of the machine's memory and 90% of the disk its temporary directory is on.
RULE_MEMORY_BYTES: Final = 2 << 30
RULE_SPILL_BYTES: Final = 4 << 30


class BackendError(InputError):
    """A backend could not run a query or could not be reached.

    Bad input: the CLI reports it as one line and exit status 2. `detail` is the engine's
    whole message (its first line is the error's text), where a caller wants more, such
    as the line a syntax error points at.
    """

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail if detail is not None else message


class QueryTimeoutError(BackendError):
    """A query ran past its time limit and was stopped."""


def one_query(sql: str) -> str:
    """The text of `sql` as one query (SELECT, WITH, VALUES, ...), read by DuckDB's parser (kvaudit SQL is its dialect).

    Raises:
        BackendError: it does not parse, holds several statements, or one that is not a query.
    """
    import duckdb  # the parser only: no connection

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise BackendError(str(exc).splitlines()[0], str(exc)) from None
    if len(statements) != 1:
        raise BackendError(f"{len(statements)} statements where one query was expected")
    if statements[0].type != duckdb.StatementType.SELECT:
        raise BackendError(f"a {statements[0].type.name} statement where a query was expected")
    return statements[0].query.strip().rstrip(";")


class Backend(ABC):
    """The views of kvaudit's trace contract, queryable with kvaudit SQL."""

    dialect: ClassVar[str]
    """The SQL dialect the backend runs natively, in sqlglot's naming (`duckdb`, `clickhouse`)."""
    inlines_ctes: ClassVar[bool] = False
    """Whether a CTE read in several places is computed once for each (ClickHouse), rather than once
    (DuckDB's `MATERIALIZED`): there, many readers of one CTE cost more apart than together."""

    @abstractmethod
    def query(self, sql: str, params: Params | None = None) -> tuple[list[str], Rows]:
        """Run one kvaudit SQL query.

        Args:
            sql: one statement in kvaudit SQL (DuckDB's dialect) over the views.
            params: values of the `getvariable(...)` variables the statement reads;
                an absent variable reads as NULL.

        Returns:
            The column names and the rows as tuples of Python values; ([], []) for a
            statement that returns no rows (CREATE ...).

        Raises:
            BackendError: the query failed (syntax, unknown column, server error).
        """

    @abstractmethod
    def arrow(self, sql: str, params: Params | None = None) -> pa.Table:
        """Run one kvaudit SQL query and return its result as an Arrow table.

        Args and Raises: as `query`.
        """

    @abstractmethod
    def sandboxed(self, sql: str, *, timeout_s: float, max_rows: int) -> pa.Table:
        """Run a query kvaudit did not write (an alert rule's) where it can only read.

        The query must be one query (`one_query`); it reads the views and the temporary
        views and tables made here, and cannot write, read files, reach the network, load
        extensions or change settings (each backend says how it ensures that). It may use
        RULE_MEMORY_BYTES of memory and spill RULE_SPILL_BYTES to disk beyond what is spilled already
        (a live store's rows past its memory budget); past them it fails.

        Args:
            timeout_s: stop the query after this long.
            max_rows: the most rows returned (the query stops producing more).

        Raises:
            QueryTimeoutError: it ran past `timeout_s`.
            BackendError: it is not one query, or failed.
        """

    @abstractmethod
    def temp_table(self, name: str, table: pa.Table) -> None:
        """Create (or replace) a temporary table `name` holding `table`, visible to later queries.

        Raises:
            BackendError: the table could not be created.
        """

    @abstractmethod
    def temp_view(self, name: str, sql: str) -> None:
        """Create (or replace) a temporary view `name` of the kvaudit SQL query `sql`.

        Raises:
            BackendError: the view could not be created.
        """

    def refresh(
        self,
        *,
        final: bool = True,
        added: Callable[[Tables], None] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Tables | None:
        """Take in what arrived since the last call, where the backend reads growing files itself.

        Args:
            final: also read an unterminated last line (a one-shot read, not a live one).
            added: called with the rows of each part of the read as it is taken in (they
                are then not kept for the return: a read of any size holds one part's rows).
            progress: called with the bytes of each part read.

        Returns:
            The rows added (None where `added` took them); None for a backend whose queries
            always see the newest data (ClickHouse fed by the Collector, an ingested
            database), which has nothing to read.
        """
        return None

    @property
    def follows_files(self) -> bool:
        """Whether `refresh` reads growing trace files (otherwise the queries see the newest data)."""
        return False

    def behind_bytes(self) -> int:
        """Bytes of the files the backend follows that `refresh` has not read yet (0 where it reads none)."""
        return 0

    def repeated_spans(self) -> int:
        """Spans read a second time and dropped so far (see `kvaudit.read.span_identity`; 0 where it reads none)."""
        return 0

    def row_ends(self) -> Mapping[str, int] | None:
        """How many rows `pages`, `spans` and `read_errors` hold, numbered in the order they were taken in,
        where the backend numbers them (a store in a DuckDB database: `kvaudit.read.store.TraceStore.row_ends`,
        whose `kvaudit_<view>_between(first, end)` are the rows numbered from `first` to `end - 1`);
        None elsewhere."""
        return None

    @abstractmethod
    def cursor(self) -> Backend:
        """The same data for use by another thread (which may query while this one refreshes)."""

    @abstractmethod
    def interrupt(self) -> None:
        """Stop the query running on this backend now, called from another thread; the query
        then fails with an error. Where the backend cannot, nothing: its queries end by themselves."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection; the backend is unusable afterwards."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
