"""Which codec for which column of the typed tables: bench_scale measures the candidates on its fleet.

Each column that matters to the size is copied, in its table's own order, into a probe
table with a column per candidate; ClickHouse's own count of compressed bytes per
column (`system.columns`) gives the figures. `kvaudit.backends.clickhouse_tables.codec`
records the choice made from them (docs/scale.md, "Typed tables").
"""

from __future__ import annotations

from typing import Final

from kvaudit.backends.clickhouse import ClickHouseBackend
from kvaudit.backends.clickhouse_tables import TYPED_TABLES, column_type

# name -> (codec, for integers only, stored as LowCardinality)
CANDIDATES: Final = {
    "LZ4": ("LZ4", False, False),
    "ZSTD(1)": ("ZSTD(1)", False, False),
    "ZSTD(3)": ("ZSTD(3)", False, False),
    "Delta+ZSTD(1)": ("Delta, ZSTD(1)", True, False),
    "LowCard+ZSTD(1)": ("ZSTD(1)", False, True),
}
# The columns that are not constant in a fleet (the rest compress to almost nothing whatever the codec).
COLUMNS: Final = (
    ("pages", "key"),
    ("pages", "time_ns"),
    ("pages", "trace_id"),
    ("pages", "span_id"),
    ("pages", "request_id"),
    ("pages", "resource_id"),
    ("pages", "token_start"),
    ("spans", "start_ns"),
    ("spans", "trace_id"),
)


def measure(clickhouse: ClickHouseBackend) -> list[str]:
    """One line per column: its compressed MiB under each candidate ('-' where one does not apply)."""
    lines = [f"  {'codec (MiB)':<20}" + "".join(f"{name:>16}" for name in CANDIDATES)]
    for view, column in COLUMNS:
        table = next(typed for typed in TYPED_TABLES if typed.view == view)
        kind = column_type(table, next(field for field in table.columns if field.name == column))
        usable = {}
        for name, (codec, integers, low_cardinality) in CANDIDATES.items():
            if (integers and "Int" not in kind) or (low_cardinality and ("String" not in kind or "LowCard" in kind)):
                continue
            usable[name] = f"LowCardinality({kind})" if low_cardinality else kind, codec
        sizes = _compressed(clickhouse, table.name, table.order_by, column, usable)
        cells = "".join(f"{sizes[name] / 2**20:>16.1f}" if name in sizes else f"{'-':>16}" for name in CANDIDATES)
        lines.append(f"  {view + '.' + column:<20}{cells}")
    return lines


def _compressed(
    clickhouse: ClickHouseBackend, table: str, order_by: str, column: str, kinds: dict[str, tuple[str, str]]
) -> dict[str, int]:
    """The compressed bytes of `column` of `table` as each of `kinds` (name -> (type, codec)), in `order_by`."""
    probe = f"kvaudit_codec_probe_{table}_{column}"
    keys = [name.strip() for name in order_by.split(",")]
    types = dict(clickhouse.query(f"SELECT name, type FROM system.columns WHERE table = '{table}'")[1])
    definitions = [f"o{i} {types[key]}" for i, key in enumerate(keys)]
    definitions += [f"c{i} {kind} CODEC({codec})" for i, (kind, codec) in enumerate(kinds.values())]
    run = clickhouse.connection.command
    run(f"DROP TABLE IF EXISTS {probe}")
    run(
        f"CREATE TABLE {probe} ({', '.join(definitions)}) ENGINE = MergeTree"
        f" ORDER BY ({', '.join(f'o{i}' for i in range(len(keys)))}) SETTINGS allow_nullable_key = 1"
    )
    run(f"INSERT INTO {probe} SELECT {', '.join(keys + [column] * len(kinds))} FROM {table}")
    run(f"OPTIMIZE TABLE {probe} FINAL")
    sizes = dict(
        clickhouse.query(
            f"SELECT name, data_compressed_bytes FROM system.columns WHERE table = '{probe}'"
            " AND database = currentDatabase()"
        )[1]
    )
    run(f"DROP TABLE {probe}")
    return {name: sizes[f"c{i}"] for i, name in enumerate(kinds)}
