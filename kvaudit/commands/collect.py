"""`kvaudit collect`: receive OTLP/HTTP traces from replicas and write them as trace files.

With `--kv-events` it also subscribes to vLLM KV event publishers and writes their
events into the same per-replica files (see `kvaudit.kv_events`).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import TYPE_CHECKING

from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import UsageError, command_parser, duration
from kvaudit.commands.exit_status import ExitStatus
from kvaudit.commands.tls_auth import add_tls_auth_arguments, exposure_warning, server_security
from kvaudit.contract import KVConfig
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import replica_resource
from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.errors import user_files
from kvaudit.receive.otlp_http import CollectorServer, ReceiverLimits, parse_address, system_backlog
from kvaudit.receive.sink_exporter import SinkExporter
from kvaudit.receive.trace_sink import DEFAULT_MAX_OPEN_FILES, TraceSink

_DEFAULTS = ReceiverLimits()

if TYPE_CHECKING:
    from kvaudit.kv_events.subscriber import Source

KV_EVENTS_SERVICE = "kvaudit-kv-events"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "collect",
        SUMMARIES["collect"],
        "kvaudit collect --out traces/ 127.0.0.1:4318   # then point replicas at otlp:http://127.0.0.1:4318\n"
        "  kvaudit collect --out traces/ --kv-events tcp://10.0.0.5:5557 --kv-events-replay tcp://10.0.0.5:5558 "
        "--replica r1",
    )
    parser.add_argument(
        "address", nargs="?", default="127.0.0.1:4318", help="HOST:PORT to bind (default 127.0.0.1:4318)"
    )
    parser.add_argument("--out", default="traces", help="directory for the trace files (default: traces)")
    parser.add_argument("--no-fsync", action="store_true", help="acknowledge once written, without waiting for fsync")
    add_limit_arguments(parser)
    add_tls_auth_arguments(parser)
    events = parser.add_argument_group("vLLM KV events (the GPU tier of each replica)")
    events.add_argument(
        "--kv-events",
        metavar="ENDPOINT[,...]",
        help="vLLM KV event publishers (their --kv-events-config endpoint): tcp://HOST:PORT connects to a vLLM "
        "that binds tcp://*:PORT; tcp://*:PORT binds for a vLLM that connects here. One publisher per endpoint.",
    )
    events.add_argument(
        "--replica", metavar="NAME[,...]", help="replica id of the publishers: one for all, or one per endpoint"
    )
    events.add_argument(
        "--kv-events-replay",
        metavar="ENDPOINT[,...]",
        help="the publishers' replay_endpoint, one per endpoint ('-' for none): missed batches are fetched from it",
    )
    events.add_argument("--kv-events-topic", default="", help="the publishers' topic (default: all)")
    events.add_argument(
        "--kv-hash-algo",
        metavar="ALGO",
        help="vLLM's prefix_caching_hash_algo, recorded as the pages' hash_algo (the events do not say)",
    )
    parser.set_defaults(run=run)


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The receiver's bounds (docs/operations.md, "Receiving"), named after confighttp and memory_limiter."""
    limits = parser.add_argument_group("limits (docs/operations.md)")
    limits.add_argument(
        "--max-request-body-size",
        "--max-body",
        type=int,
        default=_DEFAULTS.max_body,
        metavar="BYTES",
        help=f"largest body after decompression (default {_DEFAULTS.max_body >> 20} MiB)",
    )
    limits.add_argument(
        "--memory-limit-mib",
        type=int,
        default=_DEFAULTS.memory_limit >> 20,
        metavar="MIB",
        help=f"memory requests in flight may hold; past it 503 (default {_DEFAULTS.memory_limit >> 20}, 0: none)",
    )
    for name, default, what in (
        ("read-header-timeout", _DEFAULTS.read_header_timeout_s, "from a request's first byte to its last header"),
        ("read-timeout", _DEFAULTS.read_timeout_s, "from a request's first byte to the end of its body"),
        ("idle-timeout", _DEFAULTS.idle_timeout_s, "a kept-alive connection's wait for its next request"),
        ("write-timeout", _DEFAULTS.write_timeout_s, "sending a response"),
    ):
        limits.add_argument(
            f"--{name}", type=duration, default=default, metavar="DURATION", help=f"{what} (default {default:g}s)"
        )
    limits.add_argument(
        "--max-connections",
        type=int,
        default=_DEFAULTS.max_connections,
        help=f"connections served at once; more are answered 503 (default {_DEFAULTS.max_connections})",
    )
    limits.add_argument(
        "--backlog", type=int, default=0, help=f"listen backlog (default: the system's, {system_backlog()})"
    )
    limits.add_argument(
        "--max-open-files",
        type=int,
        default=DEFAULT_MAX_OPEN_FILES,
        help=f"trace files kept open; the least recently used is closed (default {DEFAULT_MAX_OPEN_FILES})",
    )


