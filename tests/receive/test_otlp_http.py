"""The OTLP/HTTP receiver, fed by the official OpenTelemetry OTLP/HTTP exporter."""

from __future__ import annotations

import gzip
import http.client
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

from kvaudit.contract import Hook, Op, Outcome
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import replica_resource
from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.otlp.encode import line_to_traces_data, spans_to_line
from kvaudit.read.store import TraceStore
from kvaudit.receive.otlp_http import CollectorServer, ReceiverLimits
from kvaudit.receive.trace_sink import TraceSink

from ..support.pages import KV, full_page


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[CollectorServer]:
    limits = ReceiverLimits(max_body=256 * 1024)
    server = CollectorServer(("127.0.0.1", 0), TraceSink(tmp_path / "received"), limits=limits).start()
    yield server
    server.stop()


def _emit(emitter: Emitter, pages: int = 4) -> None:
    with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id="req", tokens_requested=128) as op:
        for i in range(pages):
            op.add_page(full_page(f"{i:064x}", i, used=True))
        op.end(Outcome.HIT, tokens_hit=128)


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_official_exporter_protobuf(collector: CollectorServer, compression: Compression):
    for replica in ("r1", "r2"):
        exporter = OTLPSpanExporter(endpoint=f"{collector.url}/v1/traces", compression=compression)
        emitter = Emitter(replica_resource(replica, engine="vllm", kv=KV), SpanBatcher(exporter))
        _emit(emitter)
        emitter.shutdown()
        assert emitter.stats.exported_spans == 1 and emitter.stats.failed_exports == 0
    directory = collector.sink.directory
    assert sorted(p.name for p in directory.iterdir()) == ["r1.jsonl", "r2.jsonl"]
    store = TraceStore([directory])
    store.refresh()
    _, rows = store.query("SELECT replica, count(*), count(DISTINCT key) FROM pages GROUP BY 1 ORDER BY 1")
    assert rows == [("r1", 4, 4), ("r2", 4, 4)]
    _, errors = store.query("SELECT * FROM read_errors")
    assert errors == []


def test_json_body(collector: CollectorServer):
    capture: list = []

    class Keep(OTLPSpanExporter):
        def export(self, spans):
            capture.extend(spans)
            return super().export(spans)

    emitter = Emitter(replica_resource("r3"), SpanBatcher(Keep(endpoint=f"{collector.url}/v1/traces")))
    _emit(emitter, pages=2)
    emitter.shutdown()
    body = spans_to_line(capture)
    status, _ = _post(collector, body, "application/json")
    assert status == 200
    lines = (collector.sink.directory / "r3.jsonl").read_bytes().splitlines()
    assert len(lines) == 2
    assert line_to_traces_data(lines[0]) == line_to_traces_data(lines[1])


@pytest.mark.parametrize(
    ("body", "content_type", "encoding", "status"),
    [
        (b"\xff\x00garbage", "application/x-protobuf", "", 400),
        (b"\x0a\xff\xff\xff\x0f\x01", "application/x-protobuf", "", 400),  # truncated length-delimited field
        (b'{"resourceSpans": [{"scopeSpans": 3}]}', "application/json", "", 400),
        (b"{not json", "application/json", "", 400),
        (b"{}", "text/plain", "", 415),
        (b"{}", "application/json", "br", 415),
        (b"\x1f\x8b\x08\x00broken", "application/x-protobuf", "gzip", 400),
        (b"x" * (256 * 1024 + 1), "application/x-protobuf", "", 413),
        (gzip.compress(b"\x00" * (512 * 1024), mtime=0), "application/x-protobuf", "gzip", 413),
    ],
)
def test_bad_bodies_are_refused_and_nothing_is_written(
    collector: CollectorServer, body: bytes, content_type: str, encoding: str, status: int
):
    got, _ = _post(collector, body, content_type, encoding)
    assert got == status
    assert list(collector.sink.directory.iterdir()) == []
    assert collector.sink.stats.requests == 0


def test_wrong_path_and_method(collector: CollectorServer):
    assert _post(collector, b"", "application/x-protobuf", path="/v1/metrics")[0] == 404
    conn = http.client.HTTPConnection(*collector.server_address[:2], timeout=5)
    conn.request("GET", "/v1/traces")
    assert conn.getresponse().status == 405


def _post(collector: CollectorServer, body: bytes, content_type: str, encoding: str = "", path: str = "/v1/traces"):
    conn = http.client.HTTPConnection(*collector.server_address[:2], timeout=5)
    headers = {"Content-Type": content_type}
    if encoding:
        headers["Content-Encoding"] = encoding
    conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()
