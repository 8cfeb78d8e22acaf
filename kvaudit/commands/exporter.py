"""`kvaudit exporter`: serve figures derived from trace files (or ClickHouse) on /metrics for Prometheus.

It listens at once and reads in the background (`kvaudit.present.exporter_metrics`).

The server itself is `kvaudit.commands.metrics_server` (TLS and bearer tokens as `kvaudit collect`'s).
"""

from __future__ import annotations

import argparse
import sys
import threading

from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import (
    TRACE_PATHS_HELP,
    UsageError,
    add_input_arguments,
    command_parser,
    open_backend,
)
from kvaudit.commands.tls_auth import add_tls_auth_arguments, exposure_warning, server_security
from kvaudit.errors import user_files


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "exporter",
        SUMMARIES["exporter"],
        "kvaudit exporter traces/ --port 9464   # then scrape http://HOST:9464/metrics",
    )
    add_input_arguments(parser, paths_help=f"{TRACE_PATHS_HELP} (trace files are read as they grow)")
    parser.add_argument("--port", type=int, default=9464, help="port to listen on (default 9464, 0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--analyse-every",
        type=float,
        metavar="SECONDS",
        help="bring the audit's findings and the reuse left up to date at most this often"
        " (default 60; the other counters add what arrives as it is read)",
    )
    add_tls_auth_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvaudit.commands.metrics_server import serve

    security = server_security(args)
    if args.analyse_every is not None and args.analyse_every < 0:
        raise UsageError("--analyse-every: not a number of seconds")
    # Nothing is read before it listens: it serves what it has read so far, and says how far behind it is.
    backend = open_backend(args.backend, args.paths, store=args.store, live=True)
    with user_files():  # the address and port asked for
        _, port = serve(
            backend,
            args.host,
            args.port,
            skew_s=args.skew,
            security=security,
            **({} if args.analyse_every is None else {"analyse_every_s": args.analyse_every}),
        )
    print(f"kvaudit exporter: serving {security.scheme}://{args.host}:{port}/metrics", flush=True)
    warning = exposure_warning(args.host, security)
    if warning:
        print(f"kvaudit exporter: warning: {warning}", file=sys.stderr, flush=True)
    threading.Event().wait()  # the server thread serves until Ctrl-C
    return 0
