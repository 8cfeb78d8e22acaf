"""Servers the tests start as processes: a free port, and a process waited on until it listens."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def serving(
    command: list[str], port: int, what: str, env: Mapping[str, str] | None = None, timeout_s: float = 60
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `command` until the block ends, entering it once 127.0.0.1:`port` accepts connections.

    Raises:
        AssertionError: `what` exited or did not listen within `timeout_s`.
    """
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{what} did not start") from None
                time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
