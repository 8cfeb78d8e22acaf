"""The real `kvaudit tui` in a real terminal: tmux runs it, sends keys and reads the screen back."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .tui_fleet import Fleet, fleet_fixture  # noqa: F401 - the fixture

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (scripts/install-tmux.sh installs it)"
)


class Terminal:
    """One tmux server of our own (its own socket), one window running a command."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    def tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], check=True, capture_output=True, text=True, timeout=10
        ).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "tui")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "tui", *keys)

    def wait_for(self, text: str, timeout_s: float = 20.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.screen()
            if text in screen:
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never showed; the screen was:\n{screen}")
            time.sleep(0.2)

    def wait_until_gone(self, text: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while text in self.screen():
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} stayed on the screen")
            time.sleep(0.2)

    def running(self) -> bool:
        session = subprocess.run(["tmux", "-L", self.socket, "has-session", "-t", "tui"], capture_output=True)
        return session.returncode == 0


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    terminal = Terminal(f"kvaudit-test-{tmp_path.name}")
    yield terminal
    subprocess.run(["tmux", "-L", terminal.socket, "kill-server"], capture_output=True)


def test_real_terminal(fleet: Fleet, trace_dir: Path, terminal: Terminal):
    fleet.conversation("r1", "r2", 0)
    # COLUMNS and LINES (set by some runners) would override the terminal's own size.
    command = f"env -u COLUMNS -u LINES {sys.executable} -m kvaudit tui {trace_dir} --interval 200ms"
    terminal.tmux("-f", "/dev/null", "new-session", "-d", "-s", "tui", "-x", "160", "-y", "45", command)

    screen = terminal.wait_for("r2")
    assert "LIVE" in screen and "replicas" in screen and "findings" in screen

    fleet.conversation("r1", "r3", 1)  # the file grows while the app runs
    terminal.wait_for("r3")

    terminal.keys("p")
    terminal.wait_for("PAUSED")
    terminal.keys("p")
    terminal.wait_for("LIVE")

    terminal.keys("?")
    terminal.wait_for("pause or resume reading the traces")
    # A terminal cannot tell Escape from the start of an Alt sequence if a key follows at once.
    terminal.keys("Escape")
    terminal.wait_until_gone("pause or resume reading the traces")

    terminal.keys("/")
    terminal.wait_for("enter applies, escape clears")  # the filter field has the focus
    terminal.keys("replica:r3", "Enter")
    screen = terminal.wait_for("filter: replica:r3")
    assert "│ r3 " in screen and "│ r2 " not in screen

    terminal.keys("q")
    deadline = time.monotonic() + 10
    while terminal.running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not terminal.running(), "q did not quit the app"
