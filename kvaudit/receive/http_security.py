"""TLS and bearer-token authentication for kvaudit's HTTP servers (`collect`, `exporter`), in the Collector's terms.

- TLS mirrors `configtls`' server settings: `cert_file`, `key_file`, `client_ca_file`
  (clients must then present a certificate it signed), minimum version TLS 1.2.
- Authentication mirrors the `bearertokenauth` extension: `token` (or `filename`),
  checked against the `Authorization: Bearer <token>` header; anything else is 401.

The TLS handshake runs on the connection's own thread, under a timeout, never on the
thread that accepts connections: a client that connects and stays silent holds only
its own connection.
"""

from __future__ import annotations

import hmac
import logging
import socketserver
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

logger = logging.getLogger(__name__)

BEARER_SCHEME: Final = "Bearer"


@dataclass(frozen=True)
class ServerTLS:
    """configtls' server settings: `tls.cert_file`, `tls.key_file`, `tls.client_ca_file`."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def context(self) -> ssl.SSLContext:
        """The server's TLS context.

        Raises:
            OSError, ssl.SSLError: a file cannot be read or does not hold what it should.
        """
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            context.load_verify_locations(self.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


@dataclass(frozen=True)
class BearerToken:
    """bearertokenauth's server side: requests must carry `Authorization: Bearer <token>`."""

    token: str

    @classmethod
    def from_file(cls, path: str | Path) -> BearerToken:
        """The token in a file (bearertokenauth's `filename`), surrounding whitespace removed.

        Raises:
            OSError: the file cannot be read.
            ValueError: it is empty.
        """
        token = Path(path).read_text().strip()
        if not token:
            raise ValueError(f"{path}: empty bearer token file")
        return cls(token)

    def accepts(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header value carries the token (compared in constant time)."""
        if not authorization:
            return False
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != BEARER_SCHEME.lower():
            return False
        return hmac.compare_digest(credentials.strip().encode(), self.token.encode())


@dataclass(frozen=True)
class ServerSecurity:
    """What a kvaudit HTTP server asks of its clients: TLS, a bearer token, both or neither."""

    tls: ServerTLS | None = None
    bearer: BearerToken | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"


class SecureServerMixin(socketserver.BaseServer):
    """For a threading `socketserver` server: TLS on each accepted connection, the handshake on its own thread.

    Set `tls_context` (None: plain TCP) and `handshake_timeout_s` before serving.
    """

    tls_context: ssl.SSLContext | None = None
    handshake_timeout_s: float = 10.0

    def get_request(self) -> tuple[Any, Any]:
        connection, address = super().get_request()  # type: ignore[misc]
        if self.tls_context is not None:
            connection = self.tls_context.wrap_socket(connection, server_side=True, do_handshake_on_connect=False)
        return connection, address

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            request.settimeout(self.handshake_timeout_s)
            try:
                request.do_handshake()
            except (OSError, ssl.SSLError) as exc:  # a port scan, plain HTTP, a wrong certificate
                logger.debug("TLS handshake with %s failed: %s", client_address, exc)
                return
        super().finish_request(request, client_address)
