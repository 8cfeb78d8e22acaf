"""Which replica produced each fetched page, kept current as pages are read.

Joining every fetch to the earliest store of its key is the costly part of the reuse
figures (a million descriptors take most of a second), and its answer for a fetch
changes only when a store of that key arrives. So the join runs once per page, on
the rows each refresh adds (`tui/ingest`), into temporary tables; the reuse query
(`tui/reuse`) reads their per-second counts. The index needs DuckDB and the rows each
refresh reads; over another backend the TUI joins each time (`tui/reuse_joined`).
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from kvaudit.analyse.named_queries import load
from kvaudit.backends import Backend
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.read.store import TraceStore

_NEW_PAGES: Final = "tui_new_pages"


def _statements(name: str) -> list[str]:
    """The statements of a named query file, in order: DuckDB binds parameters one statement at a time."""
    chunks = (
        "\n".join(line for line in chunk.splitlines() if not line.startswith("--")).strip()
        for chunk in load(name).split(";\n")
    )
    return [chunk for chunk in chunks if chunk]


_SCHEMA: Final = _statements("tui/index")
_INGEST: Final = _statements("tui/ingest")


class ProducerIndex:
    """The producer of every fetched page in a store, indexed once per page.

    Args:
        store: the store; its pages so far are indexed now, later ones through `add`.
        skew_s: clock skew allowed between replicas.
    """

    def __init__(self, store: TraceStore, *, skew_s: float) -> None:
        self._store = store
        self._skew_ns = int(skew_s * 1e9)
        for statement in _SCHEMA:
            store.con.execute(statement)
        store.con.execute(f"CREATE OR REPLACE TEMP VIEW {_NEW_PAGES} AS SELECT * FROM pages")
        self._ingest()
        store.con.execute(f"DROP VIEW {_NEW_PAGES}")

    @classmethod
    def of(cls, backend: Backend, *, skew_s: float) -> ProducerIndex | None:
        """The index of a DuckDB backend's store; None for another backend."""
        return cls(backend.store, skew_s=skew_s) if isinstance(backend, DuckDBBackend) else None

    def add(self, pages: pa.Table) -> None:
        """Index pages just read (rows of the `kv_pages` table)."""
        if not pages.num_rows:
            return
        self._store.con.register(_NEW_PAGES, pages)
        try:
            self._ingest()
        finally:
            self._store.con.unregister(_NEW_PAGES)

    def _ingest(self) -> None:
        for statement in _INGEST:
            params = {"skew_ns": self._skew_ns} if "$skew_ns" in statement else None
            self._store.con.execute(statement, params)
