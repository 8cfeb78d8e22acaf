"""Writing audit findings: a rich table grouped by severity and rule, or JSON lines."""

from __future__ import annotations

import dataclasses
import json
from itertools import groupby
from typing import Final, TextIO

from rich.console import Console
from rich.table import Table

from kvaudit.analyse.audit import Finding

# Rows shown per rule and severity in the table by default; the JSON output has them all.
TABLE_ROWS_PER_GROUP: Final = 50
_STYLE: Final = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def write_json(findings: list[Finding], stream: TextIO) -> None:
    for finding in findings:
        stream.write(json.dumps(dataclasses.asdict(finding), default=str) + "\n")


def write_table(findings: list[Finding], stream: TextIO, *, rows_per_group: int = TABLE_ROWS_PER_GROUP) -> None:
    console = Console(file=stream, soft_wrap=False)
    if not findings:
        console.print("[green]No findings.[/green]")
        return
    for (severity, code, rule), group in groupby(findings, key=lambda f: (f.severity, f.code, f.rule)):
        rows = list(group)
        table = Table(
            title=f"[{_STYLE.get(severity, '')}]{severity}[/] {code} {rule} ({len(rows)})",
            header_style="bold",
            show_edge=False,
            title_justify="left",
        )
        for name in ("replica", "producer", "key", "where", "fields", "message"):
            table.add_column(name, overflow="fold")
        for finding in rows[:rows_per_group]:
            table.add_row(
                finding.replica or "",
                finding.producer or "",
                _short(finding.key),
                _where(finding),
                json.dumps(finding.fields, default=str),
                finding.message,
            )
        console.print(table)
        if len(rows) > rows_per_group:
            console.print(f"  ... and {len(rows) - rows_per_group} more (--format json lists them all)")
        console.print()
    counts = {severity: sum(f.severity == severity for f in findings) for severity in _STYLE}
    console.print(", ".join(f"[{_STYLE[s]}]{n} {s}[/]" for s, n in counts.items()))


def _short(key: str | None) -> str:
    return "" if key is None else key if len(key) <= 16 else f"{key[:12]}…"


def _where(finding: Finding) -> str:
    if finding.line is not None and finding.span_id is None:
        return f"{finding.file}:{finding.line}"
    return f"{finding.trace_id or ''}/{finding.span_id or ''}"
