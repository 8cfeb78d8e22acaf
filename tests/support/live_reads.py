"""Reading growing and rotated files as the live commands do (`kvaudit exporter`, `alerts watch`, `tui`).

A live store is refreshed with `final=False`: an unterminated last line waits for its writer.
"""

from __future__ import annotations

from pathlib import Path

from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.read.store import TraceStore


def live(paths: list[Path | str]) -> DuckDBBackend:
    """A backend over a store that follows `paths` (files, directories, globs)."""
    return DuckDBBackend(TraceStore(paths, ":memory:"))


def counts(backend: DuckDBBackend) -> tuple[int, int]:
    """After a refresh: pages read, and distinct requests among them (each good line is one request)."""
    backend.refresh(final=False)
    return backend.query("SELECT count(*), count(DISTINCT request_id) FROM pages")[1][0]


def append(path: Path, lines: list[bytes]) -> None:
    """Append `lines` to `path`, as a writer does."""
    with path.open("ab") as f:
        f.write(b"".join(lines))
