"""The HTTP server of `kvaudit exporter`: prometheus_client's /metrics application on kvaudit's server pieces.

prometheus_client's `start_http_server` has TLS but no authentication, and shakes hands
on the thread that accepts connections; this serves the same WSGI app on kvaudit's
server pieces instead: TLS on each connection's own thread, and the bearer token
checked before the figures are computed.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from kvaudit.backends import Backend
from kvaudit.present.exporter_metrics import ANALYSE_EVERY_S, TraceMetrics
from kvaudit.present.exporter_reuse import SETTLE_S
from kvaudit.receive.http_security import BearerToken, SecureServerMixin, ServerSecurity

# A scrape that stalls (or a client that connects and says nothing) gives up its thread after this.
SCRAPE_IO_TIMEOUT_S = 30.0


class _MetricsServer(SecureServerMixin, ThreadingWSGIServer):
    handshake_timeout_s = SCRAPE_IO_TIMEOUT_S
    metrics: TraceMetrics | None = None

    def shutdown(self) -> None:
        """Stop serving, then stop the figures' threads."""
        super().shutdown()
        if self.metrics is not None:
            self.metrics.stop()


class _QuietHandler(WSGIRequestHandler):
    timeout = SCRAPE_IO_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        """Scrapes are not logged."""


def serve(
    backend: Backend,
    host: str,
    port: int,
    *,
    skew_s: float = 1.0,
    analyse_every_s: float = ANALYSE_EVERY_S,
    settle_s: float = SETTLE_S,
    security: ServerSecurity | None = None,
) -> tuple[WSGIServer, int]:
    """Start serving /metrics in a background thread, and reading the traces in others
    (`TraceMetrics`); returns the server (its `shutdown()` stops them all) and its port.

    Raises:
        OSError: the address cannot be bound, or the TLS certificate or key cannot be loaded.
    """
    security = security or ServerSecurity()
    registry = CollectorRegistry()
    metrics = TraceMetrics(backend, skew_s=skew_s, analyse_every_s=analyse_every_s, settle_s=settle_s)
    registry.register(metrics)
    app = make_wsgi_app(registry)
    if security.bearer is not None:
        app = _bearer_required(app, security.bearer)
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_class = type("MetricsServer", (_MetricsServer,), {"address_family": family})
    server = make_server(host, port, app, server_class, handler_class=_QuietHandler)
    server.tls_context = security.tls.context() if security.tls else None  # type: ignore[attr-defined]
    server.metrics = metrics.start()  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, name="kvaudit-exporter-http", daemon=True).start()
    return server, server.server_port


def _bearer_required(app: Callable[..., Iterable[bytes]], bearer: BearerToken) -> Callable[..., Iterable[bytes]]:
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if bearer.accepts(environ.get("HTTP_AUTHORIZATION")):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"), ("WWW-Authenticate", "Bearer")]
        )
        return [b"a bearer token is required\n"]

    return guarded
