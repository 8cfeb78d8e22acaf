"""DuckDB as a kvaudit backend: a `TraceStore` over trace files, an ingested database or Parquet."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import duckdb
import pyarrow as pa

from kvaudit.backends.base import RECENT, Backend, BackendError, Params, Rows
from kvaudit.read.columns import Tables
from kvaudit.read.store import TraceStore


class DuckDBBackend(Backend):
    """kvaudit SQL run as it is written, on a store's DuckDB connection.

    Args:
        store: the store whose views the queries read; closed by `close()`.
    """

    dialect = "duckdb"

    def __init__(self, store: TraceStore) -> None:
        self.store = store
        self._set: dict[str, Any] = {}  # the variables set on the connection, and their values
        with _errors():  # kvaudit SQL's own function (see `base`), on this connection
            store.con.execute(f"CREATE OR REPLACE TEMP MACRO recent(ts, span) AS {RECENT}")

    def query(self, sql: str, params: Params | None = None) -> tuple[list[str], Rows]:
        with self._variables(params), _errors():
            return self.store.query(sql)

    def arrow(self, sql: str, params: Params | None = None) -> pa.Table:
        with self._variables(params), _errors():
            # A relation hands its rows to Arrow without the copy a cursor's result makes.
            relation = self.store.sql(sql)
            return relation.to_arrow_table() if relation is not None else pa.table({})

    def temp_view(self, name: str, sql: str) -> None:
        with _errors():
            self.store.con.execute(f"CREATE OR REPLACE TEMP VIEW {_identifier(name)} AS {sql}")

    def refresh(self, *, final: bool = True) -> Tables | None:
        return self.store.refresh(final=final) if self.store.follows_files else None

    def cursor(self) -> DuckDBBackend:
        return DuckDBBackend(self.store.cursor())

    def temp_table(self, name: str, table: pa.Table) -> None:
        con = self.store.con
        with _errors():
            con.register("_kvaudit_rows", table)
            try:
                con.execute(f"CREATE OR REPLACE TEMP TABLE {_identifier(name)} AS SELECT * FROM _kvaudit_rows")
            finally:
                con.unregister("_kvaudit_rows")

    def close(self) -> None:
        self.store.close()

    @contextmanager
    def _variables(self, params: Params | None) -> Iterator[None]:
        """The queries' `getvariable` parameters, set for one query.

        A variable keeps its value until a query without it comes (then it is reset, so
        that query reads its default): a live view repeating its queries with the same
        window sets nothing again, where setting and resetting each time cost a
        statement per variable per query.
        """
        wanted = dict(params or {})
        with _errors():
            for name in [name for name in self._set if name not in wanted]:
                self.store.con.execute(f"RESET VARIABLE {_identifier(name)}")
                del self._set[name]
            for name, value in wanted.items():
                if name not in self._set or self._set[name] != value or type(self._set[name]) is not type(value):
                    self.store.con.execute(f"SET VARIABLE {_identifier(name)} = ?", [value])
                    self._set[name] = value
        yield


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except duckdb.Error as exc:
        raise BackendError(str(exc).splitlines()[0], str(exc)) from None


def _identifier(name: str) -> str:
    if not name.isidentifier():
        raise BackendError(f"bad name {name!r}")
    return name
