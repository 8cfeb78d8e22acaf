"""What the hooks call to emit kvaudit spans and page descriptors.

    emitter = setup_emitter("r1", "file:traces/r1.jsonl", engine="vllm", kv=KVConfig(...))
    with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id=rid) as op:
        op.add_page(PageDescriptor(key=..., used=True))
        op.end(Outcome.HIT, tokens_hit=256)

The hot path only records: `add_page` appends a struct, `end` builds one SDK
`ReadableSpan` whose page events turn into attributes lazily, when the background
exporter encodes them. Everything here fails open: an exception inside emission is
counted (and reported in a `kvaudit.telemetry` span) and never reaches the caller.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from kvaudit import __version__
from kvaudit.contract import (
    EVENT_PAGE,
    SCHEMA_VERSION,
    TRACER_NAME,
    Hook,
    KVConfig,
    Op,
    Outcome,
    PageDescriptor,
    Res,
    SpanAttr,
    TelemetryAttr,
)
from kvaudit.emit.span_batcher import SpanBatcher

logger = logging.getLogger(__name__)

ENV_EXPORT: Final = "KVAUDIT_EXPORT"
_SCOPE = InstrumentationScope(TRACER_NAME, __version__)
_OK = Status(StatusCode.UNSET)
_ERROR = Status(StatusCode.ERROR)


class PageEvent(Event):
    """A `kvaudit.page` span event whose attributes are built when first read.

    Building the attribute mapping costs more than recording the descriptor, so it
    is left to the exporter thread.
    """

    __slots__ = ("page",)

    def __init__(self, page: PageDescriptor, timestamp: int) -> None:
        super().__init__(EVENT_PAGE, None, timestamp)
        self.page = page

    @property
    def attributes(self) -> dict[str, Any]:  # type: ignore[override]
        return self.page.to_attributes()


@dataclass
class EmitterStats:
    """Counts of what emission could not do; all cumulative for the process."""

    errors: int = 0
    dropped_spans: int = 0
    failed_exports: int = 0
    exported_spans: int = 0
    lost_batches: int = 0


class Operation:
    """One kvaudit operation on one request: becomes one span when it ends."""

    __slots__ = ("_at", "_attrs", "_emitter", "_ended", "_op", "_pages", "_parent", "_start", "context")

    def __init__(
        self,
        emitter: Emitter,
        op: Op,
        attrs: dict[str, Any],
        parent: SpanContext | None,
        at_ns: int | None = None,
        start_ns: int | None = None,
    ) -> None:
        self._emitter = emitter
        self._op = op
        self._attrs = attrs
        self._pages: list[PageEvent] = []
        self._parent = parent
        # The span's own context, known from the start: operations of a layer below
        # (LMCache under vLLM) that run inside this one name it as their parent.
        self.context: SpanContext = emitter._new_context(parent)
        self._ended = False
        self._at = at_ns
        if start_ns is None:
            start_ns = time.time_ns() if at_ns is None else at_ns
        self._start = start_ns

    def add_page(self, page: PageDescriptor, time_ns: int | None = None) -> None:
        """Record the descriptor of one page this operation stored or fetched (at `time_ns`, default now)."""
        if time_ns is None:
            time_ns = time.time_ns() if self._at is None else self._at
        self._pages.append(PageEvent(page, time_ns))

    def end(
        self,
        outcome: Outcome | None = None,
        *,
        tokens_hit: int | None = None,
        tokens_stored: int | None = None,
        tokens_local: int | None = None,
        pages: int | None = None,
        bytes: int | None = None,  # noqa: A002 - the contract's name
        end_ns: int | None = None,
    ) -> None:
        """Finish the operation at `end_ns` (default now); `pages` and `bytes` default to sums over its pages."""
        if self._ended:
            return
        self._ended = True
        try:
            attrs = self._attrs
            _put(attrs, SpanAttr.OUTCOME, outcome and outcome.value)
            _put(attrs, SpanAttr.TOKENS_HIT, tokens_hit)
            _put(attrs, SpanAttr.TOKENS_STORED, tokens_stored)
            _put(attrs, SpanAttr.TOKENS_LOCAL, tokens_local)
            attrs[SpanAttr.PAGES] = len(self._pages) if pages is None else pages
            attrs[SpanAttr.BYTES] = sum(event.page.bytes or 0 for event in self._pages) if bytes is None else bytes
            if end_ns is None:
                end_ns = time.time_ns() if self._at is None else self._at
            self._emitter._submit(
                self._op.span_name, attrs, self._pages, self._start, end_ns, self.context, self._parent, outcome
            )
        except Exception as exc:
            self._emitter._count_error(exc)

    def __enter__(self) -> Operation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.end(Outcome.ERROR if exc_type is not None else None)


class _NoOperation(Operation):
    """What `operation()` returns when emission itself failed: accepts and ignores."""

    def __init__(self) -> None:
        self.context = trace.INVALID_SPAN_CONTEXT

    def add_page(self, page: PageDescriptor, time_ns: int | None = None) -> None:
        pass

    def end(self, outcome: Outcome | None = None, **_: Any) -> None:
        pass


class Emitter:
    """Turns operations into spans and hands them to a background exporter.

    Args:
        resource: the process's resource (replica id, engine, KV configuration).
        batcher: the queue and thread that export finished spans.
        max_pages_per_span: descriptors kept per span; more are dropped and counted
            in the span's `droppedEventsCount`, never silently.
        telemetry_interval_s: how often, at most, a `kvaudit.telemetry` span reports
            changed loss counts (also on flush and shutdown).
    """

    def __init__(
        self,
        resource: Resource,
        batcher: SpanBatcher,
        *,
        max_pages_per_span: int = 65536,
        telemetry_interval_s: float = 10.0,
    ) -> None:
        self.resource = resource
        self._batcher = batcher
        self._max_pages = max_pages_per_span
        self._telemetry_interval_ns = int(telemetry_interval_s * 1e9)
        self._errors = 0
        self._lost_batches = 0
        self._reported: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._next_report_ns = 0
        self._random = random.Random()

    @property
    def replica(self) -> str:
        return str(self.resource.attributes.get(Res.REPLICA, ""))

    @property
    def stats(self) -> EmitterStats:
        batcher = self._batcher.stats
        return EmitterStats(
            self._errors, batcher.dropped_spans, batcher.failed_exports, batcher.exported_spans, self._lost_batches
        )

    def count_lost_batches(self, batches: int) -> None:
        """Record upstream event batches known missed (reported in the next `kvaudit.telemetry` span)."""
        self._lost_batches += batches
        self._report_telemetry()

    def operation(
        self,
        op: Op,
        *,
        hook: Hook | str,
        request_id: str | None = None,
        backend: str | None = None,
        tokens_requested: int | None = None,
        parent: SpanContext | None = None,
        attributes: dict[str, Any] | None = None,
        at_ns: int | None = None,
        start_ns: int | None = None,
    ) -> Operation:
        """Start an operation; the current span (if any) becomes its parent unless `parent` is given.

        `attributes` are further span attributes (names from the contract, e.g. the
        evict reason). `at_ns` stamps an operation reported after the fact (an
        engine's event stream, possibly replayed late) with the time it happened:
        its span and pages carry that time, and it has no duration. `start_ns` (with
        `end_ns` and each page's `time_ns` further on) stamps every instant on its own:
        a simulator passes its clock, so that simulated time travels the real path.
        """
        try:
            attrs: dict[str, Any] = {SpanAttr.OP: op.value, SpanAttr.HOOK: str(hook)}
            _put(attrs, SpanAttr.REQUEST_ID, request_id)
            _put(attrs, SpanAttr.BACKEND, backend)
            _put(attrs, SpanAttr.TOKENS_REQUESTED, tokens_requested)
            if attributes:
                attrs.update(attributes)
            if parent is None:
                current = trace.get_current_span().get_span_context()
                parent = current if current.is_valid else None
            return Operation(self, op, attrs, parent, at_ns, start_ns)
        except Exception as exc:
            self._count_error(exc)
            return _NoOperation()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export what is queued; False when it did not finish in time (never raises)."""
        try:
            self._report_telemetry(force=True)
            return self._batcher.flush(timeout_s)
        except Exception as exc:
            self._count_error(exc)
            return False

    def shutdown(self, timeout_s: float = 10.0) -> None:
        try:
            self._batcher.flush(timeout_s)
            self._report_telemetry(force=True)
            self._batcher.shutdown(timeout_s)
        except Exception as exc:
            self._count_error(exc)

    def _submit(
        self,
        name: str,
        attrs: dict[str, Any],
        pages: list[PageEvent],
        start: int,
        end: int,
        context: SpanContext,
        parent: SpanContext | None,
        outcome: Outcome | None,
    ) -> None:
        events: list[PageEvent] | BoundedList = pages
        if len(pages) > self._max_pages:
            events = BoundedList.from_seq(self._max_pages, pages)
        self._batcher.submit(
            ReadableSpan(
                name,
                context=context,
                parent=parent,
                resource=self.resource,
                attributes=attrs,
                events=events,
                status=_ERROR if outcome is Outcome.ERROR else _OK,
                start_time=start,
                end_time=end,
                instrumentation_scope=_SCOPE,
            )
        )
        self._report_telemetry()

    def _new_context(self, parent: SpanContext | None) -> SpanContext:
        """A new span's context: in its parent's trace, or in a trace of its own."""
        trace_id = parent.trace_id if parent is not None else self._random.getrandbits(128) or 1
        return SpanContext(trace_id, self._random.getrandbits(64) or 1, is_remote=False, trace_flags=TraceFlags.SAMPLED)

    def _count_error(self, exc: BaseException) -> None:
        if not self._errors:
            logger.warning("kvaudit: emission failed (%r); serving continues, further failures are counted", exc)
        self._errors += 1

    def _report_telemetry(self, *, force: bool = False) -> None:
        """Emit a `kvaudit.telemetry` span when loss counts changed since the last one."""
        stats = self._batcher.stats
        counts = (stats.dropped_spans, stats.failed_exports, self._errors, self._lost_batches)
        now = time.time_ns()
        if counts == self._reported or (not force and now < self._next_report_ns):
            return
        self._reported = counts
        self._next_report_ns = now + self._telemetry_interval_ns
        context = SpanContext(
            self._random.getrandbits(128) or 1,
            self._random.getrandbits(64) or 1,
            is_remote=False,
            trace_flags=TraceFlags.SAMPLED,
        )
        self._batcher.submit(
            ReadableSpan(
                TelemetryAttr.SPAN_NAME,
                context=context,
                resource=self.resource,
                attributes={
                    TelemetryAttr.DROPPED_SPANS: counts[0],
                    TelemetryAttr.FAILED_EXPORTS: counts[1],
                    TelemetryAttr.ERRORS: counts[2],
                    TelemetryAttr.LOST_BATCHES: counts[3],
                },
                start_time=now,
                end_time=now,
                instrumentation_scope=_SCOPE,
            ),
            reserved=True,
        )


def _put(attrs: dict[str, Any], name: str, value: Any) -> None:
    if value is not None:
        attrs[name] = value


def replica_resource(
    replica: str,
    *,
    engine: str | None = None,
    engine_version: str | None = None,
    service_name: str | None = None,
    kv: KVConfig | None = None,
) -> Resource:
    """The resource of one process of a replica; `OTEL_RESOURCE_ATTRIBUTES` is merged in."""
    attrs: dict[str, Any] = {
        Res.SERVICE_NAME: service_name or engine or TRACER_NAME,
        Res.REPLICA: replica,
        Res.SCHEMA: SCHEMA_VERSION,
        Res.PROCESS_PID: os.getpid(),
    }
    _put(attrs, Res.ENGINE, engine)
    _put(attrs, Res.ENGINE_VERSION, engine_version)
    if kv is not None:
        attrs.update(kv.to_attributes())
    return Resource.create(attrs)


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
        OSError: a trace file cannot be opened.
    """
    spec = export or os.environ.get(ENV_EXPORT)
    if spec is None or spec.startswith("otlp:"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        if spec is None:
            return OTLPSpanExporter()
        url = spec.removeprefix("otlp:")
        return OTLPSpanExporter(
            endpoint=url if url.rstrip("/").endswith("/v1/traces") else url.rstrip("/") + "/v1/traces"
        )
    if spec.startswith("file:"):
        from kvaudit.emit.file_exporter import OTLPJsonFileExporter

        return OTLPJsonFileExporter(spec.removeprefix("file:").replace("{replica}", replica))
    raise ValueError(f"kvaudit export {spec!r}: expected file:PATH or otlp:URL")


def setup_emitter(
    replica: str,
    export: str | None = None,
    *,
    engine: str | None = None,
    engine_version: str | None = None,
    service_name: str | None = None,
    kv: KVConfig | None = None,
    max_queue_spans: int = 8192,
    export_delay_s: float = 1.0,
) -> Emitter:
    """One call from a hook: an emitter for `replica` exporting to `export` (see `exporter_for`).

    Raises:
        ValueError: bad export spec or empty replica id.
        OSError: a trace file cannot be opened.
    """
    if not replica:
        raise ValueError("kvaudit needs a replica id (service.instance.id)")
    resource = replica_resource(replica, engine=engine, engine_version=engine_version, service_name=service_name, kv=kv)
    batcher = SpanBatcher(exporter_for(export, replica), max_queue=max_queue_spans, delay_s=export_delay_s)
    return Emitter(resource, batcher)
