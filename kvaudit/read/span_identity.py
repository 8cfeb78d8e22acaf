"""One row per span identity: a span read again (an OTLP retry, a file collected twice) is dropped.

An OTLP exporter retries a batch whose response it did not see, so after a receiver
restart the same span can be on disk twice, every copy acknowledged; a trace file
copied into a collected directory twice holds every span twice. A span is identified
by its trace id and span id (OTLP's own identity), so a store keeps the first row read
of each (trace id, span id) and the page rows of that first row, and drops the others
as it reads them (`FirstSeen`).

A store in a DuckDB database (a live command's, `--store`, `kvaudit ingest -o`) keeps
every identity it holds in the database beside its rows (`StoredIdentities`, 16 bytes a
span, under the database's memory budget): it never forgets one, so its views never
need to look for repeats, and a query over the last minutes reads the last minutes.

Rows held as Arrow (a one-shot read) keep a bounded set instead (`FirstSeen`:
`REMEMBERED` identities, the most recent first kept): a retry arrives within seconds of
its first copy, while a copy read after more spans than that is let through. Once the
set has forgotten an identity the store can no longer tell, and if its rows then hold a
repeat, its views keep one row per identity at query time (`kvaudit.read.store.create_views`),
which costs every query a window over its rows: that is why the views do it only then.

Spans without a trace id or span id (absent or empty) have no identity: they are always kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from typing import Final

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from kvaudit.read.columns import Tables

# Identities kept (a hash each, in a set and a queue; their memory is in docs/design.md section
# 3.1): a fleet emits far fewer spans than this in the minutes an OTLP retry can take.
REMEMBERED: Final = 262_144


class FirstSeen:
    """The span identities read last, to drop the rows of a span read again.

    Args:
        capacity: how many identities are kept (the oldest are forgotten first); default `REMEMBERED`.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = REMEMBERED if capacity is None else capacity
        self._seen: set[int] = set()
        self._order: deque[int] = deque()
        self.repeats = 0  # span rows dropped so far
        self.forgot = False  # an identity was forgotten: a repeat may have been let through

    def remember(self, identities: Iterable[tuple[str | None, str | None]]) -> None:
        """Take identities read before (a database's spans, oldest first) as seen."""
        for trace_id, span_id in identities:
            if trace_id and span_id:
                self._add(hash((trace_id, span_id)))

    def remember_latest(self, con: duckdb.DuckDBPyConnection, spans: str) -> None:
        """Take the most recent spans of `spans` (a table, or a query in parentheses, on `con`) as
        read: a database or dataset written before (so a file collected again adds no row)."""
        cursor = con.execute(
            f"SELECT trace_id, span_id FROM (SELECT trace_id, span_id, start_ns FROM {spans}"
            " WHERE trace_id <> '' AND span_id <> '' ORDER BY start_ns DESC LIMIT $n) ORDER BY start_ns",
            {"n": self.capacity + 1},
        )
        identities = cursor.fetchall()
        if len(identities) > self.capacity:  # older spans are not remembered
            self.forgot = True
            identities = identities[1:]
        self.remember(identities)

    def keep(self, tables: Tables) -> Tables:
        """The tables without the span rows whose identity was seen before, nor those spans' page rows."""
        spans = tables.spans
        if not spans.num_rows:
            return tables
        trace_ids = spans.column("trace_id").to_pylist()
        span_ids = spans.column("span_id").to_pylist()
        dropped: list[int] = []
        for row, (trace_id, span_id) in enumerate(zip(trace_ids, span_ids)):
            if not trace_id or not span_id:
                continue
            identity = hash((trace_id, span_id))
            if identity in self._seen:
                dropped.append(row)
            else:
                self._add(identity)
        if not dropped:
            return tables
        self.repeats += len(dropped)
        return replace(tables, spans=_without(spans, dropped), pages=_pages_without(tables, dropped))

    def _add(self, identity: int) -> None:
        if identity in self._seen:
            return
        self._seen.add(identity)
        self._order.append(identity)
        if len(self._order) > self.capacity:
            self._seen.discard(self._order.popleft())
            self.forgot = True


def _without(table: pa.Table, rows: list[int]) -> pa.Table:
    mask = [True] * table.num_rows
    for row in rows:
        mask[row] = False
    return table.filter(pa.array(mask))


