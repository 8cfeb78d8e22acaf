"""The receiver's memory budget is held by what arrives, not by what is announced, and sized by what decoding costs.

33 connections that send only headers announcing 32 MiB once held the whole 1 GiB
budget until their read timeout, and every legitimate request got 503 "needs 0 MiB".
Bodies are now reserved as they arrive, a MiB at a time: such senders hold a MiB each,
and legitimate senders keep getting through. A body of tiny spans reserves per span.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from kvaudit.receive.memory_budget import BODY_STEP, DECODE_BYTES_PER_SPAN
from kvaudit.receive.otlp_http import CollectorServer, ReceiverLimits
from kvaudit.receive.trace_sink import TraceSink

from ..support.otlp_requests import PROTOBUF, body_of, post
from ..support.waiting import wait_until

MiB = 1 << 20
HOLDERS = 33


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[CollectorServer]:
    server = CollectorServer(
        ("127.0.0.1", 0), TraceSink(tmp_path / "received", fsync=False), limits=ReceiverLimits(read_timeout_s=300)
    )
    server.start()
    yield server
    server.stop()


def test_header_only_senders_announcing_32_mib_do_not_starve_legitimate_posts(receiver: CollectorServer):
    port = receiver.server_address[1]
    head = f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\nContent-Length: {32 * MiB}\r\n\r\n"
    holders = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(HOLDERS)]
    try:
        for holder in holders:
            holder.sendall(head.encode())
        wait_until(
            lambda: receiver.budget.used >= HOLDERS * BODY_STEP, what="every holder waiting on its body", interval=0.01
        )
        assert receiver.budget.used == HOLDERS * BODY_STEP  # a MiB each, not the 32 announced
        statuses = [post(port, body_of((f"r{n}", 2)))[0] for n in range(10)]
        assert statuses == [200] * 10
    finally:
        for holder in holders:
            holder.close()
    wait_until(lambda: not receiver.budget.used, what="the holders' reservations given back", interval=0.01)


def _tiny_spans(count: int) -> bytes:
    spans = [
        Span(trace_id=n.to_bytes(16, "big"), span_id=(n + 1).to_bytes(8, "big"), name="s", start_time_unix_nano=n)
        for n in range(count)
    ]
    resource = ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])
    resource.resource.attributes.append(KeyValue(key="service.instance.id", value=AnyValue(string_value="tiny")))
    return ExportTraceServiceRequest(resource_spans=[resource]).SerializeToString()


def test_a_body_of_tiny_spans_reserves_what_each_span_costs(receiver: CollectorServer):
    count = 250_000
    body = _tiny_spans(count)
    assert len(body) * 13 < count * DECODE_BYTES_PER_SPAN  # per byte alone would reserve too little
    assert post(receiver.server_address[1], body)[0] == 200
    assert receiver.budget.peak >= count * DECODE_BYTES_PER_SPAN
    assert receiver.sink.stats.spans == count
