"""`kvaudit report`: findings, reuse, hit rates, overhead and pool capacity, in the terminal and as HTML."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import add_input_arguments, command_parser, duration, open_backend, require_spans
from kvaudit.commands.audit import exit_status
from kvaudit.errors import InputError, user_files


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "report",
        SUMMARIES["report"],
        "kvaudit report traces/ --html report.html",
    )
    add_input_arguments(parser)
    parser.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table: for a terminal, findings' fields named; json: one document with every column and field",
    )
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with charts")
    parser.add_argument(
        "--bucket", type=duration, default=60.0, help="time bucket of the hit rates and the reuse left (default 60s)"
    )
    parser.add_argument(
        "--sample-rate",
        type=float,
        help="SHARDS sampling rate of the capacity curve (default: exact for moderate traces, sampled above)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvaudit.present.report import gather, print_report, report_json
    from kvaudit.present.rows import json_line

    if args.html:
        # plotly only for the HTML file, and its path checked before the traces are read:
        # a report that cannot be written fails at once, not after printing the rest.
        from kvaudit.present.report_html import write_html

        writable_file(args.html)
    with open_backend(args.backend, args.paths, store=args.store) as backend:
        require_spans(backend)
        report = gather(backend, skew_s=args.skew, bucket_s=args.bucket, sample_rate=args.sample_rate)
    if args.format == "json":
        sys.stdout.write(json_line(report_json(report)))
    else:
        print_report(report, sys.stdout)
    if args.html:
        with user_files():
            write_html(report, args.html, title=f"kvaudit report: {' '.join(args.paths) or args.backend}")
        print(f"HTML report: {args.html}", file=sys.stderr if args.format == "json" else sys.stdout)
    return exit_status(report.findings)


def writable_file(path: str) -> None:
    """Refuse, as bad input, a file path that could not be written: its folder missing or not writable, or a folder."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise InputError(f"{path}: Is a directory")
    if not folder.is_dir():
        raise InputError(f"{path}: No such directory: {folder}")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise InputError(f"{path}: Permission denied")
