"""Explicit timestamps through the emitter: what lets a simulator emit in simulated time."""

from __future__ import annotations

from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import replica_resource
from kvaudit.emit.span_batcher import SpanBatcher

from ..support.capture import Capture


def test_explicit_start_end_and_page_times_are_kept():
    capture = Capture()
    emitter = Emitter(replica_resource("r1"), SpanBatcher(capture))
    op = emitter.operation(Op.FETCH, hook=Hook.SIMULATOR, start_ns=1_000)
    op.add_page(PageDescriptor(key="aa"), time_ns=1_500)
    op.end(Outcome.HIT, end_ns=2_000)
    emitter.flush()
    [span] = capture.spans
    assert (span.start_time, span.end_time) == (1_000, 2_000)
    assert [event.timestamp for event in span.events] == [1_500]
