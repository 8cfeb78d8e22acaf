"""Writing query results: a rich table for people, CSV and JSON lines for programs."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import sys
from collections.abc import Sequence
from typing import Any, Final, TextIO

import msgspec
from rich.console import Console
from rich.table import Table

FORMATS: Final = ("table", "csv", "json")


def write_rows(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    fmt: str = "table",
    stream: TextIO | None = None,
    *,
    title: str | None = None,
) -> None:
    """Write rows as `table`, `csv` or `json` (one object per row per line)."""
    stream = stream or sys.stdout
    if fmt == "json":
        encoder = msgspec.json.Encoder(enc_hook=_json_value)
        for row in rows:
            stream.write(encoder.encode(dict(zip(columns, row))).decode() + "\n")
    elif fmt == "csv":
        writer = csv.writer(stream)
        writer.writerow(columns)
        writer.writerows(rows)
    elif fmt == "table":
        table = Table(title=title, header_style="bold", show_edge=False)
        for name in columns:
            table.add_column(name, overflow="fold")
        for row in rows:
            table.add_row(*(_cell(value) for value in row))
        Console(file=stream, soft_wrap=False).print(table)
    else:
        raise ValueError(f"unknown format {fmt!r} (expected one of {', '.join(FORMATS)})")


def _cell(value: Any) -> str:
    if value is None:
        return "[dim]∅[/dim]"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)


def warn_read_errors(errors: Sequence[tuple[str, int, str]], stream: TextIO | None = None, limit: int = 20) -> None:
    """Name unreadable lines on stderr as `file:line: reason`, the first `limit` of them."""
    stream = stream or sys.stderr
    for file, line, reason in errors[:limit]:
        stream.write(f"kvaudit: {file}:{line}: {reason}\n")
    if len(errors) > limit:
        stream.write(f"kvaudit: ... and {len(errors) - limit} more unreadable lines (see the read_errors view)\n")
