"""`kvaudit clickhouse setup`: the typed tables and the materialized views that fill them, and the backfill.

Applying the statements twice changes nothing (`IF NOT EXISTS`, and a table of another
layout is reported, not replaced). Rows the exporter wrote before the materialized views
existed are not in the typed tables until a backfill copies them, partition by partition
of the exporter's table (`clickhouse_tables.missing_rows`: only what is missing).
"""

from __future__ import annotations

from collections.abc import Iterator

from kvaudit.backends.base import BackendError
from kvaudit.backends.clickhouse import ClickHouseBackend
from kvaudit.backends.clickhouse_tables import (
    TYPED_TABLES,
    comment,
    create_materialized_view,
    create_table,
    missing_rows,
    typed_tables_unusable,
)
from kvaudit.backends.clickhouse_views import table_sql


def setup(backend: ClickHouseBackend) -> Iterator[str]:
    """Create what is missing of the typed tables and their materialized views; say what was done, a line each.

    Raises:
        BackendError: a typed table or view exists with another layout (an older kvaudit's,
            or another source table's); or the user may not create tables.
    """
    existing = backend.existing_typed()
    for table in TYPED_TABLES:
        for name in (table.name, table.mv_name):
            if name in existing and existing[name] != comment(table, backend.table):
                raise BackendError(
                    f"{name} exists with another layout (comment {existing[name]!r}); drop {table.mv_name}"
                    f" and {table.name} to create them anew, then backfill"
                )
    for table in TYPED_TABLES:
        for name, statement in (
            (table.name, create_table(table, backend.table)),
            (table.mv_name, create_materialized_view(table, backend.table)),
        ):
            backend.connection.command(statement)
            yield f"{name}: {'present' if name in existing else 'created'}"
    unusable = typed_tables_unusable(backend.existing_typed(), backend.table)
    if unusable is not None:
        raise BackendError(f"after setup, {unusable}")


def spans_not_copied(backend: ClickHouseBackend) -> int:
    """Spans of the exporter's table beyond those of the typed spans table: what a backfill would copy, at least.

    From the tables' row counts, which ClickHouse keeps: nothing is read.
    """
    source, typed = f"SELECT count() FROM {table_sql(backend.table)}", f"SELECT count() FROM {_SPANS.name}"
    counts = backend.connection.arrow(f"SELECT ({source}) AS source, ({typed}) AS typed")
    return max(0, int(counts.column("source")[0].as_py()) - int(counts.column("typed")[0].as_py()))


def backfill(backend: ClickHouseBackend) -> Iterator[str]:
    """Copy into the typed tables what each partition of the exporter's table holds and they lack; a line each.

    Each partition's spans missing from the typed spans table are counted first, and a
    partition with none is left alone, so a second backfill reads only ids.
    """
    partitions = backend.connection.arrow(
        f"SELECT DISTINCT _partition_id AS partition FROM {table_sql(backend.table)} ORDER BY partition"
    ).column("partition")
    for partition in partitions.to_pylist():
        missing = backend.connection.arrow(f"SELECT count() FROM ({missing_rows(_SPANS, backend.table, partition)})")
        spans = int(missing.column(0)[0].as_py())
        if spans:
            for table in TYPED_TABLES:
                backend.connection.command(f"INSERT INTO {table.name} {missing_rows(table, backend.table, partition)}")
        yield f"{backend.table} partition {partition}: {spans:,} spans copied"


_SPANS = next(table for table in TYPED_TABLES if table.view == "spans")
