"""What the hooks call to emit kvaudit spans and page descriptors.

    emitter = setup_emitter("r1", "file:traces/r1.jsonl", engine="vllm", kv=KVConfig(...))  # kvaudit.emit.setup
    with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id=rid) as op:
        op.add_page(PageDescriptor(key=..., used=True))
        op.end(Outcome.HIT, tokens_hit=256)

The serving thread only records: `add_page` appends a descriptor, `add_pages` a function
that describes pages later, and `end` queues the finished operation. An operation that
begins and ends within one hook call and is no other's parent (LMCache's stores, fetches
and lookups; vLLM's lookups) is queued in one call at its end, as one tuple of what it
was given (`Emitter.record`): its `Operation` is made on the exporter thread. The background
exporter thread finds the span's parent and builds its context, the SDK `ReadableSpan`
and its page events, and turns the events into attributes as it encodes them: every
object the serving thread does not make is time it does not spend between the engine's
copies. Everything here
fails open: an exception inside emission is counted (and reported in a
`kvaudit.telemetry` span) and never reaches the caller.
"""

from __future__ import annotations

import contextvars
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from time import monotonic  # tests replace `time` here with a clock of their own (time_ns only)
from types import TracebackType
from typing import Any, Final

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.environment_variables import OTEL_PYTHON_CONTEXT
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanContext, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from kvaudit import __version__
from kvaudit.contract import (
    EVENT_PAGE,
    TRACER_NAME,
    Hook,
    Op,
    Outcome,
    PageDescriptor,
    Res,
    SpanAttr,
    TelemetryAttr,
)
from kvaudit.emit.span_batcher import SpanBatcher

logger = logging.getLogger(__name__)

DEFAULT_SHUTDOWN_TIMEOUT_S: Final = 5.0
_SCOPE = InstrumentationScope(TRACER_NAME, __version__)
_OK = Status(StatusCode.UNSET)
_ERROR = Status(StatusCode.ERROR)
# Held while an operation's span context is made (`Operation.context`) or its parent found in a
# copied context (`Operation.parent_context`): by exporter threads only.
_CONTEXTS = threading.RLock()  # reentrant: a parent's context is made inside its child's
# The context an operation given no parent starts in, kept for the exporter thread to find
# OpenTelemetry's current span in (`Operation.parent_context`). Where OpenTelemetry keeps its
# context in a context variable (its own default, `OTEL_PYTHON_CONTEXT` unset), a copy of the
# calling thread's context variables: one C call, where its `get_current` is three Python
# frames on the serving thread. Any other runtime context: its own `get_current`.
_current_context: Final[Callable[[], contextvars.Context | Context]] = (
    contextvars.copy_context
    if os.environ.get(OTEL_PYTHON_CONTEXT, "contextvars_context") == "contextvars_context"
    else otel_context.get_current
)


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
    """Counts of what emission could not do; all cumulative for the process.

    `dropped_spans` is every span that did not reach its destination: dropped from a
    full queue, in a failed export, still unsent when shutdown's time ran out, or
    written into a trace file deleted afterwards (those are also `lost_spans`, and are
    not counted in `exported_spans`).
    """

    errors: int = 0
    dropped_spans: int = 0
    failed_exports: int = 0
    exported_spans: int = 0
    lost_batches: int = 0
    lost_spans: int = 0

    @property
    def any_loss(self) -> bool:
        return bool(self.errors or self.dropped_spans or self.failed_exports or self.lost_batches)


