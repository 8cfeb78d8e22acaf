"""`kvaudit exporter`: serve figures derived from trace files on /metrics for Prometheus."""

from __future__ import annotations

import argparse
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from kvaudit.commands.arguments import command_parser
from kvaudit.present.metrics import TraceMetrics
from kvaudit.read.open import open_store
from kvaudit.read.store import TraceStore


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "exporter",
        "Serve hit rates, cross-replica reuse, fetch bytes and latency from trace files on /metrics.",
        "kvaudit exporter traces/ --port 9464   # then scrape http://HOST:9464/metrics",
    )
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="trace files, directories, globs, or one .duckdb from `kvaudit ingest`"
    )
    parser.add_argument("--port", type=int, default=9464, help="port to listen on (default 9464, 0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.set_defaults(run=run)


def serve(store: TraceStore, host: str, port: int) -> tuple[WSGIServer, int]:
    """Start serving /metrics in a background thread; returns the server and its port."""
    registry = CollectorRegistry()
    registry.register(TraceMetrics(store))
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server, server.server_port


def run(args: argparse.Namespace) -> int:
    store = open_store(args.paths, database=":memory:")  # queried at every scrape: DuckDB's own tables
    _, port = serve(store, args.host, args.port)
    print(f"kvaudit exporter: serving http://{args.host}:{port}/metrics", flush=True)
    threading.Event().wait()  # the server thread serves until Ctrl-C
    return 0
