"""DuckDB as a kvaudit backend: a `TraceStore` over trace files, an ingested database or Parquet.

The sandbox (`sandboxed`, what alert rules run in): before the first such query the
database is sealed. DuckDB's `enable_external_access = false` leaves it no files (but
the `readable` directories: a Parquet dataset read in place), no network, no
extensions beyond those already loaded and no Python objects; `lock_configuration`
keeps it so (only `threads` may still change: a live store's inserts set it). Both are
settings of the whole database, so every connection to it is sealed alike, for the rest
of its life: kvaudit's own reads need neither, since trace files are decoded by Python
and handed over as Arrow tables, which DuckDB still scans. The query itself must be
one query, checked by DuckDB's parser, is interrupted (`interrupt()`, from a timer
thread) at its time limit, and runs under a memory limit and a spill limit set before
it (`memory_limit`, `max_temp_directory_size`; DuckDB's defaults are put back after).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import duckdb
import pyarrow as pa

from kvaudit.backends.base import (
    RECENT,
    RULE_MEMORY_BYTES,
    RULE_SPILL_BYTES,
    Backend,
    BackendError,
    Params,
    QueryTimeoutError,
    Rows,
    one_query,
)
from kvaudit.backends.ctrl_c import ctrl_c_interrupts
from kvaudit.read.columns import Tables
from kvaudit.read.store import TraceStore, create_views

# Settings a sealed database may still change: a live store's inserts run on one thread;
# the sandbox bounds each rule's memory and spill, and gives the rest of kvaudit its own back.
_RULE_LIMITS: Final = ("memory_limit", "max_temp_directory_size")
_UNLOCKED: Final = ("threads", *_RULE_LIMITS)


class DuckDBBackend(Backend):
    """kvaudit SQL run as it is written, on a store's DuckDB connection.

    Args:
        store: the store whose views the queries read; closed by `close()`.
        readable: directories a sealed database may still read (see the module's docstring):
            those of a Parquet dataset its views read in place.
    """

    dialect = "duckdb"

    def __init__(self, store: TraceStore, *, readable: Sequence[str] = ()) -> None:
        self.store = store
        self.readable = tuple(readable)
        self._set: dict[str, Any] = {}  # the variables set on the connection, and their values
        with _errors():  # kvaudit SQL's own function (see `base`), on this connection
            store.con.execute(f"CREATE OR REPLACE TEMP MACRO recent(ts, span) AS {RECENT}")

    def query(self, sql: str, params: Params | None = None) -> tuple[list[str], Rows]:
        with self._variables(params), _errors(), ctrl_c_interrupts(self.store.con):
            return self.store.query(sql)

    def arrow(self, sql: str, params: Params | None = None) -> pa.Table:
        with self._variables(params), _errors(), ctrl_c_interrupts(self.store.con):
            # A relation hands its rows to Arrow without the copy a cursor's result makes.
            relation = self.store.sql(sql)
            return relation.to_arrow_table() if relation is not None else pa.table({})

    def sandboxed(self, sql: str, *, timeout_s: float, max_rows: int) -> pa.Table:
        query = one_query(sql)
        self.seal()
        interrupted = threading.Event()
        try:
            with (
                self._variables(None),
                _errors(),
                ctrl_c_interrupts(self.store.con),
                _rule_limits(self.store.con, self.store.memory_limit),
                _interrupt_after(self.store.con, timeout_s, interrupted),
            ):
                return self.store.sql(query).limit(max_rows).to_arrow_table()
        except BackendError:
            if interrupted.is_set():
                raise QueryTimeoutError(f"stopped after {timeout_s:g}s (the time limit)") from None
            raise

    def seal(self) -> None:
        """Take the database's access to files, the network, extensions and settings away, for good."""
        con = self.store.con
        with _errors():
            [(locked,)] = con.execute("SELECT current_setting('lock_configuration')").fetchall()
            if locked:
                return  # sealed before, by this backend or another connection to the database
            if self.readable:
                directories = ", ".join(_literal(p if "://" in p else str(Path(p).resolve())) for p in self.readable)
                con.execute(f"SET allowed_directories = [{directories}]")
            con.execute(f"SET allowed_configs = [{', '.join(map(_literal, _UNLOCKED))}]")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")

    def temp_view(self, name: str, sql: str) -> None:
        with _errors():
            self.store.con.execute(f"CREATE OR REPLACE TEMP VIEW {_identifier(name)} AS {sql}")

    def refresh(
        self,
        *,
        final: bool = True,
        added: Callable[[Tables], None] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> Tables | None:
        if not self.follows_files:
            return None
        with _errors():  # DuckDB's own, such as a disk too full to spill to past the store's memory
            return self.store.refresh(final=final, added=added, progress=progress)

    @property
    def follows_files(self) -> bool:
        return self.store.follows_files

    def behind_bytes(self) -> int:
        return self.store.pending_bytes() if self.follows_files else 0

    def repeated_spans(self) -> int:
        return self.store.identities.repeats

    def row_ends(self) -> dict[str, int] | None:
        with _errors():
            return self.store.row_ends()

    def cursor(self) -> DuckDBBackend:
        return DuckDBBackend(self.store.cursor(), readable=self.readable)

    def temp_table(self, name: str, table: pa.Table) -> None:
        con = self.store.con
        with _errors():
            con.register("_kvaudit_rows", table)
            try:
                con.execute(f"CREATE OR REPLACE TEMP TABLE {_identifier(name)} AS SELECT * FROM _kvaudit_rows")
            finally:
                con.unregister("_kvaudit_rows")

    def interrupt(self) -> None:
        self.store.con.interrupt()

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
def _rule_limits(con: duckdb.DuckDBPyConnection, memory_limit: int | None) -> Iterator[None]:
    """A rule's memory and spill limits for the query in the block; after it, DuckDB's defaults,
    or the store's own memory budget (`memory_limit`, see `kvaudit.read.store_file`).

    The spill is what the rule may add to what is spilled already: a live store's rows past
    its budget are spilled to the same directory, and a limit below them fails every rule.
    """
    [(spilled,)] = con.execute("SELECT coalesce(sum(size), 0) FROM duckdb_temporary_files()").fetchall()
    limits = dict(zip(_RULE_LIMITS, (RULE_MEMORY_BYTES, int(spilled) + RULE_SPILL_BYTES), strict=True))
    for name, value in limits.items():
        con.execute(f"SET {name} = '{value}B'")
    try:
        yield
    finally:
        for name in _RULE_LIMITS:
            con.execute(f"RESET {name}")
        if memory_limit is not None:
            con.execute(f"SET memory_limit = '{int(memory_limit)}B'")


@contextmanager
def _interrupt_after(con: duckdb.DuckDBPyConnection, seconds: float, interrupted: threading.Event) -> Iterator[None]:
    """Interrupt the query `con` runs in the block once it has run `seconds`, and set `interrupted`."""
    lock = threading.Lock()
    running = [True]

    def stop() -> None:
        with lock:  # never after the block ended: the interrupt would hit the next query
            if running[0]:
                interrupted.set()
                con.interrupt()

    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            running[0] = False
        timer.cancel()


class ReadRows:
    """The views over the rows one read added (`TraceStore.refresh`), alone, on a connection of
    their own: what arrived, figured by the same SQL that figures a whole history."""

    def __init__(self) -> None:
        self._con = duckdb.connect()
        self._con.execute("SET threads = 1")  # a read's rows are few; the reader has the cores
        self._made = False

    def query(self, added: Tables, sql: str) -> Rows:
        """The rows of `sql` over the views of `added` only."""
        for name, table in added.by_name().items():
            self._con.register(name, table)
        if not self._made:
            create_views(self._con, one_per_identity=False)  # a span read twice was dropped as read
            self._made = True
        with _errors():
            return self._con.execute(sql).fetchall()

    def close(self) -> None:
        self._con.close()


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except duckdb.Error as exc:
        raise BackendError(str(exc).splitlines()[0], str(exc)) from None
    except RuntimeError as exc:
        # Ctrl-C where DuckDB looks for it (see `ctrl_c` for the rest of a query): it stops the
        # query and raises this in place of KeyboardInterrupt; the command ends as on any Ctrl-C.
        if str(exc) == "Query interrupted":
            raise KeyboardInterrupt from None
        raise


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _identifier(name: str) -> str:
    if not name.isidentifier():
        raise BackendError(f"bad name {name!r}")
    return name
