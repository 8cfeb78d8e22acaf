"""The `kvaudit` command line: one subcommand per module of `kvaudit.commands`, errors as one line, exit 2.

Each command module exposes `register(subparsers)`, which adds its parser and sets
`run` (a callable taking the parsed arguments and returning an exit status).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from kvaudit import __version__

# Command modules, in the order `kvaudit --help` lists them.
COMMANDS: tuple[str, ...] = (
    "kvaudit.commands.sql",
    "kvaudit.commands.audit",
    "kvaudit.commands.report",
    "kvaudit.commands.ingest",
    "kvaudit.commands.collect",
    "kvaudit.commands.demo",
    "kvaudit.commands.simulate",
    "kvaudit.commands.tui",
    "kvaudit.commands.alerts",
    "kvaudit.commands.exporter",
    "kvaudit.commands.doctor",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvaudit",
        description="Observability and cache audit for shared KV caching across LLM serving replicas.",
        epilog='Example: kvaudit sql traces/ "SELECT replica, op, count(*) FROM pages GROUP BY ALL"',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kvaudit {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="kvaudit: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not _is_bad_input(exc):
            raise
        print(f"kvaudit {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2


def _is_bad_input(exc: Exception) -> bool:
    """Errors that say what was wrong with the input (a path, a query, a file), not with kvaudit."""
    if isinstance(exc, (ValueError, OSError)):  # UsageError and BackendError are ValueErrors
        return True
    duckdb = sys.modules.get("duckdb")  # a query's error: only possible once DuckDB is loaded
    return duckdb is not None and isinstance(exc, duckdb.Error)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
