"""Opening what a user names: trace files, a database written by `kvaudit ingest`, or its Parquet dataset.

Each becomes a `TraceStore` with the same views, so every command takes any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import duckdb

from kvaudit.errors import BadValueError, InputError
from kvaudit.read import parquet
from kvaudit.read.store import TraceStore, create_views


def open_store(
    paths: Sequence[str], *, progress: Callable[[int], None] | None = None, database: str | None = None
) -> TraceStore:
    """A store over trace paths (read now into `database`, see TraceStore), or over one
    database or Parquet dataset written by `kvaudit ingest`.

    Raises:
        FileNotFoundError: a path matches nothing.
        BadValueError: a `.duckdb` file mixed with trace files.
        InputError: a `.duckdb` file that is not a kvaudit database, a Parquet dataset that cannot be read.
    """
    if len(paths) == 1 and parquet.is_dataset(str(paths[0])):
        return open_parquet(str(paths[0]))
    if not is_trace_files(paths):
        if len(paths) != 1:
            raise BadValueError("give either one database written by `kvaudit ingest` or trace files, not both")
        return open_ingested(str(paths[0]))
    store = TraceStore(paths, database)
    store.refresh(progress=progress)
    return store


def is_trace_files(paths: Sequence[str]) -> bool:
    """Whether `paths` name trace files (not a database or Parquet dataset written by `kvaudit ingest`)."""
    if len(paths) == 1 and parquet.is_dataset(str(paths[0])):
        return False
    return not any(str(p).endswith(".duckdb") for p in paths)


def open_ingested(database: str) -> TraceStore:
    """A store over a database written by `kvaudit ingest` (read-only; its views are in it).

    Raises:
        FileNotFoundError: no such database.
        InputError: the file is not a kvaudit database.
    """
    if not Path(database).is_file():
        raise FileNotFoundError(f"{database}: no such file")
    try:
        store = TraceStore.over(duckdb.connect(database, read_only=True))
        store.query("SELECT count(*) FROM pages")
    except duckdb.Error as exc:
        raise InputError(f"{database}: not a kvaudit database ({str(exc).splitlines()[0]})") from None
    return store


def open_parquet(root: str) -> TraceStore:
    """A store over a Parquet dataset written by `kvaudit ingest --parquet`, read in place.

    Raises:
        FileNotFoundError: a local root that is not such a dataset.
        InputError: a remote root that cannot be read.
    """
    if "://" not in root and not parquet.is_dataset(root):
        raise FileNotFoundError(f"{root}: not a Parquet dataset written by `kvaudit ingest --parquet`")
    con = duckdb.connect()
    try:
        for name, query in parquet.sources(root, con).items():
            con.execute(f"CREATE VIEW {name} AS {query}")
    except duckdb.Error as exc:
        raise InputError(f"{root}: {str(exc).splitlines()[0]}") from None
    create_views(con, one_per_identity=parquet.may_repeat(root))
    return TraceStore.over(con)
