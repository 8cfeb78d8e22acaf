"""`kvaudit audit`: rules KVA001-KVA007 over trace files; the exit status says how bad."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from itertools import groupby
from typing import Final, TextIO

from rich.console import Console
from rich.table import Table

from kvaudit.audit import Finding, run_audit
from kvaudit.cli import UsageError, command_parser
from kvaudit.durations import parse_duration
from kvaudit.store import TraceStore, open_store

# Rows shown per rule and severity in the table; the JSON output has them all.
TABLE_ROWS_PER_GROUP: Final = 50
_STYLE: Final = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "audit",
        "Check fetched KV pages against the trace contract and their producers (rules KVA001-KVA007). "
        "Exit status: 0 nothing at warning or above, 1 warnings or critical findings, 2 unusable input.",
        "kvaudit audit traces/ --format json > findings.jsonl",
    )
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="trace files, directories, globs, or one .duckdb from `kvaudit ingest`"
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument(
        "--skew", type=parse_duration, default=1.0, help="clock skew allowed between replicas (default 1s)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    store = open_store(args.paths)
    try:
        findings = audit_usable(store, args.skew)
    finally:
        store.close()
    if args.format == "json":
        write_json(findings, sys.stdout)
    else:
        write_table(findings, sys.stdout)
    return exit_status(findings)


def audit_usable(store: TraceStore, skew_s: float) -> list[Finding]:
    """The findings, or UsageError when the input holds no spans to audit at all."""
    _, [(spans, errors)] = store.query("SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM read_errors)")
    if not spans:
        raise UsageError(f"no spans to audit ({errors} unreadable lines)")
    return run_audit(store, skew_s=skew_s)


def exit_status(findings: list[Finding]) -> int:
    return 1 if any(f.severity in ("critical", "warning") for f in findings) else 0


def write_json(findings: list[Finding], stream: TextIO) -> None:
    for finding in findings:
        stream.write(json.dumps(dataclasses.asdict(finding), default=str) + "\n")


def write_table(findings: list[Finding], stream: TextIO) -> None:
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
        for finding in rows[:TABLE_ROWS_PER_GROUP]:
            table.add_row(
                finding.replica or "",
                finding.producer or "",
                _short(finding.key),
                _where(finding),
                json.dumps(finding.fields, default=str),
                finding.message,
            )
        console.print(table)
        if len(rows) > TABLE_ROWS_PER_GROUP:
            console.print(f"  ... and {len(rows) - TABLE_ROWS_PER_GROUP} more (--format json lists them all)")
        console.print()
    counts = {severity: sum(f.severity == severity for f in findings) for severity in _STYLE}
    console.print(", ".join(f"[{_STYLE[s]}]{n} {s}[/]" for s, n in counts.items()))


def _short(key: str | None) -> str:
    return "" if key is None else key if len(key) <= 16 else f"{key[:12]}…"


def _where(finding: Finding) -> str:
    if finding.line is not None and finding.span_id is None:
        return f"{finding.file}:{finding.line}"
    return f"{finding.trace_id or ''}/{finding.span_id or ''}"
