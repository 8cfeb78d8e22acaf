"""A small OTLP/HTTP trace receiver writing OTLP JSON lines, one file per replica.

It speaks the OTLP/HTTP protocol (POST /v1/traces, protobuf or JSON bodies,
optionally gzip-compressed) so that several replicas can send to one place without
an OpenTelemetry Collector. A request is acknowledged only after its lines are
written (and fsynced, by default): nothing acknowledged is lost.
"""

from __future__ import annotations

import logging
import threading
import zlib
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from kvaudit.otlp.encode import line_to_traces_data
from kvaudit.receive.trace_sink import TraceSink

logger = logging.getLogger(__name__)

TRACES_PATH: Final = "/v1/traces"
PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"
DEFAULT_MAX_BODY: Final = 32 * 1024 * 1024


class BadRequestError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_body(body: bytes, content_type: str, content_encoding: str, max_body: int) -> ExportTraceServiceRequest:
    """The export request in an OTLP/HTTP body.

    Raises:
        BadRequestError: 415 for an unsupported content type or encoding, 413 when the
            (decompressed) body is too large, 400 when it does not parse.
    """
    encoding = content_encoding.strip().lower()
    if encoding == "gzip":
        body = _gunzip(body, max_body)
    elif encoding not in ("", "identity"):
        raise BadRequestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"unsupported Content-Encoding {content_encoding!r}")
    media = content_type.split(";")[0].strip().lower()
    if media == PROTOBUF:
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise BadRequestError(HTTPStatus.BAD_REQUEST, f"invalid protobuf: {exc}") from None
        return request
    if media == JSON:
        try:
            data = line_to_traces_data(body)
        except ValueError as exc:
            raise BadRequestError(HTTPStatus.BAD_REQUEST, f"invalid OTLP JSON: {exc}") from None
        return ExportTraceServiceRequest(resource_spans=data.resource_spans)
    raise BadRequestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"unsupported Content-Type {content_type!r}")


def _gunzip(body: bytes, max_body: int) -> bytes:
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = decompressor.decompress(body, max_body + 1)
    except zlib.error as exc:
        raise BadRequestError(HTTPStatus.BAD_REQUEST, f"invalid gzip body: {exc}") from None
    if len(out) > max_body:
        raise BadRequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body larger than {max_body} bytes")
    if not decompressor.eof:
        raise BadRequestError(HTTPStatus.BAD_REQUEST, "truncated gzip body")
    return out


class _Handler(BaseHTTPRequestHandler):
    server: CollectorServer
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        if self.path.split("?")[0] != TRACES_PATH:
            self._reply(HTTPStatus.NOT_FOUND, f"only {TRACES_PATH} is served")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._reply(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
            return
        if length > self.server.max_body:
            self.close_connection = True
            self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body larger than {self.server.max_body} bytes")
            return
        body = self.rfile.read(length)
        content_type = self.headers.get("Content-Type", "")
        try:
            request = parse_body(body, content_type, self.headers.get("Content-Encoding", ""), self.server.max_body)
            self.server.sink.write(request)
        except BadRequestError as exc:
            self.server.sink.stats.rejected += 1
            self._reply(exc.status, str(exc))
            return
        except OSError as exc:
            logger.error("writing traces failed: %s", exc)
            self._reply(HTTPStatus.SERVICE_UNAVAILABLE, "could not write traces")
            return
        if content_type.startswith(JSON):
            self._send(HTTPStatus.OK, JSON, b"{}")
        else:
            self._send(HTTPStatus.OK, PROTOBUF, ExportTraceServiceResponse().SerializeToString())

    def do_GET(self) -> None:
        self._reply(HTTPStatus.METHOD_NOT_ALLOWED, "POST trace data to /v1/traces")

    def _reply(self, status: HTTPStatus, message: str) -> None:
        # OTLP/HTTP answers errors with a google.rpc.Status; a plain message is what people read.
        self._send(status, "text/plain; charset=utf-8", message.encode())

    def _send(self, status: HTTPStatus, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        logger.debug("%s " + format, self.address_string(), *args)


class CollectorServer(ThreadingHTTPServer):
    """The OTLP/HTTP receiver. `serve_forever()` in the foreground, or `start()` in a thread.

    Args:
        address: (host, port) to bind; port 0 picks a free one (see `.url`).
        sink: where received traces are written.
        max_body: largest accepted body, compressed or not.

    Raises:
        OSError: the address cannot be bound.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], sink: TraceSink, *, max_body: int = DEFAULT_MAX_BODY) -> None:
        super().__init__(address, _Handler)
        self.sink = sink
        self.max_body = max_body
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> CollectorServer:
        self._thread = threading.Thread(target=self.serve_forever, name="kvaudit-collect", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.sink.close()
        if self._thread is not None:
            self._thread.join()


def parse_address(address: str, default_port: int = 4318) -> tuple[str, int]:
    """`HOST:PORT`, `HOST` or `:PORT` as a bind address (default 127.0.0.1:4318)."""
    host, _, port = address.rpartition(":") if ":" in address else (address, "", "")
    try:
        return host or "127.0.0.1", int(port) if port else default_port
    except ValueError:
        raise ValueError(f"bad address {address!r}: expected HOST:PORT") from None
