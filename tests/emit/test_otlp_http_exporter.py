"""`otlp:` export: kvaudit's protobuf encoding, sent by the official OTLP/HTTP exporter's own sending.

What serving waits for the GIL with each exporter is measured in bench/bench_emission.py, not here.
"""

from __future__ import annotations

import gzip
import logging
import threading
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
from kvaudit.emit import give_way
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.otlp_http_exporter import OTLPHttpExporter
from kvaudit.emit.setup import ENV_EXPORT, exporter_for, replica_resource
from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.otlp.encode import line_to_traces_data, spans_to_line
from kvaudit.otlp.encode_protobuf import spans_to_request

from ..support.capture import Capture, FakeTime
from ..support.pages import KV, full_page
from ..support.servers import RecordingServer


def _pages(spans: int = 3, pages: int = 4) -> list[ReadableSpan]:
    capture = Capture()
    emitter = Emitter(replica_resource("r1", engine="vllm", kv=KV), SpanBatcher(capture))
    for n in range(spans):
        with emitter.operation(Op.FETCH, hook=Hook.LMCACHE_ENGINE, request_id=f"q{n}", tokens_requested=64) as op:
            for i in range(pages):
                op.add_page(full_page(f"{n:032x}{i:032x}", i, used=i % 2 == 0))
            op.add_page(PageDescriptor(key="bb", shape=(), used=True, transfer="raw_ptr", address=0x7F00))
            op.end(Outcome.PARTIAL, tokens_hit=32)
    emitter.flush()
    emitter.shutdown()
    return capture.spans


def _everything_else() -> list[ReadableSpan]:
    """Spans with what kvaudit's own never carry: a remote parent with a trace state, links,
    an error status, a scope with a version and schema, two resources, every attribute type."""
    spans: list[ReadableSpan] = []
    keep = Capture()
    for name in ("a", "b"):
        provider = TracerProvider(resource=Resource.create({"service.name": name, "n": 1}))
        provider.add_span_processor(SimpleSpanProcessor(keep))
        tracer = provider.get_tracer("kv", "1.2", schema_url="https://opentelemetry.io/schemas/1.21.0")
        sampled, state = TraceFlags(TraceFlags.SAMPLED), TraceState([("k", "v")])
        remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=sampled, trace_state=state)
        attributes = {
            "negative": -5, "big": 2**62, "zero": 0, "half": 1.5, "no": False, "yes": True, "empty": "",
            "long": "é" * 100, "ints": [1, 2, 3], "strings": ("a", "b"), "floats": (0.5,),
        }  # fmt: skip
        with (
            trace.use_span(NonRecordingSpan(remote)),
            tracer.start_as_current_span(
                "outer", kind=SpanKind.CLIENT, attributes=attributes, links=[Link(remote, {"why": "rerouted"})]
            ) as span,
        ):
            span.add_event("kvaudit.page", {"k": "aa" * 32, "n": 3, "shape": (1, 2, 3)})
            span.add_event("bare")
            span.set_status(Status(StatusCode.ERROR, "bad page"))
            with provider.get_tracer("other").start_as_current_span("inner"):
                pass
        provider.shutdown()
    spans.extend(keep.spans)
    return spans


@pytest.mark.parametrize("spans", [_pages, _everything_else], ids=["pages", "everything-else"])
def test_the_request_is_byte_for_byte_the_official_encoders(spans):
    batch = spans()
    assert spans_to_request(batch) == encode_spans(batch).SerializeToString()


def test_a_request_encoded_span_by_span_calls_back_after_each():
    batch = _pages()
    calls: list[int] = []
    assert spans_to_request(batch, lambda: calls.append(1)) == encode_spans(batch).SerializeToString()
    assert len(calls) == len(batch)


