"""The Arrow tables of an in-memory store: appended by one thread, registered per connection."""

from __future__ import annotations

import duckdb
import pyarrow as pa

from kvaudit.read.arrow_tables import MERGE_PIECES, SMALL_PIECE_ROWS, ArrowTables

SCHEMA = pa.schema([("n", pa.int64())])


def _rows(start: int, count: int) -> pa.Table:
    return pa.table({"n": pa.array(range(start, start + count), pa.int64())})


def test_small_appends_are_merged_and_large_ones_kept_as_they_are():
    held = ArrowTables({"t": SCHEMA})
    for n in range(3 * MERGE_PIECES):  # a live store: a row or so per refresh
        held.append({"t": _rows(n, 1)})
    _, tables = held.snapshot()
    assert tables["t"]["n"].to_pylist() == list(range(3 * MERGE_PIECES))
    assert tables["t"]["n"].num_chunks < MERGE_PIECES
    chunks = tables["t"]["n"].num_chunks
    big = [_rows(1000 * k, SMALL_PIECE_ROWS) for k in range(1, MERGE_PIECES + 2)]
    for table in big:  # a whole file read: its ranges are not copied again
        held.append({"t": table})
    _, tables = held.snapshot()
    assert tables["t"]["n"].num_chunks == chunks + len(big)
    last = tables["t"]["n"].chunks[-1].buffers()[1]
    assert last.address == big[-1]["n"].chunks[0].buffers()[1].address  # the same memory, not a copy
    assert tables["t"].num_rows == 3 * MERGE_PIECES + len(big) * SMALL_PIECE_ROWS


def test_each_connection_registers_the_tables_as_they_are_when_it_is_used():
    held = ArrowTables({"t": SCHEMA})
    con = duckdb.connect()
    cursor = con.cursor()
    at_con, at_cursor = held.register(con, -1), held.register(cursor, -1)
    con.execute("CREATE VIEW v AS SELECT * FROM t")  # views bind to each connection's own `t`
    held.append({"t": _rows(0, 3)})
    assert cursor.execute("SELECT count(*) FROM v").fetchone() == (0,)  # not registered again yet
    at_cursor = held.register(cursor, at_cursor)
    assert cursor.execute("SELECT count(*) FROM v").fetchone() == (3,)
    assert con.execute("SELECT count(*) FROM v").fetchone() == (0,)
    assert held.register(con, at_con) == at_cursor
    assert con.execute("SELECT sum(n) FROM v").fetchone() == (3,)
    assert held.register(cursor, at_cursor) == at_cursor  # nothing new: nothing done
