"""`kvaudit sql`: a query over the kvaudit views of trace files."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvaudit.cli import UsageError, command_parser
from kvaudit.output import FORMATS, warn_read_errors, write_rows
from kvaudit.store import open_store


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "sql",
        "Run SQL over the spans, pages, replicas and read_errors views of trace files.",
        'kvaudit sql traces/ "SELECT replica, op, count(*) AS pages FROM pages GROUP BY ALL"\n'
        "  kvaudit sql traces.duckdb -f queries/hit_rate.sql --format csv",
    )
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="trace files, directories, globs, or one .duckdb from `kvaudit ingest`"
    )
    parser.add_argument("-f", "--file", help="read the query from this .sql file")
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    paths = list(args.paths)
    if args.file:
        query = Path(args.file).read_text()
    elif len(paths) >= 2:
        query = paths.pop()
    else:
        raise UsageError("give a query after the paths, or -f FILE")
    store = open_store(paths)
    warn_read_errors(store.query("SELECT file, line, reason FROM read_errors ORDER BY file, line")[1])
    columns, rows = store.query(query)
    write_rows(columns, rows, args.format)
    return 0
