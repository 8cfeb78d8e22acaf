"""Writing query results: a rich table for people, CSV and JSON lines for programs."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import sys
from collections.abc import Sequence
from typing import Any, Final, TextIO

import msgspec
from rich.table import Table

from kvaudit.present.output_formats import FORMATS
from kvaudit.present.terminal import cell, console, print_wide
from kvaudit.safe_text import json_safe, visible


def write_rows(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    fmt: str = "table",
    stream: TextIO | None = None,
    *,
    title: str | None = None,
    limit: int | None = None,
) -> None:
    """Write rows as `table`, `csv` or `json` (one object per row per line).

    Args:
        limit: write the first `limit` rows and say how many were left out (None: all).
            The note follows a table; with CSV and JSON it goes to stderr, out of the data.
    """
    stream = stream or sys.stdout
    shown = rows if limit is None else rows[:limit]
    if fmt == "json":
        for row in shown:
            stream.write(json_line(dict(zip(columns, row))))
    elif fmt == "csv":
        # CSV is data for programs; on a terminal it is also shown, so its text is made visible there.
        # Lines end with LF, as the duckdb shell's do: a CRLF leaves `\r` in `| tail -1` arithmetic.
        terminal = stream.isatty()
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow([visible(c) if terminal else c for c in columns])
        writer.writerows([[_csv_value(v, terminal) for v in row] for row in shown])
    elif fmt == "table":
        table = Table(title=None if title is None else visible(title), header_style="bold", show_edge=False)
        for index, name in enumerate(columns):
            numeric = all(isinstance(row[index], (int, float, decimal.Decimal)) or row[index] is None for row in shown)
            table.add_column(cell(name), overflow="fold", justify="right" if numeric and shown else "left")
        for row in shown:
            table.add_row(*(cell(value) for value in row))
        print_wide(console(stream), table)
    else:
        raise ValueError(f"unknown format {fmt!r} (expected one of {', '.join(FORMATS)})")
    if len(shown) < len(rows):
        note = f"... {len(rows) - len(shown):,} more rows not shown (of {len(rows):,}; --limit N or --all for more)\n"
        (stream if fmt == "table" else sys.stderr).write(note)


def _csv_value(value: Any, terminal: bool) -> Any:
    return visible(value) if terminal and isinstance(value, str) else value


def json_line(value: Any) -> str:
    """`value` as one line of JSON (control and bidirectional formatting characters escaped), dates in ISO 8601."""
    return json_safe(_ENCODER.encode(value).decode()) + "\n"


def _json_value(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)


_ENCODER: Final = msgspec.json.Encoder(enc_hook=_json_value)


def warn_read_errors(errors: Sequence[tuple[str, int, str]], stream: TextIO | None = None, limit: int = 20) -> None:
    """Name unreadable lines on stderr as `file:line: reason`, the first `limit` of them."""
    stream = stream or sys.stderr
    for file, line, reason in errors[:limit]:
        stream.write(visible(f"kvaudit: {file}:{line}: {reason}") + "\n")
    if len(errors) > limit:
        stream.write(f"kvaudit: ... and {len(errors) - limit} more unreadable lines (see the read_errors view)\n")
