"""How far each file was read, as rows kept beside what was read from it.

`kvaudit ingest` keeps them in its database (`kv_files`) or Parquet dataset (`files/`),
so an ingest of the same files again reads only what was appended to them since: a file
is known by its identity (device, inode) and checked by its first bytes (see `files`).
"""

from __future__ import annotations

import time
from typing import Final

import pyarrow as pa

from kvaudit.read.files import Cursor, Cursors

TABLE: Final = "kv_files"
SCHEMA: Final = pa.schema(
    [
        ("device", pa.uint64()),
        ("inode", pa.uint64()),
        ("path", pa.string()),
        ("offset", pa.int64()),
        ("next_line", pa.int64()),
        ("fingerprint", pa.binary()),
        ("compression", pa.string()),
        ("document", pa.bool_()),
        ("size", pa.int64()),
        ("ctime_ns", pa.int64()),
        ("whole", pa.bool_()),
        ("not_json", pa.string()),
        ("read_at_ns", pa.int64()),  # when this position was reached: the latest row of a file wins
    ]
)
_FIELDS: Final = SCHEMA.names[2:-1]  # the fields of Cursor, in the table's order


def table_of(cursors: Cursors) -> pa.Table:
    """The cursors as rows of `SCHEMA`."""
    now = time.time_ns()
    rows = [
        [device, inode, *(getattr(cursor, name) for name in _FIELDS), now]
        for (device, inode), cursor in cursors.files.items()
    ]
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, row)) for row in rows], schema=SCHEMA)


def cursors_of(table: pa.Table) -> Cursors:
    """The cursors kept in rows of `SCHEMA` (for a file with several rows, the latest)."""
    cursors = Cursors()
    for row in table.sort_by("read_at_ns").to_pylist():
        cursors.files[(row["device"], row["inode"])] = Cursor(**{name: row[name] for name in _FIELDS})
    return cursors