def test_otlp_export_goes_through_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ENV_EXPORT, raising=False)
    assert isinstance(exporter_for("otlp:http://collector:4318", "r1"), OTLPHttpExporter)
    assert isinstance(exporter_for(None, "r1"), OTLPHttpExporter)


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_it_sends_what_the_official_exporter_sends(compression: Compression):
    batch = _pages()
    with RecordingServer() as server:
        for exporter_class in (OTLPSpanExporter, OTLPHttpExporter):
            exporter = exporter_class(endpoint=f"{server.url}/v1/traces", compression=compression, timeout=10)
            assert exporter.export(batch) is SpanExportResult.SUCCESS
            exporter.shutdown()
    (official_headers, official), (ours_headers, ours) = server.bodies
    assert server.requests == ["POST /v1/traces"] * 2
    for headers in (official_headers, ours_headers):
        assert headers["Content-Type"] == "application/x-protobuf"
        assert headers.get("Content-Encoding") == ("gzip" if compression is Compression.Gzip else None)
    if compression is Compression.Gzip:
        official, ours = gzip.decompress(official), gzip.decompress(ours)
    assert ours == official == encode_spans(batch).SerializeToString()


def test_a_transient_refusal_is_retried_by_the_official_sending_with_the_same_request():
    batch = _pages(spans=1)
    with RecordingServer() as server:
        server.statuses = [503]
        exporter = OTLPHttpExporter(endpoint=f"{server.url}/v1/traces", timeout=30)
        assert exporter.export(batch) is SpanExportResult.SUCCESS
        exporter.shutdown()
        assert exporter.export(batch) is SpanExportResult.FAILURE  # shut down: refused, as the official one does
    assert [body for _, body in server.bodies] == [encode_spans(batch).SerializeToString()] * 2


def test_it_gives_way_as_it_encodes_on_a_thread_that_does():
    batch = _pages()
    fake = FakeTime()
    turns = give_way.GiveWay(0.0, 0.0, clock=fake.clock, sleep=fake.sleep)
    with RecordingServer() as server:
        exporter = OTLPHttpExporter(endpoint=f"{server.url}/v1/traces", timeout=10)
        give_way.install(turns)
        try:
            assert exporter.export(batch) is SpanExportResult.SUCCESS
        finally:
            give_way.install(None)
        assert turns.pauses == len(batch)
        assert exporter.export(batch) is SpanExportResult.SUCCESS  # a thread that does not: no pause
        exporter.shutdown()
    assert turns.pauses == len(batch)
    assert len({body for _, body in server.bodies}) == 1


def test_an_attribute_that_cannot_be_encoded_is_left_out_of_both_encodings_and_named_once(
    caplog: pytest.LogCaptureFixture,
):
    capture = Capture()
    emitter = Emitter(replica_resource("r1"), SpanBatcher(capture))
    for _ in range(2):
        # The SDK keeps a None inside a sequence and an integer of any size; OTLP carries neither.
        attributes = {"kvaudit.ok": 1, "kvaudit.gap": (1, None), "kvaudit.huge": 2**64, "kvaudit.after": "x"}
        emitter.operation(Op.STORE, hook=Hook.LMCACHE_ENGINE, attributes=attributes).end()
    emitter.flush()
    official = encode_spans(capture.spans)
    with caplog.at_level(logging.WARNING, logger="kvaudit.otlp.encoded_once"):
        request = spans_to_request(capture.spans)
        line = spans_to_line(capture.spans)
    assert request == official.SerializeToString()
    assert line_to_traces_data(line) == TracesData(resource_spans=official.resource_spans)
    sent = {kv.key for kv in official.resource_spans[0].scope_spans[0].spans[0].attributes}
    assert {"kvaudit.ok", "kvaudit.after"} <= sent and not {"kvaudit.gap", "kvaudit.huge"} & sent
    named = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(named) == 2 and "'kvaudit.gap'" in named[0] and "'kvaudit.huge'" in named[1]


def test_exports_from_several_threads_at_once_each_send_their_own_spans():
    # The SDK's SimpleSpanProcessor exports on the thread that ends a span, with no lock.
    batches = [_pages(spans=1, pages=n) for n in range(1, 9)]
    meeting = threading.Barrier(len(batches), timeout=30)

    class AllEncodedFirst(OTLPHttpExporter):
        def _export(self, *args: Any, **kwargs: Any) -> Any:
            meeting.wait()  # every thread has made its request before any posts
            return super()._export(*args, **kwargs)

    with RecordingServer() as server:
        exporter = AllEncodedFirst(endpoint=f"{server.url}/v1/traces", timeout=10)
        threads = [threading.Thread(target=exporter.export, args=(batch,)) for batch in batches]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        exporter.shutdown()
    assert sorted(body for _, body in server.bodies) == sorted(encode_spans(b).SerializeToString() for b in batches)
