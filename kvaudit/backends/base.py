"""What every backend offers: kvaudit's SQL over the views `spans`, `pages`, `replicas`, `read_errors`.

A backend is where the views live: DuckDB over trace files, an ingested database or
Parquet (`DuckDBBackend`), or ClickHouse behind the OpenTelemetry Collector
(`ClickHouseBackend`). Callers always write kvaudit SQL, which is DuckDB's dialect
(the named queries and the audit rules are written once, in it); each backend
translates it to its own `dialect` where that differs (see `translate`).

Query parameters are the named queries' variables: `getvariable('kvaudit_...')` in
the SQL, given as `params={"kvaudit_...": value}`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import pyarrow as pa

Params = Mapping[str, Any]
Rows = list[tuple[Any, ...]]


class BackendError(ValueError):
    """A backend could not run a query or could not be reached.

    A ValueError, so that the CLI reports it as one line and exit status 2, like any
    other unusable input.
    """


class Backend(ABC):
    """The views of kvaudit's trace contract, queryable with kvaudit SQL."""

    dialect: ClassVar[str]
    """The SQL dialect the backend runs natively, in sqlglot's naming (`duckdb`, `clickhouse`)."""

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
    def temp_table(self, name: str, table: pa.Table) -> None:
        """Create (or replace) a temporary table `name` holding `table`, visible to later queries.

        Raises:
            BackendError: the table could not be created.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the connection; the backend is unusable afterwards."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
