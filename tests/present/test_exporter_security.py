"""`kvaudit exporter` behind TLS and a bearer token, scraped by a real HTTPS client."""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.commands.metrics_server import serve
from kvaudit.read.store import TraceStore
from kvaudit.receive.http_security import BearerToken, ServerSecurity, ServerTLS

from ..support import alert_traces
from ..support.exporter import caught_up
from ..support.otlp_requests import self_signed_certificate


def test_metrics_over_tls_only_with_the_token(trace_dir: Path, tmp_path: Path):
    alert_traces.recomputed_prefixes(trace_dir)
    cert_file, key_file = self_signed_certificate(tmp_path)
    security = ServerSecurity(ServerTLS(str(cert_file), str(key_file)), BearerToken("s3cret"))
    server, port = serve(DuckDBBackend(TraceStore([trace_dir])), "127.0.0.1", 0, settle_s=0, security=security)
    trusting = ssl.create_default_context(cafile=str(cert_file))
    url = f"https://127.0.0.1:{port}/metrics"
    silent = socket.create_connection(("127.0.0.1", port), timeout=10)  # never shakes hands: holds only itself
    try:
        caught_up(server)
        request = urllib.request.Request(url, headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(request, context=trusting, timeout=30) as reply:
            assert reply.status == 200 and b"kvaudit_pages_total" in reply.read()
        for headers in ({}, {"Authorization": "Bearer nope"}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), context=trusting, timeout=30)
            assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"] == "Bearer"
        with pytest.raises(OSError):  # plain HTTP gets no metrics, only a closed connection
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30)
    finally:
        silent.close()
        server.shutdown()