class Operation(msgspec.Struct, eq=False):
    """One kvaudit operation on one request: becomes one span when it ends.

    The serving thread only keeps what it is given: `end` queues the operation itself,
    and `build`, on the exporter thread, makes its attributes, page events and span. A
    struct, made in C by `Emitter.operation` (a Python `__init__` is a frame, on the
    serving thread, between the engine's copies); compared by identity.
    """

    _emitter: Emitter
    _op: Op
    _hook: Hook | str
    _request_id: str | None
    _backend: str | None
    _tokens_requested: int | None
    _attributes: dict[str, Any] | None
    _parent: SpanContext | Operation | Context | contextvars.Context | None
    _at: int | None
    _start: int
    _end: int = 0  # set by `end`, which alone queues the operation
    _ended: bool = False
    _outcome: Outcome | None = None
    # tokens hit, stored and local, pages, bytes: set by `end`.
    _amounts: tuple[int | None, ...] = (None, None, None, None, None)
    _pages: list[tuple[PageDescriptor, int]] | None = None
    _later: list[tuple[Callable[[], Iterable[PageDescriptor]], int]] | None = None
    _context: SpanContext | None = None

    @property
    def context(self) -> SpanContext:
        """The span's own context: operations of a layer below (LMCache under vLLM) that
        run inside this one name it, or this operation itself, as their parent.

        Made once, when first read: by an exporter thread (the operation's, or that of
        a layer below building a child first), under a lock, so that two threads reading
        it at once get the same ids. The trace id is the parent's, where the parent has
        a valid one.
        """
        context = self._context
        if context is None:
            with _CONTEXTS:
                context = self._context
                if context is None:
                    parent = self.parent_context
                    bits = self._emitter._random.getrandbits
                    trace_id = parent.trace_id if parent is not None else bits(128) or 1
                    context = SpanContext(trace_id, bits(64) or 1, is_remote=False, trace_flags=TraceFlags.SAMPLED)
                    self._context = context
        return context

    @property
    def parent_context(self) -> SpanContext | None:
        """The parent span's context, or None: a root span.

        Found once and kept in place of what was given (`context` and `build` both read
        it); finding it again from what it was found to be gives the same.
        """
        parent = self._parent
        if isinstance(parent, Operation):
            parent = parent.context
        elif isinstance(parent, contextvars.Context):
            # The calling thread's context variables when the operation started (`_current_context`):
            # OpenTelemetry's current span in them, if any, is the parent. Entered under the lock:
            # the operation's exporter thread (`build`) and a child's (`context`) may both be here,
            # and a context entered by two threads at once raises.
            with _CONTEXTS:
                parent = trace.get_current_span(parent.run(otel_context.get_current)).get_span_context()
        elif isinstance(parent, Context):
            parent = trace.get_current_span(parent).get_span_context()
        if parent is not None and not parent.is_valid:
            parent = None
        self._parent = parent
        return parent

    def add_page(self, page: PageDescriptor, time_ns: int | None = None) -> None:
        """Record the descriptor of one page this operation stored or fetched (at `time_ns`, default now)."""
        if time_ns is None:
            time_ns = time.time_ns() if self._at is None else self._at
        if self._pages is None:
            self._pages = []
        self._pages.append((page, time_ns))

    def add_pages(self, describe: Callable[[], Iterable[PageDescriptor]]) -> None:
        """Record pages that `describe` will name, called on the exporter thread (stamped now).

        For descriptors built from what does not change once the operation ends (keys,
        token ranges, a configuration): the serving thread then makes none of them. A
        failure of `describe` is counted as an emission error; the span goes without them.
        """
        if self._later is None:
            self._later = []
        self._later.append((describe, time.time_ns() if self._at is None else self._at))

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
        describe: Callable[[], Iterable[PageDescriptor]] | None = None,
    ) -> None:
        """Finish the operation at `end_ns` (default now); `pages` and `bytes` default to sums over its pages.

        `describe`: as `add_pages(describe)` made now, in the same call (one Python call
        fewer on the serving thread).
        """
        if self._ended:
            return
        self._ended = True
        try:
            self._outcome = outcome
            self._amounts = (tokens_hit, tokens_stored, tokens_local, pages, bytes)
            if end_ns is None:
                end_ns = time.time_ns() if self._at is None else self._at
            self._end = end_ns
            if describe is not None:
                if self._later is None:
                    self._later = []
                self._later.append((describe, end_ns))
            self._emitter._batcher.submit(self)
        except Exception as exc:
            self._emitter._count_error(exc)

    def build(self) -> ReadableSpan:
        """The span (on the exporter thread); raises, after counting the error, when it cannot be made."""
        emitter = self._emitter
        events = [PageEvent(page, time_ns) for page, time_ns in self._pages or ()]
        for describe, time_ns in self._later or ():
            try:
                events.extend(PageEvent(page, time_ns) for page in describe())
            except Exception as exc:
                emitter._count_error(exc)
        try:
            attrs = self._attributes_of(events)
            context, parent = self.context, self.parent_context
        except Exception as exc:
            emitter._count_error(exc)
            raise
        max_pages = emitter._max_pages
        return ReadableSpan(
            self._op.span_name,
            context=context,
            parent=parent,
            resource=emitter.resource,
            attributes=attrs,
            events=BoundedList.from_seq(max_pages, events) if len(events) > max_pages else events,
            status=_ERROR if self._outcome is Outcome.ERROR else _OK,
            start_time=self._start,
            end_time=self._end,
            instrumentation_scope=_SCOPE,
        )

    def _attributes_of(self, events: list[PageEvent]) -> dict[str, Any]:
        attrs: dict[str, Any] = {SpanAttr.OP: self._op.value, SpanAttr.HOOK: str(self._hook)}
        _put(attrs, SpanAttr.REQUEST_ID, self._request_id)
        _put(attrs, SpanAttr.BACKEND, self._backend)
        _put(attrs, SpanAttr.TOKENS_REQUESTED, self._tokens_requested)
        if self._attributes:
            attrs.update(self._attributes)
        outcome = self._outcome
        _put(attrs, SpanAttr.OUTCOME, outcome and outcome.value)
        tokens_hit, tokens_stored, tokens_local, pages, bytes_ = self._amounts
        _put(attrs, SpanAttr.TOKENS_HIT, tokens_hit)
        _put(attrs, SpanAttr.TOKENS_STORED, tokens_stored)
        _put(attrs, SpanAttr.TOKENS_LOCAL, tokens_local)
        _put(attrs, SpanAttr.PAGES, pages)
        _put(attrs, SpanAttr.BYTES, bytes_)
        attrs.setdefault(SpanAttr.PAGES, len(events))
        attrs.setdefault(SpanAttr.BYTES, sum(event.page.bytes or 0 for event in events))
        return attrs

    def __enter__(self) -> Operation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.end(Outcome.ERROR if exc_type is not None else None)


