"""DuckDB over kvaudit trace files: the `spans`, `pages`, `replicas` and `read_errors` views.

Trace files are decoded once (see `reader`) into four tables (see `columns`), and
every query runs against views over them. The same views exist in a database written
by `kvaudit ingest` and over its Parquet (see `open`), so a query neither knows nor
cares whether it runs over files or over a materialised export. `refresh()` reads
only what was appended since the last call. Where the rows are kept is the store's
one choice: as the reader's Arrow tables (`arrow_tables`, the default: the fastest
read, for traces read once and queried a few times) or in a DuckDB database
(`database_tables`: for a store refreshed and queried live, or written to a file).

The columns of each view are in docs/design.md section 3.9 (absent attributes are NULL).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Final, Protocol

import duckdb
import pyarrow as pa

from kvaudit.errors import InternalError
from kvaudit.read import positions
from kvaudit.read.arrow_tables import ArrowTables
from kvaudit.read.columns import DUCKDB_TYPE, TABLES, Tables
from kvaudit.read.database_tables import COMMIT_ROWS, DatabaseTables
from kvaudit.read.files import Cursors, expand_paths, pending_bytes
from kvaudit.read.reader import read_files
from kvaudit.read.span_identity import FirstSeen, StoredIdentities

_VIEWS: Final = {
    "spans": """
        SELECT * EXCLUDE (attributes),
               make_timestamp_ns(start_ns) AS start_time,
               make_timestamp_ns(end_ns) AS end_time,
               (end_ns - start_ns) / 1e6 AS duration_ms,
               attributes
        FROM kv_spans""",
    "pages": "SELECT *, make_timestamp_ns(time_ns) AS time FROM kv_pages",
    "replicas": "SELECT DISTINCT * FROM kv_resources",
    "read_errors": "SELECT * FROM kv_read_errors",
}
# The views whose rows a store in a database numbers in the order it took them in (`TraceStore.row_ends`).
NUMBERED: Final = ("pages", "spans", "read_errors")
# Where a repeated span may have been let through (see `span_identity`): the views keep
# the first row of each (trace id, span id), by file and line, and that row's pages.
# Rows without ids (absent or empty) have no identity and are all kept.
_ONE_PER_IDENTITY: Final = {
    "spans": "QUALIFY coalesce(trace_id, '') = '' OR coalesce(span_id, '') = ''"
    " OR row_number() OVER (PARTITION BY trace_id, span_id ORDER BY file, line) = 1",
    "pages": "QUALIFY coalesce(trace_id, '') = '' OR coalesce(span_id, '') = ''"
    " OR dense_rank() OVER (PARTITION BY trace_id, span_id ORDER BY file, line) = 1",
}


class Rows(Protocol):
    """Where a store keeps the rows it reads: `ArrowTables` or `DatabaseTables`."""

    def batch(self) -> AbstractContextManager[None]: ...

    def append(self, tables: Mapping[str, pa.Table]) -> None: ...


# The DuckDB storage format `kvaudit ingest` writes: DuckDB's own default is its newest,
# which the DuckDB releases people have cannot open (a 2.0 file is refused by 1.5's
# command-line tool); 1.4 (DuckDB's long-term release) and every newer one read this.
INGESTED_STORAGE: Final = "v1.4.0"


class TraceStore:
    """Trace files as DuckDB views, read as they grow.

    Files are followed by identity, not name (see `files`): a file renamed by a rotation
    is read on from where it was, never again. Rows read from a file that is later
    removed stay. In a database file, how far each file was read is kept beside the
    rows (`positions`), so a store over the same files reads only what is new.

    A span read again (same trace id and span id) is dropped as it is read
    (`span_identity`): by the identities kept in the database, for a store in one.

    Args:
        paths: trace files, directories and globs (see `files.expand_paths`); new files
            matching them are picked up by `refresh()`.
        database: a DuckDB database to insert the rows into (a file, or `:memory:`); None
            holds them as Arrow (see the module's docstring).
        workers: decoding threads (default: one per CPU).
        memory_limit: bytes DuckDB may hold in memory, rows and queries (the rest of a
            database file's rows stay in it, the rest of `:memory:`'s are spilled to
            `spill`); None: DuckDB's default (most of the machine's memory).
        spill: a directory of its own for what DuckDB spills past `memory_limit` (and a live
            command's database file, `store_file`), removed by `close()`; None: DuckDB's
            default (`.tmp` beside a database file, or in the working directory).

    Raises:
        FileNotFoundError: a path matches nothing.
        duckdb.Error: the database cannot be opened.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]] = (),
        database: str | None = None,
        *,
        workers: int | None = None,
        memory_limit: int | None = None,
        spill: tempfile.TemporaryDirectory[str] | None = None,
    ) -> None:
        config = {"storage_compatibility_version": INGESTED_STORAGE}
        if memory_limit is not None:
            config["memory_limit"] = f"{memory_limit}B"
        if spill is not None:
            config["temp_directory"] = spill.name
        con = duckdb.connect(database or ":memory:", config=config)
        self._connect(con, ArrowTables(TABLES) if database is None else DatabaseTables(con))
        self.paths = [str(p) for p in paths]
        self._workers = workers
        self._kept = database not in (None, ":memory:")  # positions kept in the database
        self._spill = spill
        self.memory_limit = memory_limit
        self.cursors = Cursors()
        self.identities: FirstSeen | StoredIdentities = FirstSeen()
        self._one_per_identity = False
        if database is not None:
            stored = StoredIdentities(con)
            # A database that holds a span twice: written before its identities were kept
            # (found now), or so found then (its views say so).
            self._one_per_identity = stored.held_repeats or _views_keep_one_per_identity(con)
            self.identities = stored
        if self._kept:
            columns = ", ".join(f'"{f.name}" {DUCKDB_TYPE[f.type]}' for f in positions.SCHEMA)
            con.execute(f"CREATE TABLE IF NOT EXISTS {positions.TABLE} ({columns}, PRIMARY KEY (device, inode))")
            self.cursors = positions.cursors_of(self.arrow(f"SELECT * FROM {positions.TABLE}"))
        create_views(self.con, one_per_identity=self._one_per_identity)
        expand_paths(self.paths)  # fail early, with the path, when one names nothing

    @classmethod
    def over(cls, con: duckdb.DuckDBPyConnection) -> TraceStore:
        """A store over a connection whose `kv_*` tables and views exist already (see `open`); it reads no files."""
        store = cls.__new__(cls)
        store._connect(con, None)
        store.paths, store._workers, store._kept, store.cursors = [], None, False, Cursors()
        store.identities, store._one_per_identity = FirstSeen(), True
        store._spill, store.memory_limit = None, None
        return store

    def _connect(self, con: duckdb.DuckDBPyConnection, rows: Rows | None) -> None:
        # kvaudit SQL's `key_id(key)`: the key itself here, where hash tables take strings
        # at the speed of a hash (ClickHouse's do not: kvaudit.backends.clickhouse_translate). A
        # temporary macro, so that a database of an earlier kvaudit has it too.
        con.execute("CREATE OR REPLACE TEMP MACRO key_id(key) AS key")
        self._con = con
        self._rows = rows
        self._registered = -1  # the version of Arrow rows registered on `con`
        self._numbered: bool | None = None  # whether the `kv_*` tables are a database's (unknown: None)

    @property
    def follows_files(self) -> bool:
        """Whether `refresh()` reads trace files (not so over an ingested database or Parquet)."""
        return bool(self.paths) and self._rows is not None

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection, with the `kv_*` tables as the last refresh left them.

        With Arrow rows, the first use after a refresh ends a result of `execute()` left
        unread (see `ArrowTables.register`).
        """
        if isinstance(self._rows, ArrowTables):
            self._registered = self._rows.register(self._con, self._registered)
        return self._con

    def cursor(self) -> TraceStore:
        """The same store on a DuckDB connection of its own, for use by another thread.

        It sees what this store's refreshes add; it reads nothing itself.
        """
        other = TraceStore.over(self._con.cursor())
        other._rows = self._rows if isinstance(self._rows, ArrowTables) else None
        other.memory_limit = self.memory_limit  # the database's: a setting of all its connections
        other._one_per_identity = self._one_per_identity  # so are its views
        return other

    def refresh(
        self,
        *,
        final: bool = True,
        progress: Callable[[int], None] | None = None,
        added: Callable[[Tables], None] | None = None,
    ) -> Tables | None:
        """Read what was appended to the files since the last refresh.

        Args:
            final: also read an unterminated last line (see `reader.read_files`); never in a
                store whose positions are kept in its database: a later command would find
                the rest of that line, whole, and read it as a broken half.
            progress: called with the bytes of each decoded range.
            added: called with the rows each decoded range added, as soon as they are in
                the store (a live figure adds them up: `kvaudit exporter`); they are not
                kept for the return as well, so a refresh of any size holds one range's rows.

        Returns:
            The rows added by this refresh (a span read before is not among them); None
            where `added` took them.
        """
        if not self.paths or self._rows is None:
            return None if added else Tables.concat([])
        with self._rows.batch():
            try:
                tables = read_files(
                    expand_paths(self.paths, missing_ok=True),  # a file named may be between rotations
                    self.cursors,
                    final=final and not self._kept,
                    workers=self._workers,
                    progress=progress,
                    sink=self.append if added is None else lambda tables: _handed(added, self.append(tables)),
                )
                return None if added else tables
            finally:
                if self._kept:  # in the transaction of the rows read: both or neither
                    self._keep_positions()
                self._views_for_repeats()

    def _keep_positions(self) -> None:
        self._con.register("_positions", positions.table_of(self.cursors))
        self._con.execute(f"INSERT OR REPLACE INTO {positions.TABLE} SELECT * FROM _positions")
        self._con.unregister("_positions")

    def row_ends(self) -> dict[str, int] | None:
        """How many rows each view of `NUMBERED` holds, numbered in the order the store took them in.

        The rows of a view numbered `first` to `end - 1` are the table function
        `kvaudit_<view>_between(first, end)` on this connection (`kvaudit_pages_between`):
        a reader that saw `end` rows once finds what arrived since without a look at the rest.
        Rows are only ever added, so a number names the same row for good.

        Returns:
            View -> rows; None where rows are not numbered: held as Arrow or read in place from
            Parquet, or under views that keep one row per span identity (`create_views`).
        """
        if self._numbered is None:
            tables = {f"kv_{name}" for name in NUMBERED}
            [(found,)] = self._con.execute(
                "SELECT count(*) FROM duckdb_tables() WHERE table_name IN ?", [list(tables)]
            ).fetchall()
            self._numbered = found == len(tables)
            for name in NUMBERED if self._numbered else ():
                self._con.execute(
                    f"CREATE OR REPLACE TEMP MACRO kvaudit_{name}_between(first, last) AS TABLE"
                    f" {_VIEWS[name]} WHERE rowid >= first AND rowid < last"
                )
        if not self._numbered or self._one_per_identity:
            return None
        ends = ", ".join(f"(SELECT coalesce(max(rowid) + 1, 0) FROM kv_{name})" for name in NUMBERED)
        [row] = self._con.execute(f"SELECT {ends}").fetchall()
        return dict(zip(NUMBERED, row))

    def pending_bytes(self) -> int:
        """Bytes in the files not read yet (for progress bars)."""
        return pending_bytes(expand_paths(self.paths, missing_ok=True), self.cursors)

    def append(self, tables: Tables) -> Tables:
        """Add rows as a refresh reads them (tests and benchmarks add rows made otherwise), but
        those of spans read before (`span_identity`).

        Returns:
            The rows added.

        Raises:
            InternalError: a store over an ingested database or Parquet keeps no rows of its own.
        """
        if self._rows is None:
            raise InternalError("this store reads an ingested database or Parquet: it takes no rows")
        if isinstance(self._rows, DatabaseTables) and self._rows.uncommitted >= COMMIT_ROWS:
            # The cursors stand where the rows so far end (a range's cursor moves once its rows
            # are in), and so do the identities: committed together, before these rows' are
            # kept, what was read stays read and nothing twice.
            if self._kept:
                self._keep_positions()
            self._rows.commit()
        tables = self.identities.keep(tables)
        self._rows.append(tables.by_name())
        return tables

    def _views_for_repeats(self) -> None:
        """Views that keep one row per span identity, once rows held as Arrow may hold a repeat
        their bounded set of identities forgot (a database's store forgets none).

        The rows are asked whether they do: a look at their span ids costs one pass over them
        once a refresh ends, where the window would cost every query.
        """
        if self.identities.forgot and not self._one_per_identity and self._holds_repeats():
            self._one_per_identity = True
            create_views(self.con, one_per_identity=True)

    def _holds_repeats(self) -> bool:
        """Whether the tables hold a span identity twice."""
        [(repeats,)] = self.con.execute(
            "SELECT count(*) - count(DISTINCT (trace_id, span_id)) FROM kv_spans WHERE trace_id <> '' AND span_id <> ''"
        ).fetchall()
        return bool(repeats)

    def sql(self, query: str, params: dict[str, Any] | None = None) -> duckdb.DuckDBPyRelation | None:
        """Run a query over the views; returns its relation (None for a statement)."""
        return self.con.sql(query, params=params)

    def query(self, query: str, params: dict[str, Any] | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Column names and rows of a query."""
        cursor = self.con.execute(query, params or {})
        if cursor.description is None:
            return [], []
        return [d[0] for d in cursor.description], cursor.fetchall()

    def arrow(self, query: str, params: dict[str, Any] | None = None) -> pa.Table:
        """The rows of a query as Arrow (a relation's, not execute()'s: that would copy them once more)."""
        result = self.con.sql(query, params=params)
        return result.to_arrow_table() if hasattr(result, "to_arrow_table") else result.arrow()

    def close(self) -> None:
        self._con.close()
        if self._spill is not None:
            self._spill.cleanup()


def _handed(added: Callable[[Tables], None], tables: Tables) -> None:
    """Hand a range's rows to `added` and keep none of them for the refresh's return."""
    added(tables)


def _views_keep_one_per_identity(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the database's `spans` view, as a store over it last made it, keeps one row per identity."""
    [(found,)] = con.execute(
        "SELECT count(*) FROM duckdb_views() WHERE view_name = 'spans' AND database_name = current_database()"
        " AND sql LIKE '%QUALIFY%'"
    ).fetchall()
    return bool(found)


def create_views(con: duckdb.DuckDBPyConnection, *, one_per_identity: bool = True) -> None:
    """The views `spans`, `pages`, `replicas`, `read_errors` over the `kv_*` tables of `con`.

    Args:
        one_per_identity: the tables may hold a span twice (see `span_identity`): the
            views keep one row per span identity. False where every span was read once.
    """
    for name, body in _VIEWS.items():
        qualify = _ONE_PER_IDENTITY.get(name, "") if one_per_identity else ""
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {body} {qualify}")
