"""`kvaudit ingest`: materialise trace files into a DuckDB database or a Parquet dataset, with the same views.

An ingest into an existing database or dataset adds only what is new in the files since
the last ingest into it: how far each file was read is kept there (`kvaudit.read.positions`),
and a span it holds already is not added again (`kvaudit.read.span_identity`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import UsageError, command_parser
from kvaudit.errors import user_files

if TYPE_CHECKING:
    from kvaudit.read.columns import Tables


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


@dataclass
class _Tally:
    """What an ingest added, counted as each part of the read is taken in (none of its rows kept)."""

    pages: int = 0
    spans: int = 0
    errors: list[tuple[str, int, str]] = field(default_factory=list)  # (file, line, reason)

    def take(self, tables: Tables) -> None:
        self.pages += tables.pages.num_rows
        self.spans += tables.spans.num_rows
        self.errors.extend((row["file"], row["line"], row["reason"]) for row in tables.errors.to_pylist())


def run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from kvaudit.present.rows import warn_read_errors
    from kvaudit.read import parquet
    from kvaudit.read.open import open_parquet
    from kvaudit.read.store import TraceStore
    from kvaudit.read.store_file import open_bounded_store, warn_unterminated

    if args.output is not None and not args.output.endswith(".duckdb"):
        raise UsageError(f"{args.output}: the output name must end in .duckdb")
    with user_files():
        if args.output is not None:
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    # Each file is read from where an earlier ingest into the same place stopped.
    if args.output is not None:
        store = open_bounded_store(args.paths, args.output)
    else:
        store = TraceStore(args.paths)
        with user_files():
            store.cursors = parquet.read_positions(args.parquet)
            parquet.remember_spans(args.parquet, store.identities)
    tally = _Tally()
    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, disable=args.quiet, transient=True) as progress:
        task = progress.add_task("ingest", total=store.pending_bytes())
        # Complete lines only: a writer may be in the middle of the last one, which the next
        # ingest reads once it is whole (read now, it would be lost as two broken halves).
        store.refresh(final=False, progress=lambda n: progress.advance(task, n), added=tally.take)
    warn_read_errors(tally.errors)
    warn_unterminated(store, "ingest")
    if args.parquet is not None:
        if tally.pages or tally.spans or tally.errors or not parquet.is_dataset(args.parquet):
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
        f" (+{tally.pages} and +{tally.spans} now), {errors} unreadable lines"
    )
    return 0