def _pages_without(tables: Tables, dropped: list[int]) -> pa.Table:
    """The page rows but those of the dropped span rows (a page row names its span's line and ids)."""
    pages = tables.pages
    if not pages.num_rows:
        return pages
    head = ("file", "line", "trace_id", "span_id")
    spans = tables.spans.select(head).take(pa.array(dropped, pa.int64()))
    gone = set(zip(*(spans.column(name).to_pylist() for name in head)))
    # Only pages whose span ids are among the dropped ones need the closer look.
    candidates = pc.is_in(pages.column("span_id"), value_set=spans.column("span_id")).to_pylist()
    rows = [row for row, maybe in enumerate(candidates) if maybe]
    if not rows:
        return pages
    looked = pages.select(head).take(pa.array(rows, pa.int64()))
    keys = zip(*(looked.column(name).to_pylist() for name in head))
    return _without(pages, [row for row, key in zip(rows, keys) if key in gone])


class StoredIdentities:
    """Every span identity a store in a DuckDB database holds, in the database (`TABLE`): exact
    whatever the history. A read's identities are looked up by a join whose build side is
    the read's (a scan of 16 bytes a span held), in the transaction of its rows.

    A database written before its identities were kept gets them from its spans when first
    opened so; `held_repeats` then says whether it holds a span twice.
    """

    TABLE: Final = "kv_span_ids"

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con
        self.repeats = 0  # span rows dropped so far
        self.forgot = False  # never: every identity is kept
        self.held_repeats = False
        [(exists,)] = con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = $name AND database_name = current_database()",
            {"name": self.TABLE},
        ).fetchall()
        if not exists:
            con.execute(f"CREATE TABLE {self.TABLE} AS SELECT {_IDENTITY} AS id FROM kv_spans WHERE {_HAS_IDENTITY}")
            [(repeats,)] = con.execute(f"SELECT count(*) - count(DISTINCT id) FROM {self.TABLE}").fetchall()
            if repeats:
                self.held_repeats = True
                con.execute(f"CREATE OR REPLACE TABLE {self.TABLE} AS SELECT DISTINCT id FROM {self.TABLE}")

    def keep(self, tables: Tables) -> Tables:
        """The tables without the span rows whose identity is held or came earlier in them, nor
        those spans' page rows; the identities of the rest are kept."""
        spans = tables.spans
        if not spans.num_rows:
            return tables
        rows = pa.table(
            {
                "row": pa.array(range(spans.num_rows), pa.int64()),
                "trace_id": spans.column("trace_id"),
                "span_id": spans.column("span_id"),
            }
        )
        con = self._con
        con.register("_kvaudit_read", rows)
        try:
            con.execute(f"CREATE OR REPLACE TEMP TABLE _kvaudit_read_ids AS {_READ_IDS}")
            dropped = [row for (row,) in con.execute(_REPEATED).fetchall()]
            con.execute(f"INSERT INTO {self.TABLE} SELECT DISTINCT id FROM _kvaudit_read_ids WHERE NOT held")
        finally:
            con.unregister("_kvaudit_read")
        if not dropped:
            return tables
        self.repeats += len(dropped)
        return replace(tables, spans=_without(spans, dropped), pages=_pages_without(tables, dropped))


# A span's identity in the database: an MD5 of its ids (hex, so a space cannot occur in either).
_IDENTITY: Final = "md5_number(trace_id || ' ' || span_id)"
_HAS_IDENTITY: Final = "trace_id <> '' AND span_id <> ''"
# A read's span rows with an identity, whether the database holds it already, and which row
# of the read has it first.
_READ_IDS: Final = f"""
    WITH read AS (SELECT row, {_IDENTITY} AS id FROM _kvaudit_read WHERE {_HAS_IDENTITY}),
         held AS (SELECT DISTINCT read.id FROM {StoredIdentities.TABLE} AS kept JOIN read ON kept.id = read.id)
    SELECT row, id, id IN (SELECT id FROM held) AS held,
           row_number() OVER (PARTITION BY id ORDER BY row) > 1 AS again
    FROM read"""
_REPEATED: Final = "SELECT row FROM _kvaudit_read_ids WHERE held OR again ORDER BY row"
