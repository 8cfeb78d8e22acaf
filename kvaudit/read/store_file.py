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
  history reads back that much less. A process killed outright (SIGKILL, the OOM killer)
  cannot remove its directory: each holds a lock on a file in it for as long as it lives
  (`flock`, which the kernel lets go when the process ends, however it ends), and the next
  live command removes the directories whose lock nobody holds any more.

Either way DuckDB holds at most `MEMORY_BYTES` in memory, and a refresh commits as it goes
(`database_tables.COMMIT_ROWS`): a read of any length takes the same memory
(docs/operations.md, "Memory"). One process holds a store file at a time (DuckDB's lock):
another given the same file is refused, naming the process that holds it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import duckdb

from kvaudit.errors import InputError, user_files
from kvaudit.read.store import TraceStore

# What DuckDB may hold in memory of such a store (its buffer pool: rows, and what a query
# works on; past it, rows stay in the file or are spilled, and so is what a query works on).
# Sized for the queries over the whole history (the exporter's reuse left, the audit), whose
# joins and windows DuckDB cannot always spill: with too little they fail, not slow down.
MEMORY_BYTES: Final = 1 << 30
_PREFIX: Final = "kvaudit-store-"
_OWNER: Final = "owner.lock"  # locked by the process the directory is of, while it lives

logger = logging.getLogger(__name__)


def open_bounded_store(paths: Sequence[str], database: str | None, *, workers: int | None = None) -> TraceStore:
    """A store over trace paths in `database` (a `.duckdb` file, made if absent), or in a temporary
    directory's where `database` is None (a live command's); nothing read yet (see `TraceStore.refresh`).

    Raises:
        InputError: the file is held by another process, or is no DuckDB database.
        FileNotFoundError: a path matches nothing.
    """
    if database is None:
        _remove_orphans()
        spill = _LiveDirectory()
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


class _LiveDirectory(tempfile.TemporaryDirectory[str]):
    """A temporary directory of this process's, its owner file locked until it is removed."""

    def __init__(self) -> None:
        super().__init__(prefix=_PREFIX)
        # Locked under another name, then renamed: another process never sees the owner file unlocked.
        locking = os.path.join(self.name, f"{_OWNER}.new")
        self._owner = os.open(locking, os.O_CREAT | os.O_WRONLY, 0o600)  # the lock lasts while it is open
        fcntl.flock(self._owner, fcntl.LOCK_EX)
        os.rename(locking, os.path.join(self.name, _OWNER))

    def cleanup(self) -> None:
        super().cleanup()
        if self._owner >= 0:
            os.close(self._owner)
            self._owner = -1


def _remove_orphans() -> None:
    """Remove the live directories beside ours whose process ended without removing them."""
    for directory in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            owner = os.open(directory / _OWNER, os.O_RDONLY)
        except OSError:  # not one of ours, or its owner file not made yet: left as it is
            continue
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its process lives
            continue
        finally:
            os.close(owner)
        shutil.rmtree(directory, ignore_errors=True)
        logger.info("removed %s, left by a live command that ended without removing it", directory)


def warn_unterminated(store: TraceStore, command: str) -> None:
    """Name on stderr each file whose last line is not whole yet: a store file reads it once it is."""
    for cursor in store.cursors.files.values():
        if not cursor.whole and cursor.not_json is None and cursor.size:  # an empty file holds no line
            print(
                f"kvaudit {command}: {cursor.path} ends in an unterminated line: left for the next read",
                file=sys.stderr,
            )
