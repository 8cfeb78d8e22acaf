"""A small OTLP/HTTP trace receiver writing OTLP JSON lines, one file per replica.

It speaks the OTLP/HTTP protocol (POST /v1/traces, protobuf or JSON bodies,
optionally gzip-compressed) so that several replicas can send to one place without
an OpenTelemetry Collector. A request is acknowledged only after its lines are
written whole (and fsynced, by default): nothing acknowledged is lost.

It keeps the Collector's promises (confighttp, memory_limiter, OTLP partial success,
configtls, bearertokenauth), each bounded by `ReceiverLimits`; docs/operations.md
lists them beside the Collector's defaults:

- the body limit holds after decompression, for every gzip member;
- requests hold a shared memory budget, their bodies reserved as they arrive; past it
  they are refused with 503 and Retry-After (saying what holds the budget), or 413
  before their bodies are read where the length alone could never fit;
- headers and bodies have deadlines (a slow sender cannot hold a connection), the
  connections served at once are bounded, and the listen backlog is the system's;
- a request that cannot succeed as sent is answered 4xx, a part of one that cannot
  with partial success; only what may succeed later (memory, a full disk) is
  answered as retryable, and then nothing of it was written.
"""

from __future__ import annotations

import errno
import io
import logging
import math
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)

from kvaudit.emit.line_file import NO_SPACE_ERRNOS
from kvaudit.errors import BadValueError
from kvaudit.receive.http_security import SecureServerMixin, ServerSecurity
from kvaudit.receive.memory_budget import (
    BODY_STEP,
    DECODE_BYTES_PER_BODY_BYTE,
    BudgetExceededError,
    MemoryBudget,
    Reservation,
)
from kvaudit.receive.request_body import JSON, PROTOBUF, BadRequestError, decode_body
from kvaudit.receive.trace_sink import TraceSink, WriteResult

logger = logging.getLogger(__name__)

TRACES_PATH: Final = "/v1/traces"
DEFAULT_MAX_BODY: Final = 32 * 1024 * 1024
RETRY_AFTER_BUSY_S: Final = 1  # memory budget or connections: room returns as requests finish
RETRY_AFTER_NO_SPACE_S: Final = 10  # a full disk: room returns when someone makes it
_LENGTH: Final = re.compile(r"[0-9]{1,19}")


def system_backlog() -> int:
    """The kernel's cap on a listen backlog (`net.core.somaxconn`), what Go's servers ask for."""
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text())
    except (OSError, ValueError):
        return socket.SOMAXCONN


@dataclass(frozen=True)
class ReceiverLimits:
    """Every bound the receiver keeps (flags of `kvaudit collect`; defaults in docs/operations.md).

    Attributes:
        max_body: largest body in bytes, after decompression (confighttp `max_request_body_size`).
        memory_limit: bytes requests in flight may hold together (memory_limiter `limit_mib`); 0 for none.
        read_header_timeout_s: from a request's first byte to the end of its headers.
        read_timeout_s: from a request's first byte to the end of its body.
        idle_timeout_s: a kept-alive connection's wait for its next request.
        write_timeout_s: sending a response.
        max_connections: connections served at once; more are answered 503 and closed.
        backlog: the listen backlog.
    """

    max_body: int = DEFAULT_MAX_BODY
    memory_limit: int = 1024 * 1024 * 1024
    read_header_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    idle_timeout_s: float = 60.0
    write_timeout_s: float = 30.0
    max_connections: int = 512
    backlog: int = 0  # 0: system_backlog()


class _DeadlineReader(io.RawIOBase):
    """The connection's bytes, each read bounded by one deadline for the whole phase (headers, body).

    A socket timeout alone restarts at every byte: a sender trickling one byte at a
    time would hold the connection for as long as it liked.
    """

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection
        self.deadline = math.inf
        self.timed_out = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError("read deadline passed")
            self._connection.settimeout(remaining)
            return self._connection.recv_into(buffer)
        except TimeoutError:
            self.timed_out = True
            raise


