"""A real terminal for tests: tmux runs a command in a window of a given size, takes keys, and
gives the screen (or all that scrolled by) back."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .waiting import wait_until

needs_tmux = pytest.mark.skipif(
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

    def start(self, command: str, *, width: int, height: int) -> None:
        """Run `command` (a shell line) in a `width` x `height` window that keeps 50,000 lines of history."""
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", "tui", "-x", str(width), "-y", str(height), command)
        self.tmux("set-option", "-t", "tui", "history-limit", "50000")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "tui")

    def history(self) -> list[str]:
        """Every line written so far, the lines the terminal wrapped joined again (-J)."""
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "tui").splitlines()

    def title(self) -> str:
        """The window title, as programs set it (OSC 0 and 2)."""
        return self.tmux("display-message", "-p", "-t", "tui", "#{pane_title}")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "tui", *keys)

    def wait_for(self, text: str) -> str:
        """The screen, once it shows `text`."""

        def showing() -> str | None:
            screen = self.screen()
            return screen if text in screen else None

        return wait_until(showing, what=f"{text!r} shown", interval=0.2)

    def wait_until_gone(self, text: str) -> None:
        wait_until(lambda: text not in self.screen(), what=f"{text!r} gone from the screen", interval=0.2)

    def running(self) -> bool:
        session = subprocess.run(["tmux", "-L", self.socket, "has-session", "-t", "tui"], capture_output=True)
        return session.returncode == 0


@pytest.fixture(name="terminal")
def terminal_fixture(tmp_path: Path) -> Iterator[Terminal]:
    terminal = Terminal(f"kvaudit-test-{tmp_path.name}")
    yield terminal
    subprocess.run(["tmux", "-L", terminal.socket, "kill-server"], capture_output=True)
