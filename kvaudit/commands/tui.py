"""`kvaudit tui`: the live terminal view, or `--snapshot` for its figures as JSON."""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import (
    TRACE_PATHS_HELP,
    UsageError,
    add_backend_option,
    add_rule_timeout_option,
    add_skew_option,
    command_parser,
    duration,
    open_backend,
    rule_timeout,
)
from kvaudit.errors import InputError, user_files
from kvaudit.safe_text import json_safe
from kvaudit.tui.window import DEFAULT_WINDOW, WINDOWS, window_named

DEFAULT_COLLECT = "127.0.0.1:4318"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "tui",
        SUMMARIES["tui"],
        "kvaudit tui traces/        |  kvaudit tui --collect 0.0.0.0:4318 --out traces/"
        "  |  kvaudit tui traces/ --snapshot",
    )
    parser.add_argument(
        "paths", nargs="*", metavar="PATH", help=f"{TRACE_PATHS_HELP} (trace files are read as they grow)"
    )
    add_backend_option(parser)
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
    parser.add_argument(
        "--rules",
        metavar="FILE",
        help="alert rule file whose pending and firing alerts to show (default: the default rule pack)",
    )
    add_rule_timeout_option(parser)
    parser.add_argument("--snapshot", action="store_true", help="print the figures once as JSON and exit")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import msgspec

    from kvaudit.analyse.live_audit import LiveAudit
    from kvaudit.receive.otlp_http import CollectorServer, parse_address
    from kvaudit.receive.trace_sink import TraceSink
    from kvaudit.tui.alerting import rule_alerting
    from kvaudit.tui.source import LiveSource, snapshot

    if sum(map(bool, (args.paths, args.collect, args.backend))) != 1:
        raise UsageError("give trace PATHs, --collect [ADDR] or --backend URL, one of the three")
    window = window_named(args.window)
    if args.rules and not Path(args.rules).is_file():
        raise InputError(f"{args.rules}: no such rule file")
    audit = LiveAudit(skew_s=args.skew)  # the findings panel's, which the rules read too
    # The default pack without --rules.
    alerting = rule_alerting(args.rules, skew_s=args.skew, timeout_s=rule_timeout(args), audit=audit)
    with ExitStack() as stack:
        if args.collect:
            with user_files():
                server = CollectorServer(parse_address(args.collect), TraceSink(args.out)).start()
            stack.callback(server.stop)
            paths, watching = [args.out], f"receiving on {server.url}/v1/traces → {args.out}"
        else:
            paths, watching = args.paths, " ".join(args.paths) or args.backend
        # A live view reads in the app's worker thread, one decoding thread beside the screen's,
        # and the app shows before a long first read ends; a snapshot reads whole, at once.
        backend = open_backend(args.backend, paths, store=args.store, live=not args.snapshot, workers=1)
        if not args.snapshot and not sys.stdout.isatty():
            # Textual would draw its screen into a file or a pipe until killed.
            backend.close()
            raise UsageError(
                "stdout is not a terminal: the live view needs one (--snapshot prints its figures as JSON)"
            )
        source = LiveSource(backend, auditor=audit, alerting=alerting, alerts_source=alerting.name, skew_s=args.skew)
        stack.callback(source.close)
        if args.snapshot:
            encoder = msgspec.json.Encoder(enc_hook=str)  # a finding's field values may be any type
            sys.stdout.write(json_safe(encoder.encode(snapshot(source, window)).decode()) + "\n")
            return 0
        from kvaudit.tui.app import KvauditApp  # Textual loads only for the live view

        KvauditApp(source, watching=watching, window=window, interval_s=args.interval).run()
    return 0
