"""`kvaudit audit`: rules KVA001-KVA007 over trace files; the exit status says how bad."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from kvaudit.commands.arguments import add_input_arguments, command_parser, open_backend, require_spans

if TYPE_CHECKING:
    from kvaudit.analyse.audit import Finding


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


def run(args: argparse.Namespace) -> int:
    from kvaudit.analyse.audit import run_audit
    from kvaudit.present.findings import write_json, write_table

    with open_backend(args.backend, args.paths) as backend:
        require_spans(backend)
        findings = run_audit(backend, skew_s=args.skew)
    if args.format == "json":
        write_json(findings, sys.stdout)
    else:
        write_table(findings, sys.stdout)
    return exit_status(findings)


def exit_status(findings: list[Finding]) -> int:
    return 1 if any(f.severity in ("critical", "warning") for f in findings) else 0
