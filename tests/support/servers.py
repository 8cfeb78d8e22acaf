"""Servers the tests start: a free port, a process waited on until it listens, and two local
HTTP peers for notifications (one that records what it gets, one that never answers)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .waiting import HANG_S, wait_until


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def accepts(port: int) -> bool:
    """Whether something on 127.0.0.1:`port` accepts a connection now."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def wait_listening(proc: subprocess.Popen[Any], port: int, what: str, timeout_s: float = HANG_S) -> None:
    """Until `proc` accepts connections on 127.0.0.1:`port`.

    Raises:
        AssertionError: `what` exited first, or did not listen within `timeout_s` (a hang).
    """
    wait_until(lambda: proc.poll() is not None or accepts(port), timeout=timeout_s, what=f"{what} listening")
    assert proc.poll() is None, f"{what} exited ({proc.returncode}) before it listened"


@contextmanager
def serving(
    command: list[str], port: int, what: str, env: Mapping[str, str] | None = None, timeout_s: float = HANG_S
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `command` until the block ends, entering it once 127.0.0.1:`port` accepts connections.

    Raises:
        AssertionError: `what` exited or did not listen within `timeout_s`.
    """
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(proc, port, what, timeout_s)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class RecordingServer(ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 that answers every request with a small CSV and records it:
    its method and path in `requests`, each body with its headers in `bodies`, a JSON body
    also in `posts`. It answers with the statuses in `statuses` first, in order, then 200."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RecordingHandler)
        self.requests: list[str] = []
        self.bodies: list[tuple[Message, bytes]] = []
        self.posts: list[Any] = []
        self.statuses: list[int] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    def __enter__(self) -> RecordingServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()
        self.server_close()


class _RecordingHandler(BaseHTTPRequestHandler):
    server: RecordingServer

    def _answer(self) -> None:
        self.server.requests.append(f"{self.command} {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            body = self.rfile.read(length)
            self.server.bodies.append((self.headers, body))
            if self.headers.get_content_type() != "application/x-protobuf":
                self.server.posts.append(json.loads(body))
        body = b"value\n1\n"
        self.send_response(self.server.statuses.pop(0) if self.server.statuses else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = _answer  # noqa: N815 - http.server's names

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass


class HangingServer:
    """A TCP server on 127.0.0.1 that accepts connections, reads what comes and never answers:
    an Alertmanager that hangs. `accepted` counts the connections it holds."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    @property
    def accepted(self) -> int:
        return len(self._held)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # closed
                return
            self._held.append(connection)

    def __enter__(self) -> HangingServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._socket.close()
        for connection in self._held:
            connection.close()
