"""Trace tables as hive-partitioned Parquet: written by `kvaudit ingest --parquet`, read in place.

At fleet scale the decoded tables outgrow one DuckDB file. Parquet partitioned by day
and replica (`pages/day=2026-12-02/replica=r1/part_<uuid>.parquet`) lets DuckDB skip
every file a filter on `day` or `replica` rules out, and rows sorted by replica, key
and time within each file let it skip row groups by their statistics. The directory
may be local or in object storage (s3://, gs://, https:// through DuckDB's httpfs).

Layout of a dataset root:
- `pages/` and `spans/`: partitioned by `day` (UTC date of the page or span start) and `replica`;
- `resources/` and `read_errors/`: a file per ingest (few rows);
- `files/`: how far each trace file was read, a file per ingest (see `positions`), so an
  ingest of the same trace files again appends only what is new in them;
- `kvaudit-repeats`: present once a span may be in the dataset twice (more spans were
  ingested than `span_identity` remembers): its views then keep one row per span.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Final

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from kvaudit.durations import DAY_NS
from kvaudit.read import positions
from kvaudit.read.columns import DUCKDB_TYPE, TABLES
from kvaudit.read.files import Cursors

if TYPE_CHECKING:
    from kvaudit.read.span_identity import FirstSeen
    from kvaudit.read.store import TraceStore

_NULL_PARTITION: Final = "__HIVE_DEFAULT_PARTITION__"  # how hive partitioning writes NULL
MARKER: Final = "kvaudit-parquet"  # an empty file naming a local directory as a dataset
_REPEATS: Final = "kvaudit-repeats"
# Table -> (its time column for partitioning by day or None, its sort order).
LAYOUT: Final[dict[str, tuple[str | None, str]]] = {
    "kv_pages": ("time_ns", "replica, key, time_ns"),
    "kv_spans": ("start_ns", "replica, start_ns, trace_id"),
    "kv_resources": (None, "resource_id"),
    "kv_read_errors": (None, "file, line"),
}


def is_dataset(path: str) -> bool:
    """Whether `path` names a Parquet dataset: a local directory with the marker, or a remote URL."""
    if "://" in path:
        return True
    return (Path(path) / MARKER).is_file()


def _folder(root: str, table: str) -> str:
    return f"{root.rstrip('/')}/{table.removeprefix('kv_')}"


def write(store: TraceStore, root: str) -> dict[str, int]:
    """Append the store's tables to the dataset at `root` (a local directory, created if absent).

    Returns:
        The rows written, by table.
    """
    Path(root).mkdir(parents=True, exist_ok=True)
    (Path(root) / MARKER).touch()
    written = {}
    for table, (time_column, order) in LAYOUT.items():
        folder = _folder(root, table)
        count = store.con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
        if time_column is None:
            Path(folder).mkdir(exist_ok=True)
            _write_file(store.con, f"SELECT * FROM {table} ORDER BY {order}", folder)
        elif count:
            _write_partitions(store.con, table, time_column, order, folder)
        else:
            # A partitioned write of no rows writes no file, and a glob matching none fails:
            # keep the table's schema in a file of the default (NULL) partitions.
            default = f"{folder}/day={_NULL_PARTITION}/replica={_NULL_PARTITION}"
            Path(default).mkdir(parents=True, exist_ok=True)
            _write_file(store.con, f"SELECT * EXCLUDE (replica) FROM {table}", default)
        written[table] = count
    return written


def _write_file(con: duckdb.DuckDBPyConnection, rows: str, folder: str) -> None:
    """The rows as one new file in `folder`."""
    con.execute(f"COPY ({rows}) TO '{_escape(f'{folder}/part_{uuid.uuid4()}.parquet')}' (FORMAT parquet)")


def _write_partitions(con: duckdb.DuckDBPyConnection, table: str, time_column: str, order: str, folder: str) -> None:
    """The table's rows by day and replica, one partition at a time.

    Each partition is sorted on its own: one sort of the whole table spills it whole to
    disk past DuckDB's memory limit (100M page descriptors: more than 40 GB), where one
    partition's sort holds only that partition.
    """
    day = f"strftime(make_timestamp_ns({time_column}), '%Y-%m-%d')"
    # Chosen by day number, an integer division, rather than by the day's text per row.
    number = f"{time_column} // {DAY_NS}"
    partitions = con.execute(f"SELECT DISTINCT {number}, replica FROM {table} ORDER BY ALL").fetchall()
    options = "FORMAT parquet, PARTITION_BY (day, replica), APPEND, FILENAME_PATTERN 'part_{uuid}'"
    for day_number, replica in partitions:
        rows = (
            f"SELECT *, {day} AS day FROM {table}"
            f" WHERE {number} IS NOT DISTINCT FROM $day AND replica IS NOT DISTINCT FROM $replica ORDER BY {order}"
        )
        con.execute(f"COPY ({rows}) TO '{_escape(folder)}' ({options})", {"day": day_number, "replica": replica})


def read_positions(root: str) -> Cursors:
    """How far the trace files ingested into the dataset at `root` were read (none for a new one)."""
    folder = Path(_folder(root, "files"))
    parts = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    if not parts:
        return Cursors()
    return positions.cursors_of(pa.concat_tables(pq.read_table(part).cast(positions.SCHEMA) for part in parts))


def write_positions(root: str, cursors: Cursors) -> None:
    """Add how far the trace files were read to the dataset at `root` (see `read_positions`)."""
    folder = Path(_folder(root, "files"))
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(positions.table_of(cursors), folder / f"part_{uuid.uuid4()}.parquet")


def remember_spans(root: str, identities: FirstSeen) -> None:
    """Take the spans of the dataset at `root` (if any) as read, so that an ingest adds no span twice."""
    if not is_dataset(root):
        return
    con = duckdb.connect()
    identities.remember_latest(con, f"({sources(root, con)['kv_spans']})")
    con.close()


def mark_repeats(root: str) -> None:
    """Note in the dataset at `root` that a span may be in it twice (see `span_identity`)."""
    (Path(root) / _REPEATS).touch()


def may_repeat(root: str) -> bool:
    """Whether the dataset at `root` may hold a span twice: its views then keep one row per span.

    A remote dataset is taken to.
    """
    return "://" in root or (Path(root) / _REPEATS).exists()


def sources(root: str, con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """For each table, a DuckDB query reading it from the dataset at `root` with the table's columns.

    A column the files lack (a dataset written before the column existed) reads as NULL;
    files of different ingests are matched by column name.
    """
    queries = {}
    for table, (time_column, _) in LAYOUT.items():
        schema = TABLES[table]
        pattern = _escape(
            f"{_folder(root, table)}/**/*.parquet" if time_column else f"{_folder(root, table)}/*.parquet"
        )
        # Partition values are typed here: a replica named `7` stays a string.
        hive = ", hive_partitioning = true, hive_types = {'day': DATE, 'replica': VARCHAR}" if time_column else ""
        scan = f"read_parquet('{pattern}', union_by_name = true{hive})"
        present = {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall()}
        columns = ", ".join(
            f'"{field.name}"' if field.name in present else f'CAST(NULL AS {DUCKDB_TYPE[field.type]}) AS "{field.name}"'
            for field in schema
        )
        queries[table] = f"SELECT {columns} FROM {scan}"
    return queries


def _escape(text: str) -> str:
    return text.replace("'", "''")
