"""DuckDB over kvaudit trace files: the `spans`, `pages`, `replicas` and `read_errors` views.

Trace files are decoded once (see `reader`) into four tables, and every query runs
against views over them. The same views exist in a database written by `kvaudit
ingest`, so a query neither knows nor cares whether it runs over files or over a
materialised export. `refresh()` reads only what was appended since the last call.
Without a database (the default) the tables are the reader's Arrow tables, which DuckDB
scans where they lie (see `arrow_tables`): the fastest read, for traces read once and
queried a few times. In a DuckDB database (in memory or in a file) they are DuckDB
tables: slower to fill, faster to query again and again, for a store refreshed and
queried live (DuckDB keeps each row group's min and max, so a query over the last
minutes skips the rest).

Columns (absent attributes are NULL):
- `spans`: file, line, resource_id, replica, trace_id, span_id, parent_span_id, name,
  start_ns, end_ns, start_time, end_time, duration_ms, status_code, dropped_attributes,
  dropped_events, op, request_id, hook, backend, tokens_requested, tokens_hit,
  tokens_stored, tokens_local, pages, bytes, outcome, evict_reason, block_size,
  telemetry_dropped_spans, telemetry_failed_exports, telemetry_errors,
  telemetry_lost_batches, attributes (other attributes, as text).
- `pages`: file, line, resource_id, replica, trace_id, span_id, op, hook, backend,
  request_id, outcome, time_ns, time, and every page descriptor field (key,
  hash_algo, token_start, token_end, model, dtype, shape, layout, bytes, world_size,
  rank, layers, kv_heads, head_size, used, checksum, transfer, address, tier).
- `replicas`: resource_id, replica, service, pid, schema, engine, engine_version and
  the replica's own KV configuration (model, dtype, layout, block_size, world_size,
  rank, hash_algo, layers, kv_heads, head_size): one row per process.
- `read_errors`: file, line, reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import duckdb
import pyarrow as pa

from kvaudit import parquet
from kvaudit.arrow_tables import ArrowTables
from kvaudit.reader import (
    ERRORS_SCHEMA,
    PAGES_SCHEMA,
    RESOURCES_SCHEMA,
    SPANS_SCHEMA,
    Cursor,
    Tables,
    expand_paths,
    read_files,
)

# The tables under the views, in the order of the fields of `Tables`.
TABLES: Final = {
    "kv_resources": RESOURCES_SCHEMA,
    "kv_spans": SPANS_SCHEMA,
    "kv_pages": PAGES_SCHEMA,
    "kv_read_errors": ERRORS_SCHEMA,
}
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


class TraceStore:
    """Trace files (or an ingested database) as DuckDB views.

    Args:
        paths: trace files, directories and globs (see `reader.expand_paths`); new files
            matching them are picked up by `refresh()`.
        database: a DuckDB database to insert the rows into (a file, or `:memory:` for a
            live store); None holds them as Arrow (see the module's docstring).
        workers: decoding threads (default: one per CPU).

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
    ) -> None:
        held = ArrowTables(TABLES) if database is None else None
        self._init(duckdb.connect(database or ":memory:"), held, paths, workers)
        self._create()
        expand_paths(self.paths)  # fail early, with the path, when one names nothing

    def _init(
        self,
        con: duckdb.DuckDBPyConnection,
        held: ArrowTables | None,
        paths: Sequence[str | os.PathLike[str]] = (),
        workers: int | None = None,
    ) -> None:
        self.paths = [str(p) for p in paths]
        self._con = con
        self._held = held
        self._registered = -1  # the version of `held` registered on `con`
        self._workers = workers
        self._cursors: dict[str, Cursor] = {}

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection, with the `kv_*` tables as the last refresh left them.

        Without a database, the first use after a refresh ends a result of `execute()` left
        unread (see `ArrowTables.register`).
        """
        if self._held is not None:
            self._registered = self._held.register(self._con, self._registered)
        return self._con

    def cursor(self) -> TraceStore:
        """The same store on a DuckDB connection of its own, for use by another thread.

        It sees what this store's refreshes add; it reads nothing itself.
        """
        other = TraceStore.__new__(TraceStore)
        other._init(self._con.cursor(), self._held)
        return other

    @classmethod
    def open_ingested(cls, database: str) -> TraceStore:
        """A store over a database written by `kvaudit ingest` (read-only).

        Raises:
            FileNotFoundError: no such database.
            ValueError: the file is not a kvaudit database.
        """
        if not Path(database).is_file():
            raise FileNotFoundError(f"{database}: no such file")
        store = cls.__new__(cls)
        try:
            store._init(duckdb.connect(database, read_only=True), None)
            store.con.execute("SELECT count(*) FROM pages").fetchall()
        except duckdb.Error as exc:
            raise ValueError(f"{database}: not a kvaudit database ({str(exc).splitlines()[0]})") from None
        return store

    @classmethod
    def open_parquet(cls, root: str) -> TraceStore:
        """A store over a Parquet dataset written by `kvaudit ingest --parquet`, read in place.

        Raises:
            FileNotFoundError: a local root that is not such a dataset.
            duckdb.Error: a remote root that cannot be read.
        """
        if "://" not in root and not parquet.is_dataset(root):
            raise FileNotFoundError(f"{root}: not a Parquet dataset written by `kvaudit ingest --parquet`")
        store = cls.__new__(cls)
        store._init(duckdb.connect(), None)
        for name, query in parquet.sources(root, store.con).items():
            store.con.execute(f"CREATE VIEW {name} AS {query}")
        store._create()
        return store

    def _create(self) -> None:
        if self._held is None:  # held tables are registered, not created (see `con`)
            for name, schema in TABLES.items():
                self.con.register("_empty", schema.empty_table())
                # A store over Parquet (open_parquet) has views of these names already.
                self.con.execute(f"CREATE TABLE IF NOT EXISTS {name} AS SELECT * FROM _empty")
                self.con.unregister("_empty")
        for name, body in _VIEWS.items():
            self.con.execute(f"CREATE OR REPLACE VIEW {name} AS {body}")

    def refresh(self, *, final: bool = True, progress: Callable[[int], None] | None = None) -> Tables:
        """Read what was appended to the files since the last refresh.

        Args:
            final: also read an unterminated last line (see `reader.read_files`).
            progress: called with the bytes of each decoded range.

        Returns:
            The rows added by this refresh.
        """
        if not self.paths:
            return Tables.concat([])
        if self._held is not None:
            return self._read(final, progress)
        # One transaction: DuckDB merges each statement's rows into the table at its commit,
        # which costs ~4 times the insert. Committed on failure too: a range's cursor moves
        # only once its rows are in, so what was read stays read. One DuckDB thread: the
        # decoding threads keep the cores busy, and a parallel insert only adds its overhead
        # (the setting is the database's: an audit on another cursor meanwhile gets one too).
        threads = self.con.execute("SELECT current_setting('threads')").fetchone()[0]  # type: ignore[index]
        self.con.execute("SET threads = 1")
        self.con.execute("BEGIN TRANSACTION")
        try:
            return self._read(final, progress)
        finally:
            self.con.execute("COMMIT")
            self.con.execute(f"SET threads = {int(threads)}")

    def _read(self, final: bool, progress: Callable[[int], None] | None) -> Tables:
        return read_files(
            expand_paths(self.paths),
            self._cursors,
            final=final,
            workers=self._workers,
            progress=progress,
            sink=self.append,
        )

    def pending_bytes(self) -> int:
        """Bytes in the files not read yet (for progress bars)."""
        total = 0
        for path in expand_paths(self.paths):
            cursor = self._cursors.get(path)
            total += os.path.getsize(path) - (cursor.offset if cursor else 0)
        return max(total, 0)

    def append(self, tables: Tables) -> None:
        """Add rows as a refresh reads them (tests and benchmarks add rows made otherwise)."""
        by_name = dict(zip(TABLES, (tables.resources, tables.spans, tables.pages, tables.errors)))
        if self._held is not None:
            self._held.append(by_name)
            return
        for name, table in by_name.items():
            if table.num_rows:
                self.con.register("_batch", table)
                self.con.execute(f"INSERT INTO {name} SELECT * FROM _batch")
                self.con.unregister("_batch")

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


def open_store(
    paths: Sequence[str], *, progress: Callable[[int], None] | None = None, database: str | None = None
) -> TraceStore:
    """A store over trace paths (read now into `database`, see TraceStore), or over one
    database or Parquet dataset written by `kvaudit ingest`.

    Raises:
        FileNotFoundError: a path matches nothing.
        ValueError: a `.duckdb` file that is not a kvaudit database, or mixed with trace files.
    """
    if len(paths) == 1 and parquet.is_dataset(str(paths[0])):
        return TraceStore.open_parquet(str(paths[0]))
    databases = [p for p in paths if str(p).endswith(".duckdb")]
    if databases:
        if len(paths) != 1:
            raise ValueError("give either one database written by `kvaudit ingest` or trace files, not both")
        return TraceStore.open_ingested(databases[0])
    store = TraceStore(paths, database)
    store.refresh(progress=progress)
    return store
