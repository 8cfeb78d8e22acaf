"""Where kvaudit's views live: DuckDB over files (the default) or ClickHouse behind the Collector.

Every surface reads the views through a `Backend` (see `base`): the analysis
functions take one, or a DuckDB `TraceStore`, which `as_backend` wraps. May import
the read stage (the DuckDB backend wraps its store) and the contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from kvaudit.backends.base import Backend, BackendError

if TYPE_CHECKING:
    from kvaudit.read.store import TraceStore

__all__ = ["Backend", "BackendError", "Source", "as_backend"]

Source: TypeAlias = "TraceStore | Backend"
"""What the analysis functions read: a store (DuckDB) or any backend."""


def as_backend(source: Source) -> Backend:
    """The backend of a source: a store's DuckDB, or the backend itself."""
    if isinstance(source, Backend):
        return source
    from kvaudit.backends.duckdb_backend import DuckDBBackend

    return DuckDBBackend(source)
