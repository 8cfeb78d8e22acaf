"""`kvaudit collect`: receive OTLP/HTTP traces from replicas and write them as trace files."""

from __future__ import annotations

import argparse

from kvaudit.cli import command_parser
from kvaudit.collector import DEFAULT_MAX_BODY, CollectorServer, TraceSink, parse_address


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "collect",
        "Receive OTLP/HTTP traces (POST /v1/traces) and write one OTLP JSON lines file per replica.",
        "kvaudit collect --out traces/ 127.0.0.1:4318   # then point replicas at otlp:http://127.0.0.1:4318",
    )
    parser.add_argument(
        "address", nargs="?", default="127.0.0.1:4318", help="HOST:PORT to bind (default 127.0.0.1:4318)"
    )
    parser.add_argument("--out", default="traces", help="directory for the trace files (default: traces)")
    parser.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY, help="largest accepted body in bytes")
    parser.add_argument("--no-fsync", action="store_true", help="acknowledge once written, without waiting for fsync")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    sink = TraceSink(args.out, fsync=not args.no_fsync)
    server = CollectorServer(parse_address(args.address), sink, max_body=args.max_body)
    print(f"kvaudit collect: listening on {server.url}/v1/traces, writing {sink.directory}/<replica>.jsonl", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sink.close()
        stats = sink.stats
        print(f"kvaudit collect: {stats.requests} requests, {stats.spans} spans written, {stats.rejected} rejected")
    return 0