def receiver_limits(args: argparse.Namespace) -> ReceiverLimits:
    """The limits the flags set.

    Raises:
        UsageError: a size or count that cannot work.
    """
    for flag, value in (
        ("--max-request-body-size", args.max_request_body_size),
        ("--max-connections", args.max_connections),
        ("--max-open-files", args.max_open_files),
    ):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1")
    if args.memory_limit_mib < 0 or args.backlog < 0:
        raise UsageError("--memory-limit-mib and --backlog cannot be negative")
    return ReceiverLimits(
        max_body=args.max_request_body_size,
        memory_limit=args.memory_limit_mib << 20,
        read_header_timeout_s=args.read_header_timeout,
        read_timeout_s=args.read_timeout,
        idle_timeout_s=args.idle_timeout,
        write_timeout_s=args.write_timeout,
        max_connections=args.max_connections,
        backlog=args.backlog,
    )


def kv_event_sources(endpoints: str, replicas: str | None, replays: str | None, topic: str) -> list[Source]:
    """The publishers named on the command line.

    Raises:
        UsageError: no replica id, or lists of different lengths.
    """
    from kvaudit.kv_events.subscriber import Source  # pyzmq: the analysis extra's

    endpoint_list = _split(endpoints)
    replica_list = _split(replicas or "")
    if not replica_list:
        raise UsageError("--kv-events needs --replica (the replica id its spans carry)")
    if len(replica_list) == 1:
        replica_list *= len(endpoint_list)
    replay_list: list[str | None] = [None if r == "-" else r for r in _split(replays or "")] or [None] * len(
        endpoint_list
    )
    if not len(endpoint_list) == len(replica_list) == len(replay_list):
        raise UsageError("--replica and --kv-events-replay need one entry per --kv-events endpoint")
    return [Source(e, r, p, topic) for e, r, p in zip(endpoint_list, replica_list, replay_list)]


class _Terminated(KeyboardInterrupt):
    """SIGTERM: ended as on Ctrl-C, with its own exit status."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def run(args: argparse.Namespace) -> int:
    sources = (
        kv_event_sources(args.kv_events, args.replica, args.kv_events_replay, args.kv_events_topic)
        if args.kv_events
        else []
    )
    limits = receiver_limits(args)
    security = server_security(args)
    host, port = parse_address(args.address)
    with user_files():
        sink = TraceSink(args.out, fsync=not args.no_fsync, max_open_files=args.max_open_files)
        server = CollectorServer((host, port), sink, limits=limits, security=security)
    print(f"kvaudit collect: listening on {server.url}/v1/traces, writing {sink.directory}/<replica>.jsonl", flush=True)
    warning = exposure_warning(host, security)
    if warning:
        print(f"kvaudit collect: warning: {warning}", file=sys.stderr, flush=True)
    emitters: dict[str, Emitter] = {}

    def emitter_for(replica: str) -> Emitter:
        if replica not in emitters:
            resource = replica_resource(
                replica, engine="vllm", service_name=KV_EVENTS_SERVICE, kv=KVConfig(hash_algo=args.kv_hash_algo)
            )
            emitters[replica] = Emitter(resource, SpanBatcher(SinkExporter(sink)))
        return emitters[replica]

    # A supervisor stops it with SIGTERM: end as on Ctrl-C, writing out what is still queued.
    signal.signal(signal.SIGTERM, _terminate)
    subscriber = None
    status = ExitStatus.OK
    try:
        if sources:
            import zmq

            from kvaudit.kv_events.subscriber import KVEventSubscriber

            try:
                subscriber = KVEventSubscriber(sources, emitter_for, hash_algo=args.kv_hash_algo)
            except zmq.ZMQError as exc:
                raise UsageError(f"--kv-events: {exc}") from None
            print(f"kvaudit collect: subscribed to KV events of {', '.join(s.endpoint for s in sources)}", flush=True)
            server.start()
            subscriber.run(threading.Event())
        else:
            server.serve_forever()
    except KeyboardInterrupt as exc:
        # Stopped, not done: as the other commands, 130 on Ctrl-C; 143 on SIGTERM, as shells report it.
        status = ExitStatus.TERMINATED if isinstance(exc, _Terminated) else ExitStatus.INTERRUPTED
    finally:
        if subscriber is not None:
            subscriber.close()
            stats = subscriber.stats
            print(
                f"kvaudit collect: KV events: {stats.batches} batches ({stats.replayed} replayed), "
                f"{stats.gaps} gaps, {stats.lost} batches lost"
            )
        for emitter in emitters.values():
            emitter.shutdown()
        if subscriber is not None:
            server.stop()
        else:
            server.server_close()
            sink.close()
        print(f"kvaudit collect: {sink.stats.summary()}")
        lost = sink.lost_spans
        if lost:
            print(
                f"kvaudit collect: {lost} acknowledged spans were in files deleted under the receiver", file=sys.stderr
            )
    return status
