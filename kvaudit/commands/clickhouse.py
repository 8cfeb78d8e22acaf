"""`kvaudit clickhouse setup`: typed tables filled at insert, so that queries read columns instead of attribute maps."""

from __future__ import annotations

import argparse

from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import UsageError, command_parser


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "clickhouse",
        SUMMARIES["clickhouse"],
        "kvaudit clickhouse setup --backend clickhouse://localhost:8123/otel --backfill",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    setup = command_parser(
        actions,
        "setup",
        "Create the typed tables kvaudit_pages, kvaudit_spans and kvaudit_replicas and the materialized views"
        " filling them at each insert into otel_traces (idempotent); the backend reads them from then on.",
        "kvaudit clickhouse setup --backend clickhouse://localhost:8123/otel --print  # review the DDL\n"
        "  kvaudit clickhouse setup --backend clickhouse://localhost:8123/otel --backfill",
    )
    setup.add_argument(
        "--backend",
        metavar="URL",
        help="clickhouse://HOST:PORT/DB[?table=otel_traces] (a user that may create tables), or chdb:///DIR",
    )
    setup.add_argument("--print", action="store_true", help="print the statements instead of running them")
    setup.add_argument(
        "--backfill",
        action="store_true",
        help="also copy what otel_traces held before the typed tables existed, partition by partition"
        " (only what they lack: safe to repeat)",
    )
    setup.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvaudit.backends.clickhouse import connect, traces_table
    from kvaudit.backends.clickhouse_views import DEFAULT_TABLE

    if args.print:
        _print_statements(traces_table(args.backend) if args.backend else DEFAULT_TABLE)
        return 0
    if not args.backend:
        raise UsageError("give --backend URL (or --print to see the statements)")
    from kvaudit.backends.clickhouse_setup import backfill, setup, spans_not_copied

    with connect(args.backend) as backend:
        for line in setup(backend):
            print(line)
        if args.backfill:
            for line in backfill(backend):
                print(line)
        elif missing := spans_not_copied(backend):
            print(
                f"{backend.table} holds {missing:,} spans the typed tables lack (written before them):"
                " --backfill copies them, partition by partition"
            )
    return 0


def _print_statements(table: str) -> None:
    from kvaudit.backends.clickhouse_tables import TYPED_TABLES, missing_rows, setup_statements

    print(";\n\n".join(setup_statements(table)) + ";\n")
    print(f"-- Backfill: for each partition P of {table} (SELECT DISTINCT _partition_id FROM {table}):\n")
    for typed in TYPED_TABLES:
        print(f"INSERT INTO {typed.name} {missing_rows(typed, table, 'P')};\n")
