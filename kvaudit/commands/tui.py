"""`kvaudit tui`: the live terminal view, or `--snapshot` for its figures as JSON."""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

import msgspec

from kvaudit.commands.arguments import UsageError, add_skew_option, command_parser, duration
from kvaudit.read.open import open_store
from kvaudit.read.store import TraceStore
from kvaudit.receive.otlp_http import CollectorServer, parse_address
from kvaudit.receive.trace_sink import TraceSink
from kvaudit.tui.alerting import rule_alerting
from kvaudit.tui.findings import installed_auditor
from kvaudit.tui.source import NO_ALERTING, NO_RULES, LiveSource, snapshot
from kvaudit.tui.window import DEFAULT_WINDOW, WINDOWS, window_named

DEFAULT_COLLECT = "127.0.0.1:4318"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "tui",
        "Watch trace files (or what an in-process receiver gets) live: reuse, transfer, findings, alerts.",
        "kvaudit tui traces/        |  kvaudit tui --collect 0.0.0.0:4318 --out traces/"
        "  |  kvaudit tui traces/ --snapshot",
    )
    parser.add_argument(
        "paths", nargs="*", metavar="PATH", help="trace files, directories or globs (read as they grow)"
    )
    parser.add_argument(
        "--collect",
        nargs="?",
        const=DEFAULT_COLLECT,
        metavar="ADDR",
        help=f"run the OTLP/HTTP receiver in-process on ADDR (default {DEFAULT_COLLECT}) and watch what it writes",
    )
    parser.add_argument("--out", default="traces", help="directory the receiver writes to (with --collect)")
    parser.add_argument(
        "--window", choices=[w.name for w in WINDOWS], default=DEFAULT_WINDOW.name, help="initial time window"
    )
    parser.add_argument("--interval", type=duration, default=1.0, help="time between reads of the traces (default 1s)")
    add_skew_option(parser)
    parser.add_argument("--rules", metavar="FILE", help="alert rule file whose pending and firing alerts to show")
    parser.add_argument("--snapshot", action="store_true", help="print the figures once as JSON and exit")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if bool(args.paths) == bool(args.collect):
        raise UsageError("give trace PATHs or --collect [ADDR], one of the two")
    window = window_named(args.window)
    if args.rules and not Path(args.rules).is_file():
        raise FileNotFoundError(f"{args.rules}: no such rule file")
    with ExitStack() as stack:
        if args.collect:
            server = CollectorServer(parse_address(args.collect), TraceSink(args.out)).start()
            stack.callback(server.stop)
            paths, watching = [args.out], f"receiving on {server.url}/v1/traces → {args.out}"
        else:
            paths, watching = args.paths, " ".join(args.paths)
        alerting = rule_alerting(args.rules) if args.rules else None
        source = LiveSource(
            _store(paths, one_shot=args.snapshot),
            auditor=installed_auditor(args.skew),
            alerting=alerting,
            alerts_note=NO_ALERTING if args.rules else NO_RULES,
            skew_s=args.skew,
        )
        stack.callback(source.close)
        if args.snapshot:
            encoder = msgspec.json.Encoder(enc_hook=str)  # a finding's field values may be any type
            sys.stdout.write(encoder.encode(snapshot(source, window)).decode() + "\n")
            return 0
        from kvaudit.tui.app import KvauditApp  # Textual loads only for the live view

        KvauditApp(source, watching=watching, window=window, interval_s=args.interval).run()
    return 0


def _store(paths: list[str], *, one_shot: bool) -> TraceStore:
    if one_shot or any(path.endswith(".duckdb") for path in paths):
        return open_store(paths)  # read whole now (in parallel), or a database written by `kvaudit ingest`
    # A live store reads in the app's worker thread, in this process: forking decoders from
    # a process with threads can deadlock them, and the app must show before a long first read ends.
    # Its rows go into DuckDB's tables: each refresh queries a recent window of them again.
    return TraceStore(paths, ":memory:", workers=1)
