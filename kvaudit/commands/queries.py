"""`kvaudit queries`: the named queries shipped with kvaudit, what each answers, and its parameters."""

from __future__ import annotations

import argparse

from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import command_parser
from kvaudit.present.output_formats import FORMATS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "queries",
        SUMMARIES["queries"],
        "kvaudit queries   |   kvaudit sql traces/ -q hit_rate --param bucket_s=300",
    )
    parser.add_argument("--all", action="store_true", help="also the auditor's rules and the TUI's panels")
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvaudit.analyse.named_queries import PARTS, describe, named_queries
    from kvaudit.present.rows import write_rows

    rows = []
    for name in named_queries():
        if name == "views" or (name.startswith(PARTS) and not args.all):
            continue  # views.sql defines the views for the plain duckdb shell: no query
        info = describe(name)
        parameters = ", ".join(
            f"{variable.removeprefix('kvaudit_')}={default if default is not None else '(unset)'}"
            for variable, default in info.parameters.items()
        )
        rows.append((name, info.summary, parameters))
    write_rows(("name", "answers", "parameters (default)"), rows, args.format)
    return 0
