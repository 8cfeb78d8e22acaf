"""DuckDB as a kvaudit backend: a `TraceStore` over trace files, an ingested database or Parquet."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
        """The queries' `getvariable` parameters, set for one query and reset after it."""
        names = list(params or {})
        with _errors():
            for name in names:
                self.store.con.execute(f"SET VARIABLE {_identifier(name)} = ?", [params[name]])  # type: ignore[index]
            try:
                yield
            finally:
                for name in names:
                    self.store.con.execute(f"RESET VARIABLE {_identifier(name)}")


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
