"""`kvaudit collect`'s receiver under hostile and careless clients: every bound it keeps, with real requests.

Malformed requests go over raw sockets or http.client; partial success is checked with
the official OTLP/HTTP exporter; gzip bodies are real (a bomb of zeros, several members).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace.export import SpanExportResult

from kvaudit.read.store import TraceStore
from kvaudit.receive.http_security import BearerToken, ServerSecurity, ServerTLS
from kvaudit.receive.memory_budget import DECODE_BYTES_PER_BODY_BYTE, DECODE_BYTES_PER_SPAN
from kvaudit.receive.otlp_http import CollectorServer, ReceiverLimits, system_backlog
from kvaudit.receive.trace_sink import MAX_REPLICA_BYTES, TraceSink

from ..support.otlp_requests import (
    PROTOBUF,
    body_of,
    post,
    raw_exchange,
    read_until_closed,
    self_signed_certificate,
    spans_of,
    status_of,
)
from ..support.waiting import wait_until

MiB = 1024 * 1024
MakeReceiver = Callable[..., CollectorServer]


@pytest.fixture
def make_receiver(tmp_path: Path) -> Iterator[MakeReceiver]:
    servers: list[CollectorServer] = []

    def make(*, security: ServerSecurity | None = None, max_open_files: int = 64, **limits: object) -> CollectorServer:
        defaults: dict[str, object] = {
            "max_body": 4 * MiB,
            "read_header_timeout_s": 2.0,
            "read_timeout_s": 4.0,
            "idle_timeout_s": 2.0,
        }
        sink = TraceSink(tmp_path / "received", fsync=False, max_open_files=max_open_files)
        server = CollectorServer(
            ("127.0.0.1", 0), sink, limits=ReceiverLimits(**{**defaults, **limits}), security=security
        )
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def _port(server: CollectorServer) -> int:
    return server.server_address[1]


def _pages_on_disk(directory: Path) -> list[tuple[str, int]]:
    store = TraceStore([directory])
    store.refresh()
    _, rows = store.query("SELECT replica, count(*) FROM spans WHERE op = 'fetch' GROUP BY 1 ORDER BY 1")
    _, errors = store.query("SELECT file, line, reason FROM read_errors")
    assert errors == []
    return rows


def _headers_only(port: int, content_length: str, extra: str = "") -> bytes:
    """Send a POST's headers and no body: the answer must come without the body being waited for."""
    head = (
        f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\n"
        f"Content-Length: {content_length}\r\n{extra}\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode())
        return read_until_closed(sock)


# --- lengths and bodies ---------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "abc", "1e3", "+5", "0x10", "5, 6", "99999999999999999999999"])
def test_negative_or_invalid_content_length_is_400_before_any_body_is_read(make_receiver: MakeReceiver, value: str):
    server = make_receiver().start()
    response = _headers_only(_port(server), value)
    assert status_of(response) == 400, response
    assert b"Connection: close" in response
    assert server.budget.peak == 0  # nothing was reserved, nothing read
    assert list(server.sink.directory.iterdir()) == []


def test_two_different_lengths_are_refused(make_receiver: MakeReceiver):
    server = make_receiver().start()
    assert status_of(_headers_only(_port(server), "10", "Content-Length: 20\r\n")) == 400


def test_chunked_bodies_are_refused_with_411(make_receiver: MakeReceiver):
    server = make_receiver().start()
    head = f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert status_of(raw_exchange(_port(server), head.encode() + b"5\r\nhello\r\n0\r\n\r\n")) == 411


def test_every_gzip_member_is_read(make_receiver: MakeReceiver):
    server = make_receiver().start()
    # Concatenated protobuf messages merge: two members are one request of both replicas.
    body = gzip.compress(body_of(("r1", 3))) + gzip.compress(body_of(("r2", 2)))
    status, _, _ = post(_port(server), body, {"Content-Encoding": "gzip"})
    assert status == 200
    assert _pages_on_disk(server.sink.directory) == [("r1", 3), ("r2", 2)]


def test_a_gzip_bomb_is_refused_after_inflating_no_more_than_the_limit(make_receiver: MakeReceiver):
    server = make_receiver(max_body=4 * MiB).start()
    bomb = gzip.compress(b"\x00" * (31 * MiB), compresslevel=9)  # about 31 KiB on the wire
    assert len(bomb) < 64 * 1024
    status, _, message = post(_port(server), bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and b"once decompressed" in message
    # What it could reserve: its compressed bytes, and at most the limit inflated (with decoding's share).
    assert server.budget.peak <= len(bomb) + (4 * MiB + 1024 * 1024) * (1 + DECODE_BYTES_PER_BODY_BYTE)
    assert server.budget.used == 0


def test_a_bomb_in_a_later_member_is_refused(make_receiver: MakeReceiver):
    server = make_receiver(max_body=4 * MiB).start()
    body = gzip.compress(body_of(("r1", 2))) + gzip.compress(b"\x00" * (8 * MiB))
    status, _, _ = post(_port(server), body, {"Content-Encoding": "gzip"})
    assert status == 413
    assert list(server.sink.directory.iterdir()) == []


def test_trailing_garbage_after_a_gzip_member_is_400(make_receiver: MakeReceiver):
    server = make_receiver().start()
    status, _, _ = post(_port(server), gzip.compress(body_of(("r1", 1))) + b"not gzip", {"Content-Encoding": "gzip"})
    assert status == 400
    assert list(server.sink.directory.iterdir()) == []


def test_deep_json_is_400_without_a_traceback(make_receiver: MakeReceiver, caplog: pytest.LogCaptureFixture):
    server = make_receiver().start()
    deep = b'{"resourceSpans": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with caplog.at_level(logging.DEBUG):
        status, _, message = post(_port(server), deep, {"Content-Type": "application/json"})
    assert status == 400 and b"nested too deeply" in message
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_deep_protobuf_is_400(make_receiver: MakeReceiver):
    server = make_receiver().start()

    def varint(n: int) -> bytes:
        out = b""
        while n > 0x7F:
            out += bytes([(n & 0x7F) | 0x80])
            n >>= 7
        return out + bytes([n])

    value = b""  # AnyValue{kvlist_value: {values: [KeyValue{key: "k", value: <value>}]}}, 20,000 deep
    for _ in range(20_000):
        key_value = b"\x0a\x01k\x12" + varint(len(value)) + value
        kv_list = b"\x0a" + varint(len(key_value)) + key_value
        value = b"\x32" + varint(len(kv_list)) + kv_list
    attribute = b"\x0a\x01a\x12" + varint(len(value)) + value
    resource = b"\x0a" + varint(len(attribute)) + attribute
    resource_spans = b"\x0a" + varint(len(resource)) + resource
    body = b"\x0a" + varint(len(resource_spans)) + resource_spans
    status, _, message = post(_port(server), body)
    assert status == 400 and b"invalid protobuf" in message


# --- memory budget ----------------------------------------------------------------------


def test_over_the_memory_budget_is_503_with_retry_after_and_room_returns(make_receiver: MakeReceiver):
    body = body_of(("r1", 100), pages=16)
    need = len(body) * (1 + DECODE_BYTES_PER_BODY_BYTE) + 100 * DECODE_BYTES_PER_SPAN
    server = make_receiver(max_body=16 * MiB, memory_limit=need + MiB // 2).start()
    port = _port(server)
    holder = socket.create_connection(("127.0.0.1", port), timeout=10)
    # A request whose body has 1 MiB arrived holds it, and the next step of its body.
    head = f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\nContent-Length: {MiB + 1}\r\n\r\n"
    holder.sendall(head.encode() + b"\x0a" * MiB)
    wait_until(lambda: server.budget.used > MiB, what="the first request reserved its body", interval=0.01)
    status, headers, reply = post(port, body)
    assert status == 503 and headers["Retry-After"] == "1"
    assert b"held by 1 other requests (1 receiving their bodies, holding 1.0 MiB" in reply
    holder.close()
    wait_until(lambda: not server.budget.used, what="the abandoned request's reservation given back", interval=0.01)
    assert post(port, body)[0] == 200
    assert server.sink.stats.refused == 1


def test_a_request_that_could_never_fit_is_413_not_503(make_receiver: MakeReceiver):
    server = make_receiver(max_body=4 * MiB, memory_limit=2 * MiB).start()
    body = gzip.compress(body_of(("r1", 40), pages=16))
    status, headers, _ = post(_port(server), body, {"Content-Encoding": "gzip"})
    assert status == 413 and "Retry-After" not in headers


def test_concurrent_large_gzip_bodies_stay_within_the_budget(make_receiver: MakeReceiver):
    limit = 48 * MiB
    server = make_receiver(max_body=8 * MiB, memory_limit=limit).start()
    # Eight bodies of their own spans: a span received twice is read once (kvaudit.read.span_identity).
    payloads = [body_of(("r1", 60), pages=16) for _ in range(8)]
    bodies = [gzip.compress(payload) for payload in payloads]
    need = len(bodies[0]) + len(payloads[0]) * (1 + DECODE_BYTES_PER_BODY_BYTE)
    assert need < limit < 8 * need  # one fits, eight at once do not
    statuses: list[int] = []

    def accepted(body: bytes) -> bool:
        status, _, _ = post(_port(server), body, {"Content-Encoding": "gzip"})
        statuses.append(status)
        return status != 503

    def send(body: bytes) -> None:
        # Retry 503s as an OTLP exporter does, until accepted.
        wait_until(lambda: accepted(body), what="the request accepted", interval=0.05)

    threads = [threading.Thread(target=send, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses.count(200) == 8 and set(statuses) <= {200, 503}
    assert server.budget.peak <= limit
    assert _pages_on_disk(server.sink.directory) == [("r1", 8 * 60)]


# --- slow and idle clients, connections, backlog ----------------------------------------


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent before closing `sock`; fails if it is still open after `seconds`."""
    sock.settimeout(seconds)
    try:
        return read_until_closed(sock)
    except TimeoutError:
        pytest.fail(f"the server kept the connection open past {seconds} s")


def test_half_sent_headers_are_cut_off_at_the_header_deadline(make_receiver: MakeReceiver):
    server = make_receiver(read_header_timeout_s=1.0).start()
    sock = socket.create_connection(("127.0.0.1", _port(server)), timeout=10)
    sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
    stop = threading.Event()

    def trickle() -> None:  # one header byte every 100 ms: each read alone is quick
        while not stop.wait(0.1):
            try:
                sock.send(b"X")
            except OSError:
                return

    threading.Thread(target=trickle, daemon=True).start()
    try:
        _closed_within(sock, 15)
    finally:
        stop.set()
        sock.close()
    assert server.sink.stats.timeouts >= 1
    assert post(_port(server), body_of(("r1", 1)))[0] == 200  # the receiver serves on


def test_a_slow_body_is_answered_408_at_the_read_deadline(make_receiver: MakeReceiver):
    server = make_receiver(read_timeout_s=1.5).start()
    sock = socket.create_connection(("127.0.0.1", _port(server)), timeout=10)
    sock.sendall(
        f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\nContent-Length: 1000\r\n\r\n".encode()
    )
    sock.sendall(b"\x0a" * 10)
    response = _closed_within(sock, 15)
    sock.close()
    assert status_of(response) == 408
    assert server.budget.used == 0


def test_a_sender_reset_mid_body_gives_its_reservation_back_and_is_no_write_failure(
    make_receiver: MakeReceiver, caplog: pytest.LogCaptureFixture
):
    server = make_receiver().start()
    sock = socket.create_connection(("127.0.0.1", _port(server)), timeout=10)
    sock.sendall(
        f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\nContent-Length: {MiB}\r\n\r\n".encode()
    )
    sock.sendall(b"\x0a" * 1000)
    wait_until(lambda: server.budget.used, what="the request reserved its body", interval=0.01)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with caplog.at_level(logging.WARNING):
        sock.close()  # a reset, not an orderly end
        wait_until(lambda: not server.budget.used, what="the reset request's reservation given back", interval=0.01)
        assert post(_port(server), body_of(("r1", 1)))[0] == 200
    assert server.sink.stats.write_failures == 0
    assert not caplog.records


def test_idle_connections_are_closed(make_receiver: MakeReceiver):
    server = make_receiver(read_header_timeout_s=1.0, idle_timeout_s=1.0).start()
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=10) as silent:
        assert _closed_within(silent, 15) == b""


def test_connections_beyond_the_maximum_are_answered_503(make_receiver: MakeReceiver):
    server = make_receiver(max_connections=2, read_header_timeout_s=30.0).start()
    port = _port(server)
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
    for sock in held:
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\n")  # half-sent: each holds a slot
    try:

        def refused() -> bytes | None:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as third:
                response = _closed_within(third, 15)
            return response if status_of(response) == 503 else None

        response = wait_until(refused, what="the held connections filled the slots", interval=0)
        assert b"Retry-After: 1" in response
    finally:
        for sock in held:
            sock.close()


def test_the_listen_backlog_is_the_systems(make_receiver: MakeReceiver):
    server = make_receiver()  # bound and listening, not accepting yet
    assert server.request_queue_size == system_backlog() >= 128
    burst = []
    try:
        # With a backlog of 5 (http.server's default) most of these would wait for a SYN retry.
        for _ in range(100):
            burst.append(socket.create_connection(("127.0.0.1", _port(server)), timeout=2))
        server.start()
        for sock in burst:
            sock.sendall(b"GET /v1/traces HTTP/1.1\r\nHost: x\r\n\r\n")
        assert all(status_of(_closed_within(sock, 15)) == 405 for sock in burst)
    finally:
        for sock in burst:
            sock.close()


# --- files --------------------------------------------------------------------------------


def _open_descriptors_under(directory: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory)):
                count += 1
        except OSError:
            pass
    return count


def test_open_files_are_bounded_least_recently_used_closed_and_reopened(make_receiver: MakeReceiver):
    server = make_receiver(max_open_files=8).start()
    port = _port(server)
    directory = server.sink.directory
    bodies = {f"replica-{n}": body_of((f"replica-{n}", 1), pages=1) for n in range(300)}
    for body in bodies.values():
        assert post(port, body)[0] == 200
        assert _open_descriptors_under(directory) <= 8
    assert post(port, bodies["replica-0"])[0] == 200  # closed long ago: opened again
    assert _open_descriptors_under(directory) <= 8
    lines = {path.stem: path.read_bytes().count(b"\n") for path in directory.iterdir()}
    assert len(lines) == 300 and lines["replica-0"] == 2
    assert all(count == 1 for name, count in lines.items() if name != "replica-0")


def test_a_file_deleted_under_the_receiver_is_reopened_and_its_spans_counted_lost(make_receiver: MakeReceiver):
    server = make_receiver().start()
    path = server.sink.directory / "r1.jsonl"
    assert post(_port(server), body_of(("r1", 3)))[0] == 200
    path.unlink()
    assert post(_port(server), body_of(("r1", 2)))[0] == 200
    assert server.sink.lost_spans == 3
    assert _pages_on_disk(server.sink.directory) == [("r1", 2)]


@pytest.mark.parametrize(
    "replica", ["../../escaped", "/etc/cron.d/x", "..", ".", "a/../../b", "nul\x00byte", "new\nline", ""]
)
def test_replica_names_cannot_leave_the_directory(make_receiver: MakeReceiver, tmp_path: Path, replica: str):
    server = make_receiver().start()
    assert post(_port(server), body_of((replica, 1), pages=1))[0] == 200
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) == 1 and written[0].parent == server.sink.directory


# --- partial success ----------------------------------------------------------------------


def test_a_bad_part_is_partial_success_and_the_official_exporter_writes_one_copy(make_receiver: MakeReceiver):
    server = make_receiver().start()
    long_id = "x" * 10_000
    spans = spans_of("r1", 3) + spans_of(long_id, 2)
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", timeout=10)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert [p.name for p in server.sink.directory.iterdir()] == ["r1.jsonl"]
    assert (server.sink.directory / "r1.jsonl").read_bytes().count(b"\n") == 1  # one copy, no retry
    assert server.sink.stats.rejected_spans == 2 and server.sink.stats.requests == 1
    assert _pages_on_disk(server.sink.directory) == [("r1", 3)]


def test_partial_success_response_says_what_was_rejected(make_receiver: MakeReceiver):
    server = make_receiver().start()
    body = body_of(("r1", 1), ("y" * (MAX_REPLICA_BYTES + 1), 4))
    status, _, reply = post(_port(server), body)
    assert status == 200
    response = ExportTraceServiceResponse.FromString(reply)
    assert response.partial_success.rejected_spans == 4
    assert f"longer than {MAX_REPLICA_BYTES} bytes" in response.partial_success.error_message


def test_partial_success_in_json(make_receiver: MakeReceiver):
    from kvaudit.otlp.encode import spans_to_line

    server = make_receiver().start()
    body = spans_to_line(spans_of("r1", 1) + spans_of("z" * 500, 2))
    status, _, reply = post(_port(server), body, {"Content-Type": "application/json"})
    assert status == 200
    assert json.loads(reply)["partialSuccess"]["rejectedSpans"] == "2"


def test_a_request_with_nothing_acceptable_is_400_and_not_retried(make_receiver: MakeReceiver):
    server = make_receiver().start()
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", timeout=10)
    assert exporter.export(spans_of("x" * 10_000, 2)) is SpanExportResult.FAILURE
    exporter.shutdown()
    assert server.sink.stats.rejected == 1  # one request: a 400 is not retried
    assert list(server.sink.directory.iterdir()) == []


def test_a_failed_write_of_one_replica_leaves_no_other_replicas_lines(make_receiver: MakeReceiver):
    server = make_receiver().start()
    directory = server.sink.directory
    (directory / "r2.jsonl").mkdir()  # r2's file cannot be opened: a server-side failure
    body = body_of(("r1", 2), ("r2", 2))
    status, headers, _ = post(_port(server), body)
    assert status == 503 and headers["Retry-After"] == "1"
    assert not (directory / "r1.jsonl").exists()  # made for the request, removed: a retry cannot duplicate it
    (directory / "r2.jsonl").rmdir()
    assert post(_port(server), body)[0] == 200
    assert _pages_on_disk(directory) == [("r1", 2), ("r2", 2)]


# --- TLS and bearer tokens ----------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    return self_signed_certificate(tmp_path)


def test_tls_and_bearer_token_with_the_official_exporter(make_receiver: MakeReceiver, certificate: tuple[Path, Path]):
    cert_file, key_file = certificate
    security = ServerSecurity(ServerTLS(str(cert_file), str(key_file)), BearerToken("s3cret"))
    server = make_receiver(security=security).start()
    assert server.url.startswith("https://")
    # A client that connects and never shakes hands holds its own connection only.
    silent = socket.create_connection(("127.0.0.1", _port(server)), timeout=10)
    try:
        endpoint = f"{server.url}/v1/traces"
        good = OTLPSpanExporter(
            endpoint=endpoint, certificate_file=str(cert_file), headers={"Authorization": "Bearer s3cret"}, timeout=10
        )
        assert good.export(spans_of("r1", 2)) is SpanExportResult.SUCCESS
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic czNjcmV0"}):
            bad = OTLPSpanExporter(endpoint=endpoint, certificate_file=str(cert_file), headers=headers, timeout=10)
            assert bad.export(spans_of("r2", 1)) is SpanExportResult.FAILURE
            bad.shutdown()
        good.shutdown()
    finally:
        silent.close()
    assert server.sink.stats.unauthorized == 3
    assert _pages_on_disk(server.sink.directory) == [("r1", 2)]
    # Plain HTTP to the TLS port: no answer, and the receiver serves on.
    raw_exchange(_port(server), b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert server.sink.stats.requests == 1


def test_a_client_ca_requires_client_certificates_it_signed(make_receiver: MakeReceiver, tmp_path: Path):
    server_cert, server_key = self_signed_certificate(tmp_path)
    (tmp_path / "client").mkdir()
    client_cert, client_key = self_signed_certificate(tmp_path / "client")
    (tmp_path / "stranger").mkdir()
    stranger_cert, stranger_key = self_signed_certificate(tmp_path / "stranger")
    # The client's self-signed certificate is its own CA: tls.client_ca_file names it.
    security = ServerSecurity(ServerTLS(str(server_cert), str(server_key), str(client_cert)))
    server = make_receiver(security=security).start()
    endpoint = f"{server.url}/v1/traces"
    clients = (("r1", client_cert, client_key), ("r2", stranger_cert, stranger_key), ("r3", None, None))
    for replica, cert, key in clients:
        exporter = OTLPSpanExporter(
            endpoint=endpoint,
            certificate_file=str(server_cert),
            client_certificate_file=cert and str(cert),
            client_key_file=key and str(key),
            timeout=10 if replica == "r1" else 2,  # a refused handshake is retried until the timeout
        )
        expected = SpanExportResult.SUCCESS if replica == "r1" else SpanExportResult.FAILURE
        assert exporter.export(spans_of(replica, 1)) is expected
        exporter.shutdown()
    assert _pages_on_disk(server.sink.directory) == [("r1", 1)]
