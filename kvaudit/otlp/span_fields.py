"""How OTLP writes a span's kind, status code and flags: the same in JSON and in protobuf."""

from __future__ import annotations

from opentelemetry.trace import SpanContext, SpanKind, StatusCode

# SpanKind in the SDK counts from 0 (INTERNAL); OTLP counts from 1 (0 is UNSPECIFIED).
KIND = {kind: kind.value + 1 for kind in SpanKind}
STATUS_CODE = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


def flags(parent: SpanContext | None) -> int:
    """OTLP span flags as the OpenTelemetry encoder sets them: "has is-remote", "is remote"."""
    return 0x300 if parent is not None and parent.is_remote else 0x100
