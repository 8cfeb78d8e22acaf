"""The real `kvaudit tui` in a real terminal: tmux runs it, sends keys and reads the screen back."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .tmux import Terminal, needs_tmux, terminal_fixture  # noqa: F401 - the fixture
from .tui_fleet import Fleet, fleet_fixture  # noqa: F401 - the fixture

pytestmark = needs_tmux


def test_real_terminal(fleet: Fleet, trace_dir: Path, terminal: Terminal):
    fleet.conversation("r1", "r2", 0)
    # COLUMNS and LINES (set by some runners) would override the terminal's own size.
    command = f"env -u COLUMNS -u LINES {sys.executable} -m kvaudit tui {trace_dir} --interval 200ms"
    terminal.start(command, width=160, height=45)

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
