"""An OTLP/HTTP request body into an `ExportTraceServiceRequest`, within a size limit and a memory budget.

The size limit holds after decompression, as the Collector's `max_request_body_size`
does, and across every member of a gzip body (RFC 1952 allows several; each is read).
Decoding reserves its memory from the receiver's budget as the body inflates, so a
small compressed body cannot grow past what the budget allows.
"""

from __future__ import annotations

import zlib
from http import HTTPStatus
from typing import Final

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from kvaudit.errors import InputError
from kvaudit.otlp.encode import line_to_traces_data
from kvaudit.receive.memory_budget import DECODE_BYTES_PER_BODY_BYTE, DECODE_BYTES_PER_SPAN, Reservation

PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"
_INFLATE_CHUNK: Final = 1 << 20


class BadRequestError(InputError):
    """A request that is refused for what it is: retrying it unchanged cannot succeed."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def decode_body(
    body: bytes | bytearray, content_type: str, content_encoding: str, max_body: int, reservation: Reservation
) -> ExportTraceServiceRequest:
    """The export request in an OTLP/HTTP body; the memory decoding takes is reserved as it goes.

    Raises:
        BadRequestError: 415 for an unsupported content type or encoding, 413 when the
            decompressed body is larger than `max_body`, 400 when it does not parse.
        BudgetExceededError: decoding it does not fit in the memory budget now.
    """
    encoding = content_encoding.strip().lower()
    media = content_type.split(";")[0].strip().lower()
    if media not in (PROTOBUF, JSON):
        raise BadRequestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"unsupported Content-Type {content_type!r}")
    data: bytes | bytearray
    if encoding == "gzip":
        data = _gunzip(body, max_body, reservation)
    elif encoding in ("", "identity"):
        data = body
        reservation.grow(len(body) * DECODE_BYTES_PER_BODY_BYTE)
    else:
        raise BadRequestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"unsupported Content-Encoding {content_encoding!r}")
    if media == PROTOBUF:
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(data)
        except DecodeError as exc:
            # upb also refuses messages nested more than 100 deep here.
            raise BadRequestError(HTTPStatus.BAD_REQUEST, f"invalid protobuf: {exc}") from None
    else:
        try:
            traces = line_to_traces_data(data)
        except ValueError as exc:
            raise BadRequestError(HTTPStatus.BAD_REQUEST, f"invalid OTLP JSON: {exc}") from None
        except RecursionError:
            raise BadRequestError(HTTPStatus.BAD_REQUEST, "invalid OTLP JSON: nested too deeply") from None
        request = ExportTraceServiceRequest(resource_spans=traces.resource_spans)
    # Encoding the spans as a line costs per span as well as per byte (tiny spans cost most).
    spans = sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)
    reservation.grow(spans * DECODE_BYTES_PER_SPAN)
    return request


def _gunzip(body: bytes, max_body: int, reservation: Reservation) -> bytearray:
    """Every member of a gzip body, at most `max_body` bytes in all, reserved chunk by chunk."""
    out = bytearray()
    data = body
    while True:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        while not inflater.eof:
            try:
                chunk = inflater.decompress(data, _INFLATE_CHUNK)
            except zlib.error as exc:
                raise BadRequestError(HTTPStatus.BAD_REQUEST, f"invalid gzip body: {exc}") from None
            data = inflater.unconsumed_tail
            if len(out) + len(chunk) > max_body:
                raise BadRequestError(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body larger than {max_body} bytes once decompressed"
                )
            if not chunk and not data and not inflater.eof:
                raise BadRequestError(HTTPStatus.BAD_REQUEST, "truncated gzip body")
            # The inflated bytes themselves, and what decoding them will take.
            reservation.grow(len(chunk) * (1 + DECODE_BYTES_PER_BODY_BYTE))
            out += chunk
        data = inflater.unused_data
        if not data:
            return out
