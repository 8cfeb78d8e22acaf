"""OTLP/HTTP requests for receiver tests: real export bodies, raw HTTP, certificates.

Bodies are what the official OTLP encoder makes of kvaudit's spans; requests go over
raw sockets or http.client, so malformed ones reach the receiver as sent.
"""

from __future__ import annotations

import datetime
import http.client
import socket
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvaudit.contract import Hook, Op, Outcome
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import replica_resource
from kvaudit.emit.span_batcher import SpanBatcher

from .pages import KV, full_page

PROTOBUF = "application/x-protobuf"


def spans_of(replica: str, count: int, pages: int = 4) -> list[ReadableSpan]:
    """`count` fetch spans of `replica`, each with `pages` full page descriptors, made by kvaudit's emitter."""
    keep = InMemorySpanExporter()
    emitter = Emitter(replica_resource(replica, engine="vllm", kv=KV), SpanBatcher(keep, max_queue=count + 8))
    for n in range(count):
        with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id=f"{replica}-{n}") as op:
            for i in range(pages):
                op.add_page(full_page(f"{n:032x}{i:032x}", i, used=True))
            op.end(Outcome.HIT, tokens_hit=32 * pages)
    emitter.flush()
    return [span for span in keep.get_finished_spans() if span.name != "kvaudit.telemetry"]


def body_of(*replica_counts: tuple[str, int], pages: int = 4) -> bytes:
    """One protobuf export request carrying `count` spans of each `replica`."""
    spans = [span for replica, count in replica_counts for span in spans_of(replica, count, pages)]
    return encode_spans(spans).SerializeToString()


def post(
    port: int,
    body: bytes,
    headers: dict[str, str] | None = None,
    path: str = "/v1/traces",
    timeout: float = 30,
) -> tuple[int, dict[str, str], bytes]:
    """POST through http.client: status, headers, body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": PROTOBUF, **(headers or {})})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def raw_exchange(port: int, data: bytes, timeout: float = 30) -> bytes:
    """Send `data` as it is over a socket, half-close, and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server may answer and close before it has read it all
            pass
        return read_until_closed(sock)


def read_until_closed(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/") else 0


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files (the client trusts the certificate itself)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kvaudit test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file
