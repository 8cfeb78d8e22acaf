"""Stores whose memory does not grow with the history they read.

A store in memory grows with the history it reads, and a command over trace files reads
them whole every time. The stores here do neither:

- **`--store FILE`** (every command over trace files): the rows read are kept in a DuckDB
  database file with how far each file was read (`kvaudit.read.positions`, as `kvaudit
  ingest` keeps them), so the next command given FILE reads only what was appended since.
  `explain` over a fleet's directory then costs what arrived since the last look, not the
  history (docs/design.md section 3.9).
- **A live command given none** (`exporter`, `alerts watch`, the TUI) keeps its rows in
  a database file of a temporary directory of its own (with what DuckDB spills), removed
  when it ends. A file, not DuckDB's memory: DuckDB compresses the row groups of a file and
  not those in memory, so the rows take a fraction of the disk, and every look at the
  history reads back that much less.

Either way DuckDB holds at most `MEMORY_BYTES` in memory, and a refresh commits as it goes
(`database_tables.COMMIT_ROWS`): a read of any length takes the same memory
(docs/operations.md, "Memory"). One process holds a store file at a time (DuckDB's lock):
another given the same file is refused, naming the process that holds it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Final

import duckdb

from kvaudit.errors import InputError, user_files
from kvaudit.read.store import TraceStore

# What DuckDB may hold in memory of such a store (its buffer pool: rows, and what a query
# works on; past it, rows stay in the file or are spilled, and so is what a query works on).
# Sized for the queries over the whole history (the exporter's reuse left, the audit), whose
# joins and windows DuckDB cannot always spill: with too little they fail, not slow down.
MEMORY_BYTES: Final = 1 << 30


def open_bounded_store(paths: Sequence[str], database: str | None, *, workers: int | None = None) -> TraceStore:
    """A store over trace paths in `database` (a `.duckdb` file, made if absent), or in a temporary
    directory's where `database` is None (a live command's); nothing read yet (see `TraceStore.refresh`).

    Raises:
        InputError: the file is held by another process, or is no DuckDB database.
        FileNotFoundError: a path matches nothing.
    """
    if database is None:
        spill = tempfile.TemporaryDirectory(prefix="kvaudit-store-")
        try:
            try:
                live = os.path.join(spill.name, "live.duckdb")
                return TraceStore(paths, live, workers=workers, memory_limit=MEMORY_BYTES, spill=spill)
            except duckdb.IOException:  # a disk too full for the file: the rows in memory, while it holds them
                return TraceStore(paths, ":memory:", workers=workers, memory_limit=MEMORY_BYTES, spill=spill)
        except BaseException:
            spill.cleanup()
            raise
    with user_files():
        try:
            return TraceStore(paths, database, workers=workers, memory_limit=MEMORY_BYTES)
        except duckdb.Error as exc:  # held by another process ("Conflicting lock ... (PID n)"), or not DuckDB's
            raise InputError(f"{database}: {str(exc).splitlines()[0]}") from None


def warn_unterminated(store: TraceStore, command: str) -> None:
    """Name on stderr each file whose last line is not whole yet: a store file reads it once it is."""
    for cursor in store.cursors.files.values():
        if not cursor.whole and cursor.not_json is None and cursor.size:  # an empty file holds no line
            print(
                f"kvaudit {command}: {cursor.path} ends in an unterminated line: left for the next read",
                file=sys.stderr,
            )
