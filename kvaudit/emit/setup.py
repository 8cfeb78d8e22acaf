"""Setting emission up in a process: its resource, its exporter, and `setup_emitter`, the one call a hook makes.

    emitter = setup_emitter("r1", "file:traces/r1.jsonl", engine="vllm", kv=KVConfig(...))

What a process emits is `kvaudit.emit.emitter`'s; this module only decides where it
goes and what the process says of itself, from its arguments and the environment
(`KVAUDIT_EXPORT`, `KVAUDIT_SHUTDOWN_TIMEOUT`, OpenTelemetry's own variables).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Sequence
from typing import Any, Final

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from kvaudit.contract import SCHEMA_VERSION, TRACER_NAME, KVConfig, Res
from kvaudit.durations import parse_duration
from kvaudit.emit.emitter import DEFAULT_SHUTDOWN_TIMEOUT_S, Emitter
from kvaudit.emit.span_batcher import SpanBatcher

logger = logging.getLogger(__name__)

ENV_EXPORT: Final = "KVAUDIT_EXPORT"
ENV_SHUTDOWN_TIMEOUT: Final = "KVAUDIT_SHUTDOWN_TIMEOUT"
MAX_SHUTDOWN_TIMEOUT_S: Final = 300.0


def replica_resource(
    replica: str,
    *,
    engine: str | None = None,
    engine_version: str | None = None,
    service_name: str | None = None,
    kv: KVConfig | None = None,
    sample_rate: float = 1.0,
) -> Resource:
    """The resource of one process of a replica; `OTEL_RESOURCE_ATTRIBUTES` is merged in.
    `sample_rate`: the share of requests it records, declared where it is below 1."""
    attrs: dict[str, Any] = {
        Res.SERVICE_NAME: service_name or engine or TRACER_NAME,
        Res.REPLICA: replica,
        Res.SCHEMA: SCHEMA_VERSION,
        Res.PROCESS_PID: os.getpid(),
        Res.PROCESS_CREATION_TIME: process_started(),
    }
    for name, value in ((Res.ENGINE, engine), (Res.ENGINE_VERSION, engine_version)):
        if value is not None:
            attrs[name] = value
    if kv is not None:
        attrs.update(kv.to_attributes())
    if sample_rate < 1.0:
        attrs[Res.SAMPLE_RATE] = sample_rate
    return Resource.create(attrs)


# When each process started, by pid: every emitter of a process declares the same time, and a
# forked child its own.
_STARTED: dict[int, str] = {}


def process_started() -> str:
    """When this process started, ISO 8601 in UTC to the millisecond (`process.creation.time`):
    from /proc on Linux, elsewhere (or where /proc cannot be read) the time it first asked."""
    pid = os.getpid()
    if pid not in _STARTED:
        seconds = _proc_start_time()
        moment = dt.datetime.fromtimestamp(time.time() if seconds is None else seconds, dt.UTC)
        _STARTED[pid] = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return _STARTED[pid]


def _proc_start_time() -> float | None:
    """The process's start in seconds since the epoch: the boot time plus its start in clock ticks after boot."""
    try:
        with open("/proc/self/stat") as stat:
            # Field 22, counted after the command name, which may hold spaces and parentheses.
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as machine:
            boot = next(int(line.split()[1]) for line in machine if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def exporter_for(export: str | None, replica: str) -> SpanExporter:
    """The span exporter for an export spec.

    Args:
        export: `file:PATH` (OTLP JSON lines; `{replica}` and `{pid}` are expanded),
            `otlp:URL` (OTLP/HTTP, protobuf), or None to read `KVAUDIT_EXPORT`, then
            the standard `OTEL_EXPORTER_OTLP_*` variables (OTLP/HTTP to localhost:4318
            when none is set, as every OpenTelemetry exporter does).
        replica: the replica id, for `{replica}` in a path.

    Raises:
        ValueError: the spec names no known destination.
    """
    spec = export or os.environ.get(ENV_EXPORT)
    if spec is None or spec.startswith("otlp:"):
        from kvaudit.emit.otlp_http_exporter import OTLPHttpExporter

        if spec is None:
            return OTLPHttpExporter()
        url = spec.removeprefix("otlp:")
        return OTLPHttpExporter(
            endpoint=url if url.rstrip("/").endswith("/v1/traces") else url.rstrip("/") + "/v1/traces"
        )
    if spec.startswith("file:"):
        from kvaudit.emit.file_exporter import OTLPJsonFileExporter

        return OTLPJsonFileExporter(spec.removeprefix("file:").replace("{replica}", replica))
    raise ValueError(f"kvaudit export {spec!r}: expected file:PATH or otlp:URL")


class _Unavailable(SpanExporter):
    """Where spans go when their destination could not be set up: every export fails, and is counted."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass


def shutdown_timeout_from_env(default: float = DEFAULT_SHUTDOWN_TIMEOUT_S) -> float:
    """`KVAUDIT_SHUTDOWN_TIMEOUT` (a duration: `5s`, `500ms`) if set and valid (at most
    MAX_SHUTDOWN_TIMEOUT_S), else `default`."""
    text = os.environ.get(ENV_SHUTDOWN_TIMEOUT)
    if not text:
        return default
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        logger.warning("kvaudit: %s=%r ignored (%s); using %ss", ENV_SHUTDOWN_TIMEOUT, text, exc, default)
        return default
    if seconds > MAX_SHUTDOWN_TIMEOUT_S:
        # A serving process must still exit: a shutdown longer than this is no longer a bound.
        logger.warning("kvaudit: %s=%r capped at %ss", ENV_SHUTDOWN_TIMEOUT, text, MAX_SHUTDOWN_TIMEOUT_S)
        return MAX_SHUTDOWN_TIMEOUT_S
    return seconds


def setup_emitter(
    replica: str,
    export: str | None = None,
    *,
    engine: str | None = None,
    engine_version: str | None = None,
    service_name: str | None = None,
    kv: KVConfig | None = None,
    sample_rate: float = 1.0,
    max_queue_spans: int = 8192,
    export_delay_s: float = 1.0,
    shutdown_timeout_s: float | None = None,
) -> Emitter:
    """One call from a hook: an emitter for `replica` exporting to `export` (see `exporter_for`).

    A destination that cannot be set up (a bad spec, an exporter that fails to build)
    never raises into the serving process: it is logged once, emission turns itself
    off, and every span it is given is counted as dropped. A trace file that cannot be
    opened yet is retried at each export. `shutdown_timeout_s` defaults to
    `KVAUDIT_SHUTDOWN_TIMEOUT`, else 5 s.

    Raises:
        ValueError: empty replica id.
    """
    if not replica:
        raise ValueError("kvaudit needs a replica id (service.instance.id)")
    resource = replica_resource(
        replica, engine=engine, engine_version=engine_version, service_name=service_name, kv=kv, sample_rate=sample_rate
    )
    exporter: SpanExporter
    try:
        exporter = exporter_for(export, replica)
    except Exception as exc:
        logger.error("kvaudit: replica %s: no trace destination (%s); emission is off, spans are counted", replica, exc)
        exporter = _Unavailable()
    batcher = SpanBatcher(exporter, max_queue=max_queue_spans, delay_s=export_delay_s)
    if shutdown_timeout_s is None:
        shutdown_timeout_s = shutdown_timeout_from_env()
    return Emitter(resource, batcher, shutdown_timeout_s=shutdown_timeout_s)
