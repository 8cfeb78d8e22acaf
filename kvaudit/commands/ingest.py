"""`kvaudit ingest`: materialise trace files into a DuckDB database or a Parquet dataset, with the same views.

An ingest into an existing database or dataset adds only what is new in the files since
the last ingest into it: how far each file was read is kept there (`kvaudit.read.positions`),
and a span it holds already is not added again (`kvaudit.read.span_identity`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import UsageError, command_parser
from kvaudit.errors import InputError, user_files


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "ingest",
        SUMMARIES["ingest"],
        'kvaudit ingest traces/ -o traces.duckdb && kvaudit sql traces.duckdb "SELECT count(*) FROM pages"\n'
        '  kvaudit ingest traces/ --parquet fleet/ && kvaudit sql fleet/ "SELECT count(*) FROM pages"',
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="trace files, directories or globs")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "-o",
        "--output",
        help="the .duckdb file to write (if it exists: what is new in the files since the last ingest is added)",
    )
    target.add_argument(
        "--parquet",
        metavar="DIR",
        help="a directory of Parquet partitioned by day and replica, sorted by replica, key and time"
        " (if it exists: what is new in the files since the last ingest is added)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import duckdb
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from kvaudit.present.rows import warn_read_errors
    from kvaudit.read import parquet
    from kvaudit.read.open import open_parquet
    from kvaudit.read.store import TraceStore

    if args.output is not None and not args.output.endswith(".duckdb"):
        raise UsageError(f"{args.output}: the output name must end in .duckdb")
    with user_files():
        if args.output is not None:
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        # Each file is read from where an earlier ingest into the same place stopped.
        try:
            store = TraceStore(args.paths, args.output)
        except duckdb.Error as exc:  # a database another process holds, or not DuckDB's
            raise InputError(f"{args.output}: {str(exc).splitlines()[0]}") from None
        if args.parquet is not None:
            store.cursors = parquet.read_positions(args.parquet)
            parquet.remember_spans(args.parquet, store.identities)
    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, disable=args.quiet, transient=True) as progress:
        task = progress.add_task("ingest", total=store.pending_bytes())
        # Complete lines only: a writer may be in the middle of the last one, which the next
        # ingest reads once it is whole (read now, it would be lost as two broken halves).
        tables = store.refresh(final=False, progress=lambda n: progress.advance(task, n))
    warn_read_errors([(row["file"], row["line"], row["reason"]) for row in tables.errors.to_pylist()])
    for cursor in store.cursors.files.values():
        if not cursor.whole and cursor.not_json is None:
            print(
                f"kvaudit ingest: {cursor.path} ends in an unterminated line: left for the next ingest", file=sys.stderr
            )
    if args.parquet is not None:
        added = sum(table.num_rows for table in tables.by_name().values())
        if added or not parquet.is_dataset(args.parquet):
            parquet.write(store, args.parquet)
        parquet.write_positions(args.parquet, store.cursors)
        if store.identities.forgot:
            parquet.mark_repeats(args.parquet)
        store.close()
        store = open_parquet(args.parquet)
    _, [(pages, spans, errors)] = store.query(
        "SELECT (SELECT count(*) FROM pages), (SELECT count(*) FROM spans), (SELECT count(*) FROM read_errors)"
    )
    store.close()
    print(
        f"{args.output or args.parquet}: {pages} page descriptors, {spans} spans"
        f" (+{tables.pages.num_rows} and +{tables.spans.num_rows} now), {errors} unreadable lines"
    )
    return 0
