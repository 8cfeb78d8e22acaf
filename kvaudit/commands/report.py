"""`kvaudit report`: findings, reuse, hit rates, overhead and pool capacity, in the terminal and as HTML."""

from __future__ import annotations

import argparse
import sys

from kvaudit.commands.arguments import add_input_arguments, command_parser, duration, open_backend, require_spans
from kvaudit.commands.audit import exit_status
from kvaudit.present.report import gather, print_report
from kvaudit.present.report_html import write_html


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "report",
        "The whole picture of traces: audit findings, reuse, hit rates, transfer overhead and pool capacity. "
        "Exit status as for `kvaudit audit`.",
        "kvaudit report traces/ --html report.html",
    )
    add_input_arguments(parser)
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with charts")
    parser.add_argument("--bucket", type=duration, default=60.0, help="hit-rate time bucket (default 60s)")
    parser.add_argument(
        "--sample-rate",
        type=float,
        help="SHARDS sampling rate of the capacity curve (default: exact for moderate traces, sampled above)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with open_backend(args.backend, args.paths) as backend:
        require_spans(backend)
        report = gather(backend, skew_s=args.skew, bucket_s=args.bucket, sample_rate=args.sample_rate)
    print_report(report, sys.stdout)
    if args.html:
        write_html(report, args.html, title=f"kvaudit report: {' '.join(args.paths) or args.backend}")
        print(f"\nHTML report: {args.html}")
    return exit_status(report.findings)
