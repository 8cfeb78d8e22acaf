"""A real browser for tests: headless Chromium driven over the DevTools protocol on a pipe.

`--remote-debugging-pipe` speaks the protocol on file descriptors 3 (commands in) and 4
(replies and events out), NUL-terminated JSON: no port, no websocket library, nothing
reachable from outside. The machine has no network, and Chromium is told not to try.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (scripts/install-chromium.sh installs it)"
)
FLAGS = (
    "--headless",
    "--no-sandbox",  # tests run as root in containers, where the sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


class Browser:
    """One Chromium process with a fresh profile, and one page in it.

    `console` collects what the page said at level error (console.error, uncaught
    exceptions, failed loads), as text.
    """

    def __init__(self, profile: Path) -> None:
        commands_r, self._commands = os.pipe()
        self._replies, replies_w = os.pipe()
        # The protocol's descriptors must be 3 and 4 in the child.
        self.process = subprocess.Popen(
            [CHROMIUM or "chromium", *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=lambda: _as_3_and_4(commands_r, replies_w),
        )
        os.close(commands_r)
        os.close(replies_w)
        self._next_id = 0
        self._buffer = b""
        self.console: list[str] = []
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)

    def call(self, method: str, *, session: bool = False, timeout_s: float = 60.0, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self._event(reply)

    def wait_for(self, event: str, timeout_s: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        for seen in self.events:
            if seen["method"] == event:
                self.events.remove(seen)
                return seen
        while True:
            message = self._read(deadline)
            self._event(message)
            if message.get("method") == event:
                self.events.remove(message)
                return message

    def open(self, url: str, *, width: int, height: int) -> None:
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def resize(self, width: int, height: int) -> None:
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip

    def screenshot(self, *, full_page: bool = False) -> bytes:
        return base64.b64decode(
            self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=full_page)["data"]
        )

    def pdf(self) -> bytes:
        return base64.b64decode(self.call("Page.printToPDF", session=True, printBackground=True)["data"])

    def close(self) -> None:
        with suppress(OSError, RuntimeError, TimeoutError):
            self.call("Browser.close", timeout_s=10)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._commands)
        os.close(self._replies)

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._replies, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium went away (exit status {self.process.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _event(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.console.append(details.get("exception", {}).get("description") or details.get("text", ""))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.console.append(params["entry"]["text"])
        if method:
            self.events.append(message)


def _as_3_and_4(commands: int, replies: int) -> None:
    """In the child: the pipe ends as descriptors 3 and 4, whichever numbers they had."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (commands, replies)]  # out of 3 and 4's way first
    os.dup2(high[0], 3)
    os.dup2(high[1], 4)


@contextmanager
def chromium() -> Iterator[Browser]:
    """A browser with a fresh profile, closed and its profile removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="kvaudit-chromium-") as profile:
        browser = Browser(Path(profile))
        try:
            yield browser
        finally:
            browser.close()
