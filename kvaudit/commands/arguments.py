"""What the commands share: their parser shape, the input arguments, and the error that means bad input.

The commands import this module and `kvaudit.cli` imports the commands, never the
other way round: `UsageError` is the same class however the CLI was started.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvaudit.alerts.bounds import DEFAULT_TIMEOUT_S
from kvaudit.durations import parse_duration
from kvaudit.errors import BadValueError, user_files
from kvaudit.present.output_formats import FORMATS, TABLE_ROWS

if TYPE_CHECKING:
    from kvaudit.backends import Backend

TRACE_PATHS_HELP = "trace files, directories, globs, one .duckdb from `kvaudit ingest`, or a Parquet directory"


class UsageError(BadValueError):
    """Bad input from the user: reported as one line, exit status 2."""


def command_parser(
    subparsers: argparse._SubParsersAction, name: str, summary: str, example: str
) -> argparse.ArgumentParser:
    """A subcommand's parser with its one-line summary and an example in its help."""
    return subparsers.add_parser(
        name,
        help=summary,
        description=summary,
        epilog=f"Example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def duration(text: str) -> float:
    """An argparse type: a duration in Prometheus' syntax (`kvaudit.durations`), in seconds."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """`--format` (table, csv, json) and how many rows a table shows (`--limit N`, `--all`)."""
    parser.add_argument("--format", choices=FORMATS, default="table")
    rows = parser.add_mutually_exclusive_group()
    rows.add_argument(
        "--limit",
        type=_positive,
        metavar="N",
        help=f"write at most N rows (default: {TABLE_ROWS} in a table, all in CSV and JSON), with a note on the rest",
    )
    rows.add_argument("--all", action="store_true", help="write every row, also in a table")


def row_limit(args: argparse.Namespace) -> int | None:
    """The rows to write, from `add_output_arguments`' options (None: all)."""
    if args.all:
        return None
    return args.limit if args.limit is not None else TABLE_ROWS if args.format == "table" else None


def _positive(text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, not {text!r}")
    return int(text)


def add_input_arguments(parser: argparse.ArgumentParser, *, paths_help: str = TRACE_PATHS_HELP) -> None:
    """The trace paths or `--backend`, and the clock skew: what every command over the views reads."""
    parser.add_argument("paths", nargs="*", metavar="PATH", help=paths_help)
    add_backend_option(parser)
    add_skew_option(parser)


def add_skew_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--skew", type=duration, default=1.0, help="clock skew allowed between replicas (default 1s)")


def add_rule_timeout_option(parser: argparse.ArgumentParser) -> None:
    """Add `--rule-timeout` (how long an alert rule's query may run) to a parser of a command that evaluates rules."""
    parser.add_argument(
        "--rule-timeout",
        type=duration,
        default=DEFAULT_TIMEOUT_S,
        help=f"stop a rule's query after this long: the rule fails, the others go on (default {DEFAULT_TIMEOUT_S:g}s)",
    )


def rule_timeout(args: argparse.Namespace) -> float:
    """`--rule-timeout`, checked.

    Raises:
        UsageError: it is not longer than 0s.
    """
    if args.rule_timeout <= 0:
        raise UsageError("--rule-timeout must be longer than 0s")
    return args.rule_timeout


def add_backend_option(parser: argparse.ArgumentParser) -> None:
    """Add `--backend URL` to a query command's parser."""
    parser.add_argument(
        "--backend",
        metavar="URL",
        help="query ClickHouse behind the OpenTelemetry Collector (clickhouse://HOST:PORT/DB[?table=otel_traces],"
        " or chdb:///DIR for the engine in-process) instead of DuckDB over the PATHs",
    )
    parser.add_argument(
        "--store",
        metavar="FILE.duckdb",
        help="keep what is read of the trace PATHs in this database (made if absent): the next command given it"
        " reads only the lines appended since",
    )


def open_backend(
    url: str | None,
    paths: Sequence[str],
    *,
    store: str | None = None,
    live: bool = False,
    workers: int | None = None,
) -> Backend:
    """The backend a command asked for: ClickHouse at `url`, or DuckDB over `paths`.

    Args:
        store: a database file keeping what is read of the trace files (`--store`, see
            `kvaudit.read.store_file`): only what was appended since it was last brought up
            to date is read.
        live: trace files are read as they grow (`Backend.refresh`, nothing read yet) into a
            database file (`store`, or a temporary one), whose row groups' min and max serve
            the windowed queries a live view repeats; otherwise they are read whole now, held
            as Arrow (or into `store`).
        workers: decoding threads (default: one per CPU).

    Raises:
        UsageError: both or neither of `url` and `paths`; `store` with no trace files.
        BadValueError: a URL that is not ClickHouse's.
        InputError: a path matches nothing, or cannot be read; `store` is held by another process.
        BackendError: the ClickHouse server cannot be reached.
    """
    if url is None:
        if not paths:
            raise UsageError("give trace paths, or --backend URL")
        from kvaudit.backends.duckdb_backend import DuckDBBackend
        from kvaudit.read import parquet
        from kvaudit.read.open import is_trace_files, open_store
        from kvaudit.read.store_file import open_bounded_store, warn_unterminated

        if store is not None and not store.endswith(".duckdb"):
            raise UsageError(f"--store {store}: the name must end in .duckdb")
        if store is not None and not is_trace_files(paths):
            raise UsageError("--store keeps what is read of trace files: give trace files, not a database or dataset")
        with user_files():
            if live and is_trace_files(paths):
                return DuckDBBackend(open_bounded_store(paths, store, workers=workers))
            if store is not None:
                kept = open_bounded_store(paths, store, workers=workers)
                # Whole lines only: a writer may be in the middle of the last one (read later, whole).
                kept.refresh(final=False, added=_kept)
                warn_unterminated(kept, "store")
                return DuckDBBackend(kept)
            # A Parquet dataset is read in place by DuckDB: its root stays readable in the rules' sandbox.
            dataset = [paths[0]] if len(paths) == 1 and parquet.is_dataset(paths[0]) else []
            return DuckDBBackend(open_store(paths), readable=dataset)
    if paths or store is not None:
        raise UsageError("give either trace paths or --backend URL, not both")
    from kvaudit.backends.clickhouse import connect  # its clients load only when asked for

    return connect(url)


def _kept(tables: object) -> None:
    """A read's rows are in the store: none is kept for the refresh's return as well."""


def warn_backend_read_errors(backend: Backend) -> None:
    """Name the backend's unreadable lines on stderr (see `kvaudit.present.rows.warn_read_errors`)."""
    from kvaudit.present.rows import warn_read_errors

    warn_read_errors(backend.query("SELECT file, line, reason FROM read_errors ORDER BY file, line")[1])


def require_spans(backend: Backend) -> None:
    """Raise UsageError when the input holds no spans at all: nothing to analyse is unusable input."""
    _, [(spans, errors)] = backend.query("SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM read_errors)")
    if not spans:
        raise UsageError(f"no spans to audit ({errors} unreadable lines)")
