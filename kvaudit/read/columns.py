"""The Arrow tables a read produces, with schemas generated from the contract's column maps.

Four tables (`kv_resources`, `kv_spans`, `kv_pages`, `kv_read_errors`) under the views
`replicas`, `spans`, `pages` and `read_errors` (docs/design.md section 3.9). Their
attribute columns are the contract's (`RESOURCE_COLUMNS`, `SPAN_COLUMNS`,
`PAGE_COLUMNS`); the other columns say where a row came from.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from kvaudit.contract import PAGE_COLUMNS, RESOURCE_COLUMNS, SPAN_COLUMNS, Kind
from kvaudit.otlp.schema import ArrayValue

# What Arrow raises for a value it cannot put in a column of the tables below.
UNTYPABLE: Final = (pa.ArrowException, OverflowError)
INTEGER_PATTERN: Final = "^-?[0-9]+$"  # OTLP JSON's int64 as a string: decimal digits
ARROW_TYPE: Final = {
    Kind.STR: pa.string(),
    Kind.INT: pa.int64(),
    Kind.BOOL: pa.bool_(),
    Kind.INTS: pa.list_(pa.int64()),
    Kind.DOUBLE: pa.float64(),
}

RESOURCES_SCHEMA: Final = pa.schema(
    [("resource_id", pa.int64())] + [(name, ARROW_TYPE[kind]) for name, (_, kind) in RESOURCE_COLUMNS.items()]
)
# Where a row came from: its line of its file, its process and replica, its span.
_ORIGIN: Final = [
    ("file", pa.string()),
    ("line", pa.int64()),
    ("resource_id", pa.int64()),
    ("replica", pa.string()),
    ("trace_id", pa.string()),
    ("span_id", pa.string()),
]
SPAN_HEAD: Final = [
    *_ORIGIN,
    ("parent_span_id", pa.string()),
    ("name", pa.string()),
    ("start_ns", pa.int64()),
    ("end_ns", pa.int64()),
    ("status_code", pa.int64()),
    ("dropped_attributes", pa.int64()),
    ("dropped_events", pa.int64()),
]
SPANS_SCHEMA: Final = pa.schema(
    SPAN_HEAD
    + [(name, ARROW_TYPE[kind]) for name, (_, kind) in SPAN_COLUMNS.items()]
    + [("attributes", pa.map_(pa.string(), pa.string()))]
)
PAGE_HEAD: Final = [
    *_ORIGIN,
    # The operation's own attributes, repeated on its pages so queries need no join.
    ("op", pa.string()),
    ("hook", pa.string()),
    ("backend", pa.string()),
    ("request_id", pa.string()),
    ("outcome", pa.string()),
    ("time_ns", pa.int64()),
]
PAGES_SCHEMA: Final = pa.schema(PAGE_HEAD + [(name, ARROW_TYPE[kind]) for name, (_, kind) in PAGE_COLUMNS.items()])
ERRORS_SCHEMA: Final = pa.schema([("file", pa.string()), ("line", pa.int64()), ("reason", pa.string())])
# The tables under the views, in the order of the fields of `Tables`.
TABLES: Final = {
    "kv_resources": RESOURCES_SCHEMA,
    "kv_spans": SPANS_SCHEMA,
    "kv_pages": PAGES_SCHEMA,
    "kv_read_errors": ERRORS_SCHEMA,
}
# Each Arrow type of the tables as DuckDB spells it.
DUCKDB_TYPE: Final = {
    pa.string(): "VARCHAR",
    pa.int64(): "BIGINT",
    pa.uint64(): "UBIGINT",
    pa.binary(): "BLOB",
    pa.bool_(): "BOOLEAN",
    pa.float64(): "DOUBLE",
    pa.list_(pa.int64()): "BIGINT[]",
    pa.map_(pa.string(), pa.string()): "MAP(VARCHAR, VARCHAR)",
}


@dataclass
class Tables:
    """What a read produced, as Arrow tables with the schemas above."""

    resources: pa.Table
    spans: pa.Table
    pages: pa.Table
    errors: pa.Table

    @classmethod
    def concat(cls, parts: Sequence[Tables]) -> Tables:
        def cat(name: str, schema: pa.Schema) -> pa.Table:
            tables = [getattr(part, name) for part in parts]
            return pa.concat_tables(tables) if tables else schema.empty_table()

        return cls(
            cat("resources", RESOURCES_SCHEMA),
            cat("spans", SPANS_SCHEMA),
            cat("pages", PAGES_SCHEMA),
            cat("errors", ERRORS_SCHEMA),
        )

    def by_name(self) -> dict[str, pa.Table]:
        """The tables under their `kv_*` names (see `TABLES`)."""
        return dict(zip(TABLES, (self.resources, self.spans, self.pages, self.errors)))

    @property
    def num_rows(self) -> int:
        """The rows of all four tables."""
        return sum(table.num_rows for table in self.by_name().values())


def table_of(schema: pa.Schema, rows: Sequence[Sequence[Any]]) -> pa.Table:
    if not rows:
        return schema.empty_table()
    columns = zip(*rows)
    return pa.Table.from_arrays([_array(column, f.type) for column, f in zip(columns, schema)], schema=schema)


def _array(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    """An Arrow array from decoded values: OTLP int64s arrive as strings (or numbers).

    Raises:
        UNTYPABLE: a value that is not of the column's type (an integer out of range or
            not an integer: the reader then finds its line, see `decode.untypable`).
    """
    if pa.types.is_list(type_):
        return _list_array(values, type_)
    sample = next((v for v in values if v is not None), None)
    if isinstance(sample, str) and type_ != pa.string():
        try:
            text = pa.array(values, type=pa.string())
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            text = None  # mixed strings and numbers: convert one by one below
        if text is not None:
            return _typed(text, type_)
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return _typed(pa.array([_as_text(v) for v in values], type=pa.string()), type_)


def _typed(text: pa.Array, type_: pa.DataType) -> pa.Array:
    # Arrow's cast takes more than OTLP's decimal digits (hexadecimal, for one).
    if pa.types.is_integer(type_) and not pc.all(pc.match_substring_regex(text, INTEGER_PATTERN)).as_py():
        raise pa.ArrowInvalid("a value that is not an integer")
    return text.cast(type_)


def _list_array(values: Sequence[ArrayValue | None], type_: pa.DataType) -> pa.Array:
    """A list column from OTLP array values, built from flat items and offsets (no list per row)."""
    flat = [item.intValue for value in values if value is not None for item in value.values]
    lengths = [0 if value is None else len(value.values) for value in values]
    offsets = pa.array([0, *itertools.accumulate(lengths)], type=pa.int32())
    items = _array(flat, type_.value_type)
    mask = pa.array([value is None for value in values])
    return pa.ListArray.from_arrays(offsets, items, type=type_, mask=mask)


def _as_text(value: Any) -> Any:
    if isinstance(value, list):
        return [None if v is None else str(v) for v in value]
    return None if value is None else str(value)
