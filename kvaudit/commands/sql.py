"""`kvaudit sql`: a query over the kvaudit views of trace files (or of ClickHouse)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvaudit.commands.arguments import (
    TRACE_PATHS_HELP,
    UsageError,
    add_backend_option,
    add_output_arguments,
    command_parser,
    open_backend,
    row_limit,
    warn_backend_read_errors,
)
from kvaudit.present.rows import write_rows


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "sql",
        "Run SQL over the spans, pages, replicas and read_errors views of trace files.",
        'kvaudit sql traces/ "SELECT replica, op, count(*) AS pages FROM pages GROUP BY ALL"\n'
        "  kvaudit sql traces.duckdb -f queries/hit_rate.sql --format csv\n"
        "  kvaudit sql --backend clickhouse://localhost:8123/otel -f queries/summary.sql",
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help=TRACE_PATHS_HELP,
    )
    parser.add_argument("-f", "--file", help="read the query from this .sql file")
    add_output_arguments(parser)
    add_backend_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    paths = list(args.paths)
    if args.file:
        query = Path(args.file).read_text()
    elif len(paths) >= (1 if args.backend else 2):
        query = paths.pop()
    else:
        raise UsageError("give a query after the paths, or -f FILE")
    with open_backend(args.backend, paths) as backend:
        warn_backend_read_errors(backend)
        columns, rows = backend.query(query)
    write_rows(columns, rows, args.format, limit=row_limit(args))
    return 0
