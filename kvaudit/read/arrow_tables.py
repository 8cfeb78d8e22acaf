"""The `kv_*` tables of a store without a database, held as Arrow and shared by its DuckDB connections.

A store over trace files read in place has nothing to persist, so it keeps the Arrow
tables the reader decoded and DuckDB scans them where they lie: inserting the same
rows into DuckDB tables had cost about a third of a read's CPU. DuckDB sees Arrow data
through objects registered on one connection, so each connection (the store's own and
its cursors') registers the latest tables itself, in the thread that uses it, before it
runs a query (`ArrowTables.register`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final

import duckdb
import pyarrow as pa

# A store refreshed as its files grow appends a few rows each time, and DuckDB scans many
# tiny Arrow chunks slowly: pieces of fewer rows than this are merged, this many at a
# time (a row is so copied a few times at most). Larger pieces, as a read of a whole
# file makes, stay as they are.
SMALL_PIECE_ROWS: Final = 8192
MERGE_PIECES: Final = 16


class ArrowTables:
    """Arrow tables by name, appended to by one thread and registered by any.

    Args:
        schemas: each table's name and schema.
    """

    def __init__(self, schemas: Mapping[str, pa.Schema]) -> None:
        self._schemas = dict(schemas)
        self._pieces: dict[str, list[pa.Table]] = {name: [] for name in schemas}
        self._lock = threading.Lock()
        self._version = 0
        self._tables: dict[str, pa.Table] | None = None  # the pieces concatenated, once asked for

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One refresh's appends: each is visible as soon as it is made, so there is nothing to group."""
        yield

    def append(self, tables: Mapping[str, pa.Table]) -> None:
        """Add rows to the named tables (each with its table's schema)."""
        with self._lock:
            for name, table in tables.items():
                if table.num_rows:
                    pieces = self._pieces[name]
                    pieces.append(table)
                    _merge_small(pieces)
            self._version += 1
            self._tables = None

    def register(self, con: duckdb.DuckDBPyConnection, version: int) -> int:
        """Register the tables as they are now on `con`, unless `version` is already theirs.

        Args:
            con: a connection used by the calling thread only. A result of its last
                `execute()` that is not read to its end is ended first.
            version: what the last call for `con` returned (-1 the first time).

        Returns:
            The version now registered on `con`.
        """
        if version == self._version:  # an int read: a refresh racing it is seen next time
            return version
        version, tables = self.snapshot()
        # DuckDB 2 registers nothing on a connection with a result of execute() left unread;
        # ending it is what the next statement would do. (DuckDB 1 neither needs nor has it.)
        if hasattr(con, "complete"):
            con.complete()
        for name, table in tables.items():
            con.register(name, table)
        return version

    def snapshot(self) -> tuple[int, dict[str, pa.Table]]:
        """The version and the tables as they are now (unchanged by later appends)."""
        with self._lock:
            if self._tables is None:
                self._tables = {
                    name: pa.concat_tables(pieces) if pieces else self._schemas[name].empty_table()
                    for name, pieces in self._pieces.items()
                }
            return self._version, self._tables


def _merge_small(pieces: list[pa.Table]) -> None:
    """Merge the small pieces at the end of `pieces` into one, once there are MERGE_PIECES of them."""
    small = 0
    while small < len(pieces) and pieces[-1 - small].num_rows < SMALL_PIECE_ROWS:
        small += 1
    if small >= MERGE_PIECES:
        merged = pa.concat_tables(pieces[-small:]).combine_chunks()
        del pieces[-small:]
        pieces.append(merged)
