"""A 200 means readable: the receiver applies the readers' limits (kvaudit.otlp.limits) before it answers.

Each hostile span goes in a request of 100 good ones, as protobuf and as OTLP JSON: the
bad one is rejected by name (OTLP partial success), the other 99 are read back with no
read error. A request that could never be written is 4xx, and leaves no file behind.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from kvaudit.otlp.encode import proto_to_line
from kvaudit.otlp.limits import MAX_ATTRIBUTES, MAX_NESTING
from kvaudit.read.store import TraceStore
from kvaudit.receive.otlp_http import CollectorServer, ReceiverLimits
from kvaudit.receive.trace_sink import TraceSink

from ..support.otlp_requests import body_of, post

SPANS = 100


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[CollectorServer]:
    server = CollectorServer(
        ("127.0.0.1", 0), TraceSink(tmp_path / "received", fsync=False, max_open_files=8), limits=ReceiverLimits()
    )
    server.start()
    yield server
    server.stop()


def _nested(depth: int) -> AnyValue:
    value = AnyValue(string_value="bottom")
    for _ in range(depth):
        value = AnyValue(array_value={"values": [value]})
    return value


def _late_start(span: Span) -> None:
    span.start_time_unix_nano = 2**63 + 5


def _deep_value(span: Span) -> None:
    span.attributes.append(KeyValue(key="deep", value=_nested(MAX_NESTING + 8)))


def _short_trace_id(span: Span) -> None:
    span.trace_id = b"\x0a\x0b\x0c"


def _many_attributes(span: Span) -> None:
    span.attributes.extend(KeyValue(key=f"k{n}", value=AnyValue(int_value=n)) for n in range(MAX_ATTRIBUTES + 1))


def _late_event(span: Span) -> None:
    span.events[0].time_unix_nano = 2**64 - 1


HOSTILE: dict[str, tuple[Callable[[Span], None], str]] = {
    "start time 2^63+5": (_late_start, "startTimeUnixNano 9223372036854775813 is after"),
    "AnyValue 40 deep": (_deep_value, "nested too deeply"),
    "3-byte trace id": (_short_trace_id, "traceId of"),
    "1,025 attributes": (_many_attributes, f"more than the {MAX_ATTRIBUTES} kvaudit reads"),
    "event time 2^64-1": (_late_event, "event timeUnixNano"),
}


def _request_with_one_bad_span(edit: Callable[[Span], None]) -> tuple[ExportTraceServiceRequest, Span]:
    request = ExportTraceServiceRequest.FromString(body_of(("r1", SPANS), pages=1))
    spans = request.resource_spans[0].scope_spans[0].spans
    assert len(spans) == SPANS
    bad = spans[SPANS // 2]
    bad.name = "the-bad-one"
    edit(bad)
    return request, bad


def _read_back(directory: Path) -> tuple[int, list[tuple[object, ...]]]:
    store = TraceStore([directory])
    store.refresh()
    _, [(spans,)] = store.query("SELECT count(*) FROM spans WHERE op = 'fetch'")
    _, errors = store.query("SELECT file, line, reason FROM read_errors")
    return spans, errors


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_an_unreadable_span_is_rejected_by_name_and_the_rest_read_back(
    receiver: CollectorServer, case: str, encoding: str
):
    edit, reason = HOSTILE[case]
    request, bad = _request_with_one_bad_span(edit)
    if encoding == "protobuf":
        status, _, reply = post(receiver.server_address[1], request.SerializeToString())
        assert status == 200
        partial = ExportTraceServiceResponse.FromString(reply).partial_success
        rejected, message = partial.rejected_spans, partial.error_message
    else:
        body = proto_to_line(request)
        status, _, reply = post(receiver.server_address[1], body, {"Content-Type": "application/json"})
        assert status == 200
        partial_json = json.loads(reply)["partialSuccess"]
        rejected, message = int(partial_json["rejectedSpans"]), partial_json["errorMessage"]
    assert rejected == 1
    assert f"span 'the-bad-one' ({bad.span_id.hex()})" in message and reason in message
    assert _read_back(receiver.sink.directory) == (SPANS - 1, [])


def test_a_request_of_only_unreadable_spans_is_400_and_writes_nothing(receiver: CollectorServer):
    request = ExportTraceServiceRequest.FromString(body_of(("r1", 3), pages=1))
    for span in request.resource_spans[0].scope_spans[0].spans:
        _late_start(span)
    status, _, reply = post(receiver.server_address[1], request.SerializeToString())
    assert status == 400 and b"3 spans rejected" in reply
    assert list(receiver.sink.directory.iterdir()) == []


def test_a_resource_of_another_schema_version_is_rejected_with_its_spans(receiver: CollectorServer):
    request = ExportTraceServiceRequest.FromString(body_of(("r1", 2), ("r2", 3), pages=1))
    for kv in request.resource_spans[1].resource.attributes:
        if kv.key == "kvaudit.schema":
            kv.value.int_value = 99
    status, _, reply = post(receiver.server_address[1], request.SerializeToString())
    partial = ExportTraceServiceResponse.FromString(reply).partial_success
    assert status == 200 and partial.rejected_spans == 3
    assert "unknown kvaudit schema version 99" in partial.error_message
    assert _read_back(receiver.sink.directory) == (2, [])


def test_more_replicas_than_open_files_is_400_naming_the_limit_and_leaves_no_files(receiver: CollectorServer):
    body = body_of(*((f"replica-{n}", 1) for n in range(20)), pages=1)
    status, headers, reply = post(receiver.server_address[1], body)
    assert status == 400 and "Retry-After" not in headers
    assert b"names 20 replicas, more than the 8 files" in reply and b"--max-open-files" in reply
    assert list(receiver.sink.directory.iterdir()) == []
    assert post(receiver.server_address[1], body_of(*((f"replica-{n}", 1) for n in range(8)), pages=1))[0] == 200


def test_a_failed_request_removes_the_empty_files_it_made(receiver: CollectorServer):
    directory = receiver.sink.directory
    (directory / "r2.jsonl").mkdir()  # r2's file cannot be opened: the request fails (503)
    status, headers, _ = post(receiver.server_address[1], body_of(("r1", 2), ("r2", 2), pages=1))
    assert status == 503 and headers["Retry-After"] == "1"
    assert [path.name for path in directory.iterdir()] == ["r2.jsonl"]  # r1's file, made for it, is gone
