"""The real `kvaudit tui` in a real terminal, 160x45 and 80x24: tmux runs it, sends keys, reads the screen."""

from __future__ import annotations

import sys
from pathlib import Path

from ..support.tmux import Terminal, needs_tmux, terminal_fixture  # noqa: F401 - the fixture
from ..support.tui_app import PACKED, UNPACKED, plant_bad_fetch
from ..support.tui_fleet import Fleet, fleet_fixture  # noqa: F401 - the fixture
from ..support.waiting import wait_until

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
    wait_until(lambda: not terminal.running(), what="q quit the app")


def test_real_terminal_at_80x24(fleet: Fleet, trace_dir: Path, terminal: Terminal):
    """The real auditor and the default rule pack, in the smallest terminal kvaudit is made for."""
    fleet.conversation("r1", "r2", 0)
    plant_bad_fetch(fleet)
    command = f"env -u COLUMNS -u LINES {sys.executable} -m kvaudit tui {trace_dir} --interval 200ms"
    terminal.start(command, width=80, height=24)

    screen = terminal.wait_for("KVA004")  # audited: the findings arrived
    assert "critical" in screen and "hit rate" in screen and "hit tokens" in screen  # the columns that matter
    terminal.wait_for("alerts: default rule pack")
    terminal.wait_for("KVAuditCriticalFin")
    terminal.wait_until_gone("auditing…")

    terminal.keys("/")
    terminal.wait_for("enter applies, escape clears")
    terminal.keys("rule:KVA004", "Enter")
    terminal.wait_for("filter: rule:KVA004")
    terminal.keys("Enter")  # the drill-down: the values compared, whole
    screen = terminal.wait_for("fetched descriptor")
    screen = terminal.wait_for(UNPACKED)
    assert PACKED in screen
    terminal.keys("Escape")
    terminal.wait_until_gone("fetched descriptor")

    terminal.keys("?")
    screen = terminal.wait_for("pause or resume reading the traces")
    for line in screen.splitlines():
        if "pause or resume" in line or "quit" in line:
            assert line.rstrip().endswith("│"), f"the help box is cut at the right edge: {line!r}"
    terminal.keys("Escape")
    terminal.wait_until_gone("pause or resume reading the traces")
    terminal.keys("q")
    wait_until(lambda: not terminal.running(), what="q quit the app")
