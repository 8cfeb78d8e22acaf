"""`kvaudit sql`: a query over the kvaudit views of trace files (or of ClickHouse)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvaudit.commands import SUMMARIES
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
from kvaudit.errors import InputError, user_files


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "sql",
        SUMMARIES["sql"],
        'kvaudit sql traces/ "SELECT replica, op, count(*) AS pages FROM pages GROUP BY ALL"\n'
        "  kvaudit sql traces/ -q hit_rate --param bucket_s=300     # a named query (`kvaudit queries`)\n"
        "  kvaudit sql traces.duckdb -f my-query.sql --format csv\n"
        "  kvaudit sql --backend clickhouse://localhost:8123/otel -q summary",
    )
    # The SQL is the last positional argument (argparse cannot tell it from a path): said in the usage.
    parser.usage = (
        "%(prog)s [options] PATH [PATH ...] SQL\n"
        "       %(prog)s [options] PATH [PATH ...] (-q NAME | -f FILE)\n"
        "       %(prog)s [options] --backend URL (SQL | -q NAME | -f FILE)"
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help=f"{TRACE_PATHS_HELP}; then the SQL, unless -q or -f")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "-q", "--query", metavar="NAME", help="run a named query shipped with kvaudit (list them: kvaudit queries)"
    )
    source.add_argument(
        "-f",
        "--file",
        help="read the query from this .sql file (a path that is no file but names a shipped query, such as"
        " queries/summary.sql, runs that query)",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a named query's parameter (`bucket_s=300` sets kvaudit_bucket_s); repeatable",
    )
    add_output_arguments(parser)
    add_backend_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvaudit.analyse.named_queries import load, variables_read
    from kvaudit.present.rows import write_rows

    paths = list(args.paths)
    if args.query:
        with user_files():  # a query of that name
            query = load(args.query)
    elif args.file:
        query = _file_query(args.file)
    elif len(paths) >= (1 if args.backend else 2):
        query = paths.pop()
    else:
        raise UsageError("give a query after the paths, -q NAME or -f FILE")
    values = parameters(args.param)
    unknown = sorted(set(values) - variables_read(query))
    if unknown:  # a misspelt name would otherwise leave the query at its default, silently
        taken = ", ".join(sorted(name.removeprefix("kvaudit_") for name in variables_read(query))) or "none"
        named = ", ".join(name.removeprefix("kvaudit_") for name in unknown)
        raise UsageError(f"--param {named}: the query has no such parameter (it takes: {taken})")
    with open_backend(args.backend, paths, store=args.store) as backend:
        warn_backend_read_errors(backend)
        columns, rows = backend.query(query, values)
    write_rows(columns, rows, args.format, limit=row_limit(args))
    return 0


def _file_query(spec: str) -> str:
    from kvaudit.analyse.named_queries import load, resolve

    path = Path(spec)
    if path.is_file():
        with user_files():
            return path.read_text()
    name = resolve(spec)
    if name is None:
        raise InputError(f"{spec}: no such file, nor a named query (kvaudit queries lists them)")
    return load(name)


def parameters(specs: list[str]) -> dict[str, Any]:
    """`NAME=VALUE` pairs as query variables: `kvaudit_` prefixed, numbers as numbers.

    Raises:
        UsageError: a pair without `=` or with a name that is no identifier.
    """
    values: dict[str, Any] = {}
    for spec in specs:
        name, equals, text = spec.partition("=")
        name = name.strip()
        if not equals or not name.isidentifier():
            raise UsageError(f"--param {spec!r}: expected NAME=VALUE")
        values[name if name.startswith("kvaudit_") else f"kvaudit_{name}"] = _value(text)
    return values


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