class _Recorded(tuple):  # type: ignore[type-arg]
    """An operation `Emitter.record` queued: what it was given, as one tuple (made in C, no
    Python frame, on the serving thread); its `Operation` and span are made by `build`, on
    the exporter thread."""

    __slots__ = ()

    def build(self) -> ReadableSpan:
        *fields, describe = self  # an ended operation's fields up to its pages, then their description
        operation = Operation(*fields)
        if describe is not None:
            operation._later = [(describe, operation._end)]
        return operation.build()


class _NoOperation(Operation, eq=False):
    """What `operation()` returns when emission itself failed: accepts and ignores (its
    context is invalid: a layer below that names it as parent makes a root span)."""

    def add_page(self, page: PageDescriptor, time_ns: int | None = None) -> None:
        pass

    def add_pages(self, describe: Callable[[], Iterable[PageDescriptor]]) -> None:
        pass

    def end(self, outcome: Outcome | None = None, **_: Any) -> None:
        pass


_NO_OPERATION: Final = _NoOperation(
    None, Op.LOOKUP, "", None, None, None, None, None, None, 0, _context=INVALID_SPAN_CONTEXT
)  # type: ignore[arg-type]
# The operation of a request the process does not record (docs/design.md section 3.10): the
# hooks work on it as on any other, the guard's checks included, and nothing is queued; a
# layer below told it is its parent records nothing either (`is UNRECORDED`).
UNRECORDED: Final = msgspec.structs.replace(_NO_OPERATION)


