"""The TLS and bearer-token flags `kvaudit collect` and `kvaudit exporter` share, named after the Collector's settings.

`--tls-cert-file`, `--tls-key-file`, `--tls-client-ca-file` are configtls' `cert_file`,
`key_file`, `client_ca_file`; `--bearer-token` and `--bearer-token-file` are the
bearertokenauth extension's `token` and `filename`.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from typing import Final

from kvaudit.commands.arguments import UsageError
from kvaudit.receive.http_security import BearerToken, ServerSecurity, ServerTLS

ENV_BEARER_TOKEN: Final = "KVAUDIT_BEARER_TOKEN"


def add_tls_auth_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS and authentication (as the Collector's configtls and bearertokenauth)")
    group.add_argument("--tls-cert-file", metavar="PATH", help="serve HTTPS with this certificate (PEM; tls.cert_file)")
    group.add_argument("--tls-key-file", metavar="PATH", help="the certificate's private key (PEM; tls.key_file)")
    group.add_argument(
        "--tls-client-ca-file",
        metavar="PATH",
        help="require client certificates signed by this CA (PEM; tls.client_ca_file)",
    )
    group.add_argument(
        "--bearer-token-file",
        metavar="PATH",
        help="require 'Authorization: Bearer <token>' with the token in this file (bearertokenauth filename)",
    )
    group.add_argument(
        "--bearer-token",
        metavar="TOKEN",
        default=os.environ.get(ENV_BEARER_TOKEN),
        help=f"the token itself (bearertokenauth token; default ${ENV_BEARER_TOKEN}; a file keeps it out of ps)",
    )


def server_security(args: argparse.Namespace) -> ServerSecurity:
    """What the flags ask of clients.

    Raises:
        UsageError: a certificate without its key (or the other way round), an unreadable token
            file, or an empty token (as an empty token file is refused).
    """
    tls = None
    if args.tls_cert_file or args.tls_key_file:
        if not (args.tls_cert_file and args.tls_key_file):
            raise UsageError("--tls-cert-file and --tls-key-file go together")
        tls = ServerTLS(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file)
    elif args.tls_client_ca_file:
        raise UsageError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
    bearer = None
    if args.bearer_token_file:
        try:
            bearer = BearerToken.from_file(args.bearer_token_file)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--bearer-token-file: {exc}") from None
    elif args.bearer_token is not None:
        if not args.bearer_token.strip():
            # Fail closed: an empty token (a variable set from an empty secret) must not mean no authentication.
            raise UsageError(
                f"--bearer-token (or ${ENV_BEARER_TOKEN}) is empty: give a token, or unset it to run without one"
            )
        bearer = BearerToken(args.bearer_token.strip())
    return ServerSecurity(tls, bearer)


def exposure_warning(host: str, security: ServerSecurity) -> str | None:
    """A line to print when a server listens beyond this machine with neither TLS nor a token."""
    if security.tls and security.bearer:
        return None
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return None
    missing = " or ".join(
        part for part, present in (("TLS", security.tls), ("a bearer token", security.bearer)) if not present
    )
    return f"listening on {host} without {missing}: anyone who can reach it can use it (docs/operations.md)"
