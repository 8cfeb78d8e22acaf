"""`kvaudit exporter`: serve figures derived from trace files (or ClickHouse) on /metrics for Prometheus."""

from __future__ import annotations

import argparse
import threading
from typing import TYPE_CHECKING

from kvaudit.commands.arguments import TRACE_PATHS_HELP, add_input_arguments, command_parser, open_backend

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from kvaudit.backends import Backend


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "exporter",
        "Serve hit rates, cross-replica reuse, fetch bytes and latency from trace files on /metrics.",
        "kvaudit exporter traces/ --port 9464   # then scrape http://HOST:9464/metrics",
    )
    add_input_arguments(parser, paths_help=f"{TRACE_PATHS_HELP} (trace files are read as they grow)")
    parser.add_argument("--port", type=int, default=9464, help="port to listen on (default 9464, 0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.set_defaults(run=run)


def serve(backend: Backend, host: str, port: int, *, skew_s: float = 1.0) -> tuple[WSGIServer, int]:
    """Start serving /metrics in a background thread; returns the server and its port."""
    from prometheus_client import CollectorRegistry, start_http_server

    from kvaudit.present.metrics import TraceMetrics

    registry = CollectorRegistry()
    registry.register(TraceMetrics(backend, skew_s=skew_s))
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server, server.server_port


def run(args: argparse.Namespace) -> int:
    backend = open_backend(args.backend, args.paths, live=True)  # queried at every scrape
    backend.refresh(final=False)  # what is there now, before the first scrape
    _, port = serve(backend, args.host, args.port, skew_s=args.skew)
    print(f"kvaudit exporter: serving http://{args.host}:{port}/metrics", flush=True)
    threading.Event().wait()  # the server thread serves until Ctrl-C
    return 0