class Emitter:
    """Turns operations into spans and hands them to a background exporter.

    Args:
        resource: the process's resource (replica id, engine, KV configuration).
        batcher: the queue and thread that export finished spans.
        max_pages_per_span: descriptors kept per span; more are dropped and counted
            in the span's `droppedEventsCount`, never silently.
        telemetry_interval_s: how often, at most, a `kvaudit.telemetry` span reports
            changed loss counts (looked at after each export, on flush and at shutdown).
        shutdown_timeout_s: how long `shutdown()` may take at most (the vLLM hook calls
            it at exit); what is not exported by then is counted.

    Where a telemetry span itself cannot be delivered, and at shutdown when anything
    was lost, the counts also go to stderr as one line: the loss is never silent.
    """

    def __init__(
        self,
        resource: Resource,
        batcher: SpanBatcher,
        *,
        max_pages_per_span: int = 65536,
        telemetry_interval_s: float = 10.0,
        shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
    ) -> None:
        self.resource = resource
        self._batcher = batcher
        batcher.undelivered = self._undelivered
        # Loss counts are looked at after each export, not at each span the serving thread ends.
        batcher.exported = self._report_telemetry
        self._shutdown_timeout_s = shutdown_timeout_s
        self._max_pages = max_pages_per_span
        self._telemetry_interval_ns = int(telemetry_interval_s * 1e9)
        self._errors = 0
        self._lost_batches = 0
        # A process that records a share of its requests reports once even with nothing lost
        # (None differs from any counts), so that its resource, and the rate it declares, is in
        # the trace though it may record no request (docs/design.md section 3.10).
        sampled = Res.SAMPLE_RATE in resource.attributes
        self._reported: tuple[int, int, int, int] | None = None if sampled else (0, 0, 0, 0)
        self._next_report_ns = 0
        self._random = random.Random()
        if sampled:
            # At once, not at exit: a process ended before its exit handlers run (vLLM kills
            # a worker that is slow to stop) is still declared.
            self._report_telemetry(force=True)

    @property
    def replica(self) -> str:
        return str(self.resource.attributes.get(Res.REPLICA, ""))

    @property
    def stats(self) -> EmitterStats:
        batcher = self._batcher.stats
        lost = getattr(self._batcher.exporter, "lost_spans", 0)
        return EmitterStats(
            self._errors,
            batcher.dropped_spans + lost,
            batcher.failed_exports,
            batcher.exported_spans - lost,
            self._lost_batches,
            lost,
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
        parent: SpanContext | Operation | None = None,
        attributes: dict[str, Any] | None = None,
        at_ns: int | None = None,
        start_ns: int | None = None,
    ) -> Operation:
        """Start an operation; the current span (if any) becomes its parent unless `parent` is given.

        `parent` may be an operation still open (a layer above's, on the same request):
        its span's context is then made only when needed, on the exporter thread.

        `attributes` are further span attributes (names from the contract, e.g. the
        evict reason). `at_ns` stamps an operation reported after the fact (an
        engine's event stream, possibly replayed late) with the time it happened:
        its span and pages carry that time, and it has no duration. `start_ns` (with
        `end_ns` and each page's `time_ns` further on) stamps every instant on its own:
        a simulator passes its clock, so that simulated time travels the real path.
        """
        try:
            # The current context is kept as it is: its span is looked up on the exporter thread.
            return Operation(
                self,
                op,
                hook,
                request_id,
                backend,
                tokens_requested,
                attributes,
                _current_context() if parent is None else parent,
                at_ns,
                (time.time_ns() if at_ns is None else at_ns) if start_ns is None else start_ns,
            )
        except Exception as exc:
            self._count_error(exc)
            return _NO_OPERATION

    def record(
        self,
        op: Op,
        hook: Hook | str,
        request_id: str | None,
        backend: str | None,
        tokens_requested: int | None,
        parent: SpanContext | Operation | None,
        start_ns: int,
        outcome: Outcome | None,
        amounts: tuple[int | None, int | None, int | None, int | None, int | None],
        describe: Callable[[], Iterable[PageDescriptor]] | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        """Queue an operation that began at `start_ns` and ends now, in one call.

        For an operation that begins and ends within one hook call and that no other
        names as its parent. The same span as `operation(...)` followed by
        `add_pages(describe)` and `end(outcome, ...)` (`amounts`: tokens hit, stored and
        local, pages, bytes, as `end` takes them; `attributes` as `operation` takes them), in
        this one call and the queue's: the
        operation, its ids and its context are made on the exporter thread, off the serving
        thread. Arguments are positional: a call by keywords costs more. Never raises.
        """
        try:
            parent = _current_context() if parent is None else parent
            # `Operation`'s fields, in its order: what the operation is; its attributes, its
            # parent, no `at`, when it started and that it ended now; what it found, no pages.
            what = (self, op, hook, request_id, backend, tokens_requested)
            when = (attributes, parent, None, start_ns, time.time_ns(), True)
            self._batcher.submit(_Recorded((*what, *when, outcome, amounts, None, describe)))
        except Exception as exc:
            self._count_error(exc)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export what is queued; False when it did not finish in time (never raises)."""
        deadline = monotonic() + timeout_s
        try:
            # Spans are built as they are exported: what failed to build is counted by then.
            self._batcher.flush(timeout_s)
            self._report_telemetry(force=True)
            return self._batcher.flush(max(0.0, deadline - monotonic()))
        except Exception as exc:
            self._count_error(exc)
            return False

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Export what is queued and stop, within `timeout_s` (default: the emitter's `shutdown_timeout_s`).

        Never raises and never takes longer: what could not be exported is counted, and
        any loss is written to stderr as one line.
        """
        deadline = monotonic() + (self._shutdown_timeout_s if timeout_s is None else timeout_s)
        try:
            # Half the time for what is queued, so the last telemetry span has time to follow it.
            self._batcher.flush(max(0.0, deadline - monotonic()) / 2)
            self._report_telemetry(force=True)
            self._batcher.shutdown(max(0.0, deadline - monotonic()))
        except Exception as exc:
            self._count_error(exc)
        stats = self.stats
        if stats.any_loss:
            _fallback_line(f"replica {self.replica!r} pid {os.getpid()}: {_loss_text(stats)} (at shutdown)")

    def _undelivered(self, batch: list[ReadableSpan] | tuple[ReadableSpan, ...]) -> None:
        """A batch failed: where it carried a telemetry span, its counts go to stderr instead."""
        if any(span.name == TelemetryAttr.SPAN_NAME for span in batch):
            _fallback_line(
                f"replica {self.replica!r} pid {os.getpid()}: {_loss_text(self.stats)} "
                "(the kvaudit.telemetry span carrying these counts could not be exported)"
            )

    def _count_error(self, exc: BaseException) -> None:
        if not self._errors:
            logger.warning("kvaudit: emission failed (%r); serving continues, further failures are counted", exc)
        self._errors += 1

    def _report_telemetry(self, *, force: bool = False) -> None:
        """Emit a `kvaudit.telemetry` span when loss counts changed since the last one."""
        stats = self._batcher.stats
        lost = getattr(self._batcher.exporter, "lost_spans", 0)
        counts = (stats.dropped_spans + lost, stats.failed_exports, self._errors, self._lost_batches)
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


def _loss_text(stats: EmitterStats) -> str:
    return (
        f"{stats.dropped_spans} spans dropped ({stats.lost_spans} of them in a deleted trace file), "
        f"{stats.failed_exports} exports failed, {stats.errors} emission errors, "
        f"{stats.lost_batches} upstream batches lost"
    )


def _fallback_line(message: str) -> None:
    """One line on stderr, where the loss is readable even when the trace destination is not."""
    try:
        if sys.stderr is not None:
            sys.stderr.write(f"kvaudit: {message}\n")
            sys.stderr.flush()
    except Exception:  # stderr itself is gone: nothing is left to tell
        pass


def _put(attrs: dict[str, Any], name: str, value: Any) -> None:
    if value is not None:
        attrs[name] = value
