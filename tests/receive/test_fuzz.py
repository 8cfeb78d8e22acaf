"""The receiver fuzzed (issue 17): bodies of a real export request, mutated at random
(bytes flipped, cut short, spliced, as JSON or protobuf, gzip'd or not), never make it
answer anything but a definite status, never leave a partial line on disk, and never
stop it serving the next good request.

One receiver serves every example (hypothesis runs them in turn); what it wrote is
checked once at the end: every line is whole OTLP JSON.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf.json_format import MessageToJson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from kvaudit.receive.otlp_http import CollectorServer, ReceiverLimits
from kvaudit.receive.trace_sink import TraceSink

from ..support.otlp_requests import PROTOBUF, body_of, post

# What a definite answer may be: accepted (whole or in part), refused as bad or too
# large, or the memory budget (which a burst of examples may reach): never a 5xx else.
DEFINITE = {200, 400, 408, 413, 415, 503}


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    directory = tmp_path_factory.mktemp("fuzzed")
    server = CollectorServer(
        ("127.0.0.1", 0),
        TraceSink(directory, fsync=False),
        limits=ReceiverLimits(max_body=1 << 20, read_header_timeout_s=2.0, read_timeout_s=4.0, idle_timeout_s=2.0),
    ).start()
    yield server.server_address[1], directory
    server.stop()


GOOD = body_of(("r1", 2), ("r2", 1), pages=2)
GOOD_JSON = MessageToJson(ExportTraceServiceRequest.FromString(GOOD)).encode()


@st.composite
def mutated(draw: st.DrawFn) -> tuple[bytes, str, bool]:
    as_json = draw(st.booleans())
    body = bytearray(GOOD_JSON if as_json else GOOD)
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["flip", "cut", "splice", "insert"]))
        if not body:
            break
        at = draw(st.integers(0, len(body) - 1))
        if kind == "flip":
            body[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del body[at:]
        elif kind == "splice":
            del body[at : at + draw(st.integers(1, 64))]
        else:
            body[at:at] = draw(st.binary(min_size=1, max_size=32))
    return bytes(body), "application/json" if as_json else PROTOBUF, draw(st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=mutated())
def test_any_mutated_body_gets_a_definite_answer_and_the_receiver_keeps_serving(
    receiver: tuple[int, Path], case: tuple[bytes, str, bool]
):
    port, _ = receiver
    body, content_type, zipped = case
    headers = {"Content-Type": content_type, **({"Content-Encoding": "gzip"} if zipped else {})}
    status, _, _ = post(port, gzip.compress(body) if zipped else body, headers)
    assert status in DEFINITE
    assert post(port, GOOD)[0] == 200  # the next good request is served


def test_what_the_fuzzed_receiver_wrote_is_whole_lines(receiver: tuple[int, Path]):
    _, directory = receiver
    files = list(directory.glob("*.jsonl"))
    assert files
    for path in files:
        data = path.read_bytes()
        assert data.endswith(b"\n")
        for line in data.splitlines():
            assert "resourceSpans" in json.loads(line)
