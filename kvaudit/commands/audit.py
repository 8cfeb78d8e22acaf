"""`kvaudit audit`: rules KVA001-KVA007 over trace files; the exit status says how bad."""

from __future__ import annotations

import argparse
import sys

from kvaudit.audit import Finding, run_audit
from kvaudit.backends import Backend, add_backend_option, open_backend
from kvaudit.cli import UsageError, command_parser
from kvaudit.durations import parse_duration
from kvaudit.findings_output import write_json, write_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "audit",
        "Check fetched KV pages against the trace contract and their producers (rules KVA001-KVA007). "
        "Exit status: 0 nothing at warning or above, 1 warnings or critical findings, 2 unusable input.",
        "kvaudit audit traces/ --format json > findings.jsonl",
    )
    add_input_arguments(parser)
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.set_defaults(run=run)


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """The trace paths and the clock skew: what every command built on the auditor reads."""
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="trace files, directories, globs, one .duckdb from `kvaudit ingest`, or a Parquet directory",
    )
    add_backend_option(parser)
    parser.add_argument(
        "--skew", type=parse_duration, default=1.0, help="clock skew allowed between replicas (default 1s)"
    )


def run(args: argparse.Namespace) -> int:
    with open_backend(args.backend, args.paths) as backend:
        require_spans(backend)
        findings = run_audit(backend, skew_s=args.skew)
    if args.format == "json":
        write_json(findings, sys.stdout)
    else:
        write_table(findings, sys.stdout)
    return exit_status(findings)


def require_spans(backend: Backend) -> None:
    """Raise UsageError when the input holds no spans at all: nothing to audit is unusable input."""
    _, [(spans, errors)] = backend.query("SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM read_errors)")
    if not spans:
        raise UsageError(f"no spans to audit ({errors} unreadable lines)")


def exit_status(findings: list[Finding]) -> int:
    return 1 if any(f.severity in ("critical", "warning") for f in findings) else 0
