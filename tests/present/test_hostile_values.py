"""Trace values are data wherever they are shown: Rich markup and terminal control sequences in
a replica name and a page key crash nothing and reach no terminal raw, through the real CLI
(every command that shows them), the TUI (Textual's pilot) and a real terminal (tmux).
"""

from __future__ import annotations

import asyncio
import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest
from rich.text import Text

from kvaudit.analyse.live_audit import LiveAudit
from kvaudit.present.rows import write_rows
from kvaudit.read.store import TraceStore
from kvaudit.tui.alerting import rule_alerting
from kvaudit.tui.app import KvauditApp
from kvaudit.tui.screens.drill import DrillScreen
from kvaudit.tui.source import LiveSource
from kvaudit.tui.widgets.findings_table import FindingsTable
from kvaudit.tui.widgets.replica_table import ReplicaTable

from ..support import hostile_traces
from ..support.hostile_traces import HOSTILE_REPLICA, RAW
from ..support.tmux import Terminal, needs_tmux, terminal_fixture  # noqa: F401 - the fixture
from ..support.waiting import until

SHOWN = "[/]r9[bold red]red[/bold red]\\x1b]0;pwned\\x07\\x1b[2J\\u202e"  # the replica as people see it
RULES = """\
groups:
  - name: g
    rules:
      - alert: Fetching
        expr: SELECT replica, count(*) AS value FROM pages WHERE op = 'fetch' GROUP BY replica
        annotations: {summary: "{{ $labels.replica }} fetched {{ $value }} pages"}
"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    trace_dir = tmp_path_factory.mktemp("hostile")
    hostile_traces.write(trace_dir)
    (trace_dir.parent / "rules.yaml").write_text(RULES)
    return trace_dir


def _kvaudit(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvaudit", *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("argv", "status", "shown"),
    [
        (["audit", "{t}"], 1, "text"),
        (["audit", "{t}", "--format", "json"], 1, "json"),
        (["sql", "{t}", "SELECT * FROM replicas"], 0, "text"),
        (["sql", "{t}", "SELECT * FROM pages"], 0, "text"),
        (["sql", "{t}", "SELECT * FROM replicas", "--format", "csv"], 0, "data"),
        (["sql", "{t}", "SELECT * FROM replicas", "--format", "json"], 0, "json"),
        (["alerts", "eval", "{t}"], 1, "text"),
        (["alerts", "eval", "{t}", "--rules", "{rules}"], 1, "text"),
        (["alerts", "watch", "{t}", "--rules", "{rules}", "--once", "--state", "{state}"], 0, "text"),
        (["report", "{t}"], 1, "text"),
        (["tui", "{t}", "--snapshot"], 0, "json"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_every_command_shows_them_as_text(hostile: Path, tmp_path: Path, argv: list[str], status: int, shown: str):
    paths = {"t": hostile, "rules": hostile.parent / "rules.yaml", "state": tmp_path / "state.json"}
    result = _kvaudit(*(arg.format(**paths) for arg in argv))
    output = result.stdout + result.stderr
    assert result.returncode == status, output
    assert "Traceback" not in output and "MarkupError" not in output
    if shown == "data":  # CSV into a pipe is data for a program: the value whole (on a terminal, escaped)
        assert HOSTILE_REPLICA in {row[1] for row in csv.reader(io.StringIO(result.stdout))}
        return
    # JSON escapes control characters itself; bidirectional text it carries as data.
    for raw in RAW[:2] if shown == "json" else RAW:
        assert raw not in output, f"{raw!r} reached the terminal"
    if shown == "text":
        assert "[/]r9[bold red]red[/bold red]" in output  # the markup shown as written
        assert "\\x1b" in output  # the control characters shown as escapes


def test_csv_on_a_terminal_is_escaped():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    write_rows(["replica"], [(HOSTILE_REPLICA,)], "csv", stream)
    assert stream.getvalue() == f"replica\n{SHOWN}\n"  # CSV lines end with LF, as every other output


def test_the_tui_shows_them_as_text(hostile: Path):
    source = LiveSource(
        TraceStore([hostile], workers=1),
        auditor=LiveAudit(skew_s=1.0),
        alerting=rule_alerting(str(hostile.parent / "rules.yaml")),
        audit_interval_s=0,
    )
    app = KvauditApp(source, watching=f"{hostile}\x1b[2J", interval_s=0.25)

    async def scenario() -> None:
        async with app.run_test(size=(200, 50)) as pilot:
            replicas = app.query_one(ReplicaTable)
            findings = app.query_one(FindingsTable)
            await until(lambda: replicas.row_count == 2 and findings.row_count == 3)
            await until(lambda: bool(app.main.figures and app.main.figures.alerts))
            shown = [replicas.get_row_at(i)[0] for i in range(replicas.row_count)]
            assert all(isinstance(cell, Text) for cell in shown)
            assert SHOWN in [cell.plain for cell in shown]
            await pilot.press("enter")  # the drill-down quotes the replica and the key too
            await until(lambda: isinstance(app.screen, DrillScreen))
            await pilot.pause()
            screen = app.export_screenshot()
            assert "pwned" in screen and "\x1b" not in screen and "\x07" not in screen
        source.close()

    asyncio.run(scenario())


@needs_tmux
def test_a_real_terminal_keeps_its_title_and_its_screen(hostile: Path, terminal: Terminal):
    """In tmux: the OSC title would rename the pane, ESC[2J would clear the marker printed first."""
    command = f"echo MARKER; env -u COLUMNS -u LINES {sys.executable} -m kvaudit audit {hostile}; echo DONE; sleep 60"
    terminal.start(command, width=200, height=50)
    screen = terminal.wait_for("DONE")
    assert "MARKER" in screen  # not cleared
    assert SHOWN in screen and HOSTILE_REPLICA not in screen
    assert "pwned" not in terminal.title()
