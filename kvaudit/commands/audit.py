"""`kvaudit audit`: rules KVA001-KVA008 over trace files; the exit status says how bad."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import (
    UsageError,
    add_input_arguments,
    command_parser,
    duration,
    open_backend,
    require_spans,
)

if TYPE_CHECKING:
    from kvaudit.analyse.audit import Finding
    from kvaudit.backends import Backend


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "audit",
        SUMMARIES["audit"],
        "kvaudit audit traces/ --format json > findings.jsonl\n"
        "  kvaudit audit --backend clickhouse://localhost:8123/otel --by-day   # a fleet, in bounded memory\n"
        "  kvaudit audit fleet/ --by-day --list-partitions \\\n"
        "    | xargs -P4 -I{} kvaudit audit fleet/ --by-day --partition {} --format json   # in parallel",
    )
    add_input_arguments(parser)
    parser.add_argument("--format", choices=("table", "json"), default="table")
    partitions = parser.add_argument_group("a partition at a time (kvaudit.analyse.audit_partitions)")
    partitions.add_argument(
        "--by-day",
        action="store_true",
        help="audit the fetched pages a UTC day at a time (split into key-hash buckets beyond --partition-rows),"
        " in memory that follows a partition rather than the traces",
    )
    partitions.add_argument(
        "--lookback",
        type=duration,
        default=None,
        help="with --by-day: stores this far either side of a day count as its producers (default 1d)",
    )
    partitions.add_argument(
        "--partition-rows",
        type=int,
        default=None,
        metavar="N",
        help="with --by-day: at most this many fetched pages per partition (default 20000000)",
    )
    partitions.add_argument(
        "--list-partitions",
        action="store_true",
        help="with --by-day: print the partitions, one a line (`traces` for the rules over all spans), and stop",
    )
    partitions.add_argument(
        "--partition",
        metavar="NAME",
        help="with --by-day: audit this partition only (a name --list-partitions prints), as one node of a cluster",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    partitioned = (args.lookback, args.partition_rows, args.partition)
    if not args.by_day and (args.list_partitions or any(value is not None for value in partitioned)):
        raise UsageError("--lookback, --partition-rows, --list-partitions and --partition go with --by-day")
    from kvaudit.analyse.audit import run_audit
    from kvaudit.present.findings import write_json, write_table

    with open_backend(args.backend, args.paths, store=args.store) as backend:
        require_spans(backend)
        findings = _by_day(args, backend) if args.by_day else run_audit(backend, skew_s=args.skew)
    if findings is None:
        return 0
    if args.format == "json":
        write_json(findings, sys.stdout)
    else:
        write_table(findings, sys.stdout)
    return exit_status(findings)


def _by_day(args: argparse.Namespace, backend: Backend) -> list[Finding] | None:
    """The findings of the audit a partition at a time, or of one partition; None where the partitions were listed."""
    from kvaudit.analyse import audit_partitions

    lookback_s = audit_partitions.LOOKBACK_S if args.lookback is None else args.lookback
    rows = args.partition_rows or audit_partitions.ROWS_PER_PARTITION
    if args.list_partitions:
        plan = audit_partitions.plan(backend, rows_per_partition=rows)
        print("\n".join([audit_partitions.TRACES, *map(str, plan)]))
        return None
    if args.partition is not None:
        return audit_partitions.audit_partition(backend, args.partition, skew_s=args.skew, lookback_s=lookback_s)
    return audit_partitions.run_audit_by_partition(
        backend, skew_s=args.skew, lookback_s=lookback_s, rows_per_partition=rows
    )


def exit_status(findings: list[Finding]) -> int:
    return 1 if any(f.severity in ("critical", "warning") for f in findings) else 0
