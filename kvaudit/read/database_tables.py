"""The `kv_*` tables of a store in a DuckDB database (in memory or a file): rows inserted as they are read.

Slower to fill than Arrow held in place (`arrow_tables`), faster to query again and
again: DuckDB keeps each row group's min and max, so a live store's query over the
last minutes skips the rest, and `kvaudit ingest` writes a file to query many times.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final

import duckdb
import pyarrow as pa

from kvaudit.read.columns import TABLES

# Rows a transaction takes before it is committed: DuckDB holds a transaction's rows in
# memory until its commit, so a refresh of a long history commits as it goes, to read
# any history in the same memory.
COMMIT_ROWS: Final = 262_144


class DatabaseTables:
    """Inserts rows into the `kv_*` tables of `con`'s database, creating them if absent."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con
        self.uncommitted = 0  # rows inserted since the last commit
        for name, schema in TABLES.items():
            con.register("_empty", schema.empty_table())
            con.execute(f"CREATE TABLE IF NOT EXISTS {name} AS SELECT * FROM _empty")
            con.unregister("_empty")

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One refresh's inserts as one transaction, with one DuckDB thread.

        DuckDB merges each statement's rows into the table at its commit, which costs ~4
        times the insert. Committed on failure too: a range's cursor moves only once its
        rows are in, so what was read stays read. One thread: the decoding threads keep
        the cores busy, and a parallel insert only adds its overhead (the setting is the
        database's: an audit on another cursor meanwhile gets one too).
        """
        threads = self._con.execute("SELECT current_setting('threads')").fetchone()[0]  # type: ignore[index]
        self._con.execute("SET threads = 1")
        self._con.execute("BEGIN TRANSACTION")
        try:
            yield
        finally:
            self._con.execute("COMMIT")
            self._con.execute(f"SET threads = {int(threads)}")

    def append(self, tables: Mapping[str, pa.Table]) -> None:
        for name, table in tables.items():
            if table.num_rows:
                self._con.register("_batch", table)
                self._con.execute(f"INSERT INTO {name} SELECT * FROM _batch")
                self._con.unregister("_batch")
                self.uncommitted += table.num_rows

    def commit(self) -> None:
        """Commit the batch's rows so far and go on in a new transaction (see `COMMIT_ROWS`)."""
        self._con.execute("COMMIT")
        self._con.execute("BEGIN TRANSACTION")
        self.uncommitted = 0
