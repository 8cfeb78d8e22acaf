"""`kvaudit collect`'s limit, TLS and token flags, named as the Collector names them; wrong ones are usage errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvaudit.cli import build_parser, main
from kvaudit.commands.collect import receiver_limits
from kvaudit.commands.tls_auth import exposure_warning, server_security
from kvaudit.receive.http_security import BearerToken, ServerSecurity, ServerTLS


def test_flags_set_every_limit_and_the_collectors_tls_and_token_settings(tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text("  s3cret\n")
    args = build_parser().parse_args(
        [
            "collect",
            "--max-request-body-size", "1000",
            "--memory-limit-mib", "64",
            "--read-header-timeout", "2s",
            "--read-timeout", "500ms",
            "--max-connections", "3",
            "--tls-cert-file", "c.pem",
            "--tls-key-file", "k.pem",
            "--tls-client-ca-file", "ca.pem",
            "--bearer-token-file", str(token_file),
        ]
    )  # fmt: skip
    limits = receiver_limits(args)
    assert (limits.max_body, limits.memory_limit, limits.max_connections) == (1000, 64 << 20, 3)
    assert (limits.read_header_timeout_s, limits.read_timeout_s) == (2.0, 0.5)
    assert server_security(args) == ServerSecurity(ServerTLS("c.pem", "k.pem", "ca.pem"), BearerToken("s3cret"))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert-file", "c.pem"], "--tls-cert-file and --tls-key-file go together"),
        (["--tls-client-ca-file", "ca.pem"], "--tls-client-ca-file needs"),
        (["--bearer-token-file", "{empty}"], "empty bearer token file"),
        (["--bearer-token-file", "{missing}"], "--bearer-token-file"),
        (["--max-open-files", "0"], "--max-open-files must be at least 1"),
        (["--memory-limit-mib", "-1"], "cannot be negative"),
    ],
)
def test_wrong_flags_are_usage_errors_before_anything_listens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
):
    (tmp_path / "empty").write_text("\n")
    paths = {"{empty}": str(tmp_path / "empty"), "{missing}": str(tmp_path / "missing")}
    argv = ["collect", "--out", str(tmp_path / "out"), *(paths.get(flag, flag) for flag in flags)]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_listening_beyond_loopback_without_tls_and_a_token_is_warned():
    tls, token = ServerTLS("c.pem", "k.pem"), BearerToken("t")
    assert "without TLS or a bearer token" in (exposure_warning("0.0.0.0", ServerSecurity()) or "")
    assert "without a bearer token" in (exposure_warning("10.0.0.5", ServerSecurity(tls)) or "")
    assert exposure_warning("0.0.0.0", ServerSecurity(tls, token)) is None
    for loopback in ("127.0.0.1", "::1", "localhost"):
        assert exposure_warning(loopback, ServerSecurity()) is None
