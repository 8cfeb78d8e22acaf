"""Where kvaudit's views live: DuckDB over files (the default) or ClickHouse behind the Collector.

Query commands take the backend through `add_backend_option` and `open_backend`, so
each of them gets `--backend clickhouse://HOST:PORT/DB` with one line.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kvaudit.backends.base import Backend, BackendError
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.store import TraceStore, open_store

__all__ = ["Backend", "BackendError", "Source", "add_backend_option", "as_backend", "open_backend"]

Source = TraceStore | Backend
"""What the analysis functions read: a store (DuckDB) or any backend."""


def as_backend(source: Source) -> Backend:
    """The backend of a source: a store's DuckDB, or the backend itself."""
    return source if isinstance(source, Backend) else DuckDBBackend(source)


def add_backend_option(parser: argparse.ArgumentParser) -> None:
    """Add `--backend URL` to a query command's parser."""
    parser.add_argument(
        "--backend",
        metavar="URL",
        help="query ClickHouse behind the OpenTelemetry Collector (clickhouse://HOST:PORT/DB[?table=otel_traces])"
        " instead of DuckDB over the PATHs",
    )


def open_backend(url: str | None, paths: Sequence[str]) -> Backend:
    """The backend a command asked for: ClickHouse at `url`, or DuckDB over `paths`.

    Raises:
        ValueError: both or neither of `url` and `paths`, or a URL that is not ClickHouse's.
        FileNotFoundError: a path matches nothing.
        BackendError: the ClickHouse server cannot be reached.
    """
    if url is None:
        if not paths:
            raise ValueError("give trace paths, or --backend URL")
        return DuckDBBackend(open_store(paths))
    if paths:
        raise ValueError("give either trace paths or --backend URL, not both")
    from kvaudit.backends.clickhouse import connect  # its clients load only when asked for

    return connect(url)
