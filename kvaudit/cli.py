"""The `kvaudit` command line: one subcommand per module, errors as one line, exit 2.

Each command module exposes `register(subparsers)`, which adds its parser and sets
`run` (a callable taking the parsed arguments and returning an exit status).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

import duckdb

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
)


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit status 2."""


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


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="kvaudit: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (UsageError, FileNotFoundError, ValueError, OSError, duckdb.Error) as exc:
        print(f"kvaudit {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