class _Handler(BaseHTTPRequestHandler):
    server: CollectorServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader, 64 * 1024)  # type: ignore[assignment]
        self._served = 0
        self._started = 0.0

    def handle_one_request(self) -> None:
        limits = self.server.limits
        # Waiting for a request: a new connection gets the header timeout, a kept-alive one the idle timeout.
        wait_s = limits.idle_timeout_s if self._served else limits.read_header_timeout_s
        self._reader.deadline = time.monotonic() + wait_s
        try:
            if not self.rfile.peek(1):
                self.close_connection = True
                return
        except OSError:  # timed out or reset while idle: nothing was asked
            self.close_connection = True
            return
        self._started = time.monotonic()
        self._reader.deadline = self._started + limits.read_header_timeout_s
        self._served += 1
        super().handle_one_request()  # a timeout in the headers closes the connection there
        if self._reader.timed_out:
            self.server.sink.stats.add(timeouts=1)
            self.close_connection = True

    def do_POST(self) -> None:
        server = self.server
        stats = server.sink.stats
        if self.path.split("?")[0] != TRACES_PATH:
            self._reply(HTTPStatus.NOT_FOUND, f"only {TRACES_PATH} is served", close=True)
            return
        bearer = server.security.bearer
        if bearer is not None and not bearer.accepts(self.headers.get("Authorization")):
            stats.add(unauthorized=1)
            self._reply(
                HTTPStatus.UNAUTHORIZED, "a bearer token is required", {"WWW-Authenticate": "Bearer"}, close=True
            )
            return
        length = self._content_length()
        if length is None:
            return
        try:
            # Given back before the answer goes out: a client that has its answer finds the budget free.
            with server.budget.reservation() as reservation:
                result = self._receive(length, reservation)
        except TimeoutError:
            self._reply(HTTPStatus.REQUEST_TIMEOUT, "body not received in time", close=True)
            return
        except BudgetExceededError as exc:
            if exc.whole:
                stats.add(rejected=1)
                message = f"request too large for the receiver: {exc}"
                self._reply(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, message, close=True)
            else:
                stats.add(refused=1)
                message = f"memory budget exhausted: {exc}"
                self._reply(HTTPStatus.SERVICE_UNAVAILABLE, message, retry_after=RETRY_AFTER_BUSY_S, close=True)
            return
        except BadRequestError as exc:
            stats.add(rejected=1)
            self._reply(exc.status, str(exc), close=True)
            return
        except OSError as exc:
            stats.add(write_failures=1)
            no_space = exc.errno in NO_SPACE_ERRNOS
            logger.error("writing traces failed, nothing of the request kept: %s", exc)
            self._reply(
                HTTPStatus.SERVICE_UNAVAILABLE,
                "no space left for traces" if no_space else "could not write traces",
                retry_after=RETRY_AFTER_NO_SPACE_S if no_space else RETRY_AFTER_BUSY_S,
            )
            return
        if result is None:
            return
        if result.rejected_spans and not result.spans:
            stats.add(rejected=1)
            self._reply(HTTPStatus.BAD_REQUEST, result.message)
            return
        self._acknowledge(result.rejected_spans, result.message)

    def _receive(self, length: int, reservation: Reservation) -> WriteResult | None:
        """Read, decode and write the request (its memory reserved as it goes); None when the peer left mid-body.

        Raises:
            TimeoutError: the body did not arrive by the read deadline.
            BudgetExceededError, BadRequestError: refused (nothing written).
            OSError: the write failed (nothing written).
        """
        # A body that, arrived and decoded, could never fit is refused before a byte of it is read.
        self.server.budget.check_whole(length * (1 + DECODE_BYTES_PER_BODY_BYTE))
        body = self._read_body(length, reservation)
        if body is None:
            return None
        reservation.receiving = False
        request = decode_body(
            body,
            self.headers.get("Content-Type", ""),
            self.headers.get("Content-Encoding", ""),
            self.server.limits.max_body,
            reservation,
        )
        del body
        return self.server.sink.write(request)

    def do_GET(self) -> None:
        self._reply(HTTPStatus.METHOD_NOT_ALLOWED, "POST trace data to /v1/traces", close=True)

    def _content_length(self) -> int | None:
        """The body's length, or None after refusing the request."""
        if self.headers.get("Transfer-Encoding"):
            self._reply(HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not accepted: send Content-Length", close=True)
            return None
        values = {value.strip() for value in self.headers.get_all("Content-Length", [])}
        if not values:
            self._reply(HTTPStatus.LENGTH_REQUIRED, "Content-Length required", close=True)
            return None
        value = values.pop()
        if values or not _LENGTH.fullmatch(value):
            self.server.sink.stats.add(rejected=1)
            self._reply(HTTPStatus.BAD_REQUEST, "invalid Content-Length", close=True)
            return None
        length = int(value)
        if length > self.server.limits.max_body:
            self.server.sink.stats.add(rejected=1)
            self._reply(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body larger than {self.server.limits.max_body} bytes", close=True
            )
            return None
        return length

    def _read_body(self, length: int, reservation: Reservation) -> bytearray | None:
        """The body, read before the request's deadline and reserved as it arrives, a MiB at a
        time; None when the peer left before sending it all.

        Raises:
            TimeoutError: it did not arrive in time.
            BudgetExceededError: what has arrived and the next MiB do not fit in the budget now.
        """
        self._reader.deadline = self._started + self.server.limits.read_timeout_s
        body = bytearray()
        while len(body) < length:
            step = min(BODY_STEP, length - len(body))
            reservation.grow(step)
            try:
                chunk = self.rfile.read(step)
            except TimeoutError:
                raise  # answered 408 by do_POST; a TimeoutError is an OSError too, not a peer gone
            except OSError:  # reset by the peer
                chunk = b""
            body += chunk
            if len(chunk) < step:
                self.close_connection = True  # the peer is gone; nothing to answer
                return None
        return body

    def _acknowledge(self, rejected_spans: int, message: str) -> None:
        response = ExportTraceServiceResponse()
        if rejected_spans:
            response.partial_success.CopyFrom(
                ExportTracePartialSuccess(rejected_spans=rejected_spans, error_message=message)
            )
        if self.headers.get("Content-Type", "").startswith(JSON):
            self._send(HTTPStatus.OK, JSON, json_format.MessageToJson(response, indent=None).encode())
        else:
            self._send(HTTPStatus.OK, PROTOBUF, response.SerializeToString())

    def _reply(
        self,
        status: HTTPStatus,
        message: str,
        headers: dict[str, str] | None = None,
        *,
        retry_after: int | None = None,
        close: bool = False,
    ) -> None:
        """Answer with a plain message; `close` when the body was not read (what is left of it never will be)."""
        # OTLP/HTTP answers errors with a google.rpc.Status; a plain message is what people read.
        if close:
            self.close_connection = True
        extra = dict(headers or {})
        if retry_after is not None:
            extra["Retry-After"] = str(retry_after)
        self._send(status, "text/plain; charset=utf-8", message.encode(), extra)

    def _send(self, status: HTTPStatus, content_type: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.connection.settimeout(self.server.limits.write_timeout_s)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        logger.debug("%s " + format, self.address_string(), *args)


class CollectorServer(SecureServerMixin, ThreadingHTTPServer):
    """The OTLP/HTTP receiver. `serve_forever()` in the foreground, or `start()` in a thread.

    Args:
        address: (host, port) to bind; port 0 picks a free one (see `.url`).
        sink: where received traces are written.
        limits: sizes, memory, timeouts and connections (see `ReceiverLimits`).
        security: TLS and bearer-token authentication (none by default).

    Raises:
        OSError: the address cannot be bound.
        ssl.SSLError: the TLS certificate or key cannot be loaded.
    """

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        sink: TraceSink,
        *,
        limits: ReceiverLimits | None = None,
        security: ServerSecurity | None = None,
    ) -> None:
        self.limits = limits or ReceiverLimits()
        self.security = security or ServerSecurity()
        self.request_queue_size = self.limits.backlog or system_backlog()
        self.tls_context = self.security.tls.context() if self.security.tls else None
        self.handshake_timeout_s = self.limits.read_header_timeout_s
        super().__init__(address, _Handler)
        self.sink = sink
        self.budget = MemoryBudget(self.limits.memory_limit)
        self._slots = threading.BoundedSemaphore(self.limits.max_connections)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"{self.security.scheme}://{host}:{port}"

    def start(self) -> CollectorServer:
        self._thread = threading.Thread(target=self.serve_forever, args=(0.1,), name="kvaudit-collect", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.sink.close()
        if self._thread is not None:
            self._thread.join()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.sink.stats.add(refused=1)
            if self.tls_context is None:
                _send_without_waiting(request, _BUSY)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # One line, not socketserver's traceback on stderr.
        error = sys.exc_info()[1]
        if isinstance(error, OSError) and error.errno in (errno.EPIPE, errno.ECONNRESET):
            logger.debug("connection from %s dropped: %s", client_address, error)
            return
        logger.error("request from %s failed: %r", client_address, error)


_BUSY: Final = (
    f"HTTP/1.1 503 Service Unavailable\r\nRetry-After: {RETRY_AFTER_BUSY_S}\r\n"
    "Content-Length: 0\r\nConnection: close\r\n\r\n"
).encode()


def _send_without_waiting(connection: socket.socket, response: bytes) -> None:
    """A short answer from the accepting thread, which must never wait on a peer."""
    try:
        connection.setblocking(False)
        connection.send(response)
    except OSError:
        pass


def parse_address(address: str, default_port: int = 4318) -> tuple[str, int]:
    """`HOST:PORT`, `HOST` or `:PORT` as a bind address (default 127.0.0.1:4318).

    Raises:
        BadValueError: a port that is not a number.
    """
    host, _, port = address.rpartition(":") if ":" in address else (address, "", "")
    try:
        return host or "127.0.0.1", int(port) if port else default_port
    except ValueError:
        raise BadValueError(f"bad address {address!r}: expected HOST:PORT") from None
