"""Writing audit findings: a rich table grouped by severity and rule, or JSON lines.

The table is for reading at a terminal's width: each finding's fields are named, not
dumped (their values are in the JSON, one finding per line, and in the TUI's drill-down).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from itertools import groupby
from typing import Final, TextIO

from rich.table import Table
from rich.text import Text

from kvaudit.analyse.audit import Finding
from kvaudit.present.terminal import cell, console, print_wide

# Rows shown per rule and severity in the table by default; the JSON output has them all.
TABLE_ROWS_PER_GROUP: Final = 50
_STYLE: Final = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
KEY_WIDTH: Final = 12


def write_json(findings: list[Finding], stream: TextIO) -> None:
    for finding in findings:
        stream.write(json.dumps(dataclasses.asdict(finding), default=str) + "\n")


def write_table(findings: list[Finding], stream: TextIO, *, rows_per_group: int = TABLE_ROWS_PER_GROUP) -> None:
    out = console(stream)
    if not findings:
        out.print(Text("No findings.", style="green"))
        return
    for (severity, code, rule), group in groupby(findings, key=lambda f: (f.severity, f.code, f.rule)):
        rows = list(group)
        title = Text.assemble((severity, _STYLE.get(severity, "")), f" {code} {rule} ({len(rows)})")
        table = Table(title=title, header_style="bold", show_edge=False, title_justify="left")
        table.add_column("replica", overflow="fold")
        table.add_column("producer", overflow="fold")
        table.add_column("key", no_wrap=True)
        table.add_column("span", overflow="fold")
        table.add_column("fields", overflow="fold", ratio=1)
        table.add_column("message", overflow="fold", ratio=2)
        for finding in rows[:rows_per_group]:
            table.add_row(
                cell(finding.replica or ""),
                cell(finding.producer or ""),
                cell(_short(finding.key)),
                cell(_where(finding)),
                cell(field_names(finding.fields)),
                cell(finding.message),
            )
        print_wide(out, table)
        if len(rows) > rows_per_group:
            out.print(f"  ... and {len(rows) - rows_per_group} more (--format json lists them all)")
        out.print()
    counts = {severity: sum(f.severity == severity for f in findings) for severity in _STYLE}
    out.print(Text(", ").join(Text(f"{n} {s}", style=_STYLE[s]) for s, n in counts.items()))


def field_names(fields: Mapping[str, object] | list[str]) -> str:
    """The fields a finding involves, by name (their values are in `--format json`)."""
    return ", ".join(fields)


def _short(key: str | None) -> str:
    return "" if key is None else key if len(key) <= KEY_WIDTH + 4 else f"{key[:KEY_WIDTH]}…"


def _where(finding: Finding) -> str:
    """The span a finding is about (its trace is in the JSON), or the unreadable line."""
    if finding.line is not None and finding.span_id is None:
        return f"{finding.file}:{finding.line}"
    return finding.span_id or ""
