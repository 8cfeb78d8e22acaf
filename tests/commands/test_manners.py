"""Command-line manners: exit codes that tell outcomes apart, a closed pipe that ends quietly,
tables that keep their shape off a terminal and stop at a row cap, a report readable at 80
columns, and a TUI that refuses to draw into a pipe.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvaudit.cli import main
from kvaudit.commands.arguments import UsageError
from kvaudit.errors import InputError, InternalError

from ..support import alert_traces
from ..support.tmux import Terminal, needs_tmux, terminal_fixture  # noqa: F401 - the fixture

KVAUDIT = f"{sys.executable} -m kvaudit"


def _shell(command: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=180, cwd=cwd)


@pytest.fixture(scope="module")
def upgrade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated rolling upgrade: many findings whose fields are mappings (KVA005 layout)."""
    out = tmp_path_factory.mktemp("upgrade")
    assert main(["simulate", "--out", str(out), "--duration", "120", "-q", "--fault", "rolling-upgrade:30"]) == 0
    return out / "traces"


def test_exit_codes_tell_findings_bad_input_and_bugs_apart(
    trace_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    alert_traces.clean(trace_dir)
    assert main(["audit", str(trace_dir)]) == 0
    alert_traces.used_malformed_page(trace_dir)
    assert main(["audit", str(trace_dir)]) == 1  # findings
    assert main(["audit", str(trace_dir / "nothing")]) == 2  # bad input
    capsys.readouterr()

    # A stand-in for a bug (there is none to trigger on purpose): the auditor raising.
    def broken(*_: object, **__: object) -> None:
        raise OverflowError("int too big to convert")

    monkeypatch.setattr("kvaudit.analyse.audit.run_audit", broken)  # imported by the command as it runs
    assert main(["audit", str(trace_dir)]) == 3
    err = capsys.readouterr().err
    assert err == (
        "kvaudit audit: internal error: OverflowError: int too big to convert"
        " (a bug in kvaudit; KVAUDIT_DEBUG=1 shows the traceback)\n"
    )
    assert main(["--debug", "audit", str(trace_dir)]) == 3
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    monkeypatch.setenv("KVAUDIT_DEBUG", "1")
    assert main(["audit", str(trace_dir)]) == 3
    assert "Traceback (most recent call last)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("error", "status", "start"),
    [
        # A ValueError or OSError that no part of kvaudit made bad input is a bug, whatever it says.
        (ValueError("invalid literal for int() with base 10: 'x'"), 3, "kvaudit audit: internal error: ValueError: "),
        (FileNotFoundError(2, "No such file or directory", "/tmp/x"), 3, "kvaudit audit: internal error: "),
        (InternalError("a store that\ntakes no rows"), 3, "kvaudit audit: internal error: InternalError: "),
        (InputError("traces.jsonl: not what\nit should be"), 2, "kvaudit audit: error: traces.jsonl: not what it"),
        (UsageError("--skew must be positive"), 2, "kvaudit audit: error: --skew must be positive"),
    ],
)
def test_the_error_s_type_alone_tells_bad_input_from_a_bug(
    trace_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: Exception,
    status: int,
    start: str,
):
    alert_traces.clean(trace_dir)

    def failing(*_: object, **__: object) -> None:
        raise error

    monkeypatch.setattr("kvaudit.analyse.audit.run_audit", failing)
    assert main(["audit", str(trace_dir)]) == status
    err = capsys.readouterr().err
    assert err.startswith(start)
    assert err.count("\n") == 1  # one line, no traceback
    assert ("a bug in kvaudit; KVAUDIT_DEBUG=1 shows the traceback" in err) == (status == 3)


def test_a_file_the_user_named_that_cannot_be_read_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    unreadable = tmp_path / "rules.yaml"
    unreadable.mkdir()  # a directory where a file is expected: IsADirectoryError where it is opened
    assert main(["alerts", "check", str(unreadable)]) == 2
    assert capsys.readouterr().err == f"kvaudit alerts: error: {unreadable}: Is a directory\n"


@pytest.mark.parametrize(
    "command",
    [
        "sql {t} 'SELECT * FROM range(300000)' --format csv",
        "sql {t} 'SELECT * FROM range(300000)' --format json",
        "audit {t} --format json",
        "sql {t} 'SELECT * FROM range(300000)' --all",  # a table: Rich writes it in one piece
    ],
)
def test_a_closed_pipe_ends_quietly_with_141(upgrade: Path, command: str):
    result = _shell(f"{KVAUDIT} {command.format(t=upgrade)} | head -n 1; echo status=${{PIPESTATUS[0]}} >&2")
    assert result.stdout.count("\n") == 1
    assert result.stderr == "status=141\n"  # no "Broken pipe", no traceback, no "Exception ignored"


def test_csv_lines_end_with_lf(trace_dir: Path):
    """As the duckdb shell's: `| tail -1` gives shell arithmetic a number, not a number and a `\\r`."""
    alert_traces.clean(trace_dir)
    result = _shell(f"{KVAUDIT} sql {trace_dir} 'SELECT 7 AS n' --format csv | tail -1 | od -c")
    assert result.stdout.split()[1:] == ["7", "\\n", "0000002"]


def test_an_unknown_parameter_is_named(trace_dir: Path, capsys: pytest.CaptureFixture[str]):
    alert_traces.clean(trace_dir)
    assert main(["sql", str(trace_dir), "-q", "hit_rate", "--param", "bucket=5"]) == 2
    assert capsys.readouterr().err == (
        "kvaudit sql: error: --param bucket: the query has no such parameter (it takes: bucket_s)\n"
    )
    assert main(["sql", str(trace_dir), "-q", "hit_rate", "--param", "bucket_s=5", "--format", "csv"]) == 0


def test_report_checks_its_html_path_before_reading(
    trace_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    alert_traces.clean(trace_dir)
    target = tmp_path / "missing" / "r.html"
    assert main(["report", str(trace_dir), "--html", str(target)]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # not the whole report, then the failure
    assert err == f"kvaudit report: error: {target}: No such directory: {target.parent}\n"


@pytest.mark.parametrize("action", ["check", "eval", "watch", "default-rules"])
def test_each_alerts_action_has_a_description_and_an_example(action: str, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["alerts", action, "--help"])
    shown = capsys.readouterr().out
    description = shown.split("\n\n")[1].strip()
    assert description[0].isupper() and description.endswith(".")
    assert f"Example:\n  kvaudit alerts {action}" in shown or f"&& kvaudit alerts {action}" in shown


def test_the_usage_of_sql_shows_the_sql(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["sql", "--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    assert "PATH [PATH ...] SQL" in usage and "-q NAME" in usage


def test_tables_off_a_terminal_keep_their_shape(trace_dir: Path, capsys: pytest.CaptureFixture[str]):
    alert_traces.clean(trace_dir)
    assert main(["sql", str(trace_dir), "SELECT * FROM replicas"]) == 0
    header, _, *rows = capsys.readouterr().out.splitlines()
    columns = ("resource_id", "replica", "service", "engine_version", "world_size", "hash_algo", "head_size")
    assert all(name in header.split() for name in columns)  # whole names, one header line
    assert len(header) > 150 and len(rows) == 2  # as wide as it needs: one line per row


def test_tables_stop_at_a_row_cap_unless_asked(trace_dir: Path, capsys: pytest.CaptureFixture[str]):
    alert_traces.clean(trace_dir)
    query = [str(trace_dir), "SELECT range AS n FROM range(1000)"]
    assert main(["sql", *query]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + 200 + 1
    assert lines[-1] == "... 800 more rows not shown (of 1,000; --limit N or --all for more)"
    assert main(["sql", *query, "--all"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2 + 1000
    assert main(["sql", *query, "--format", "csv", "--limit", "5"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["n", "0", "1", "2", "3", "4"] and "995 more rows not shown" in err
    assert main(["sql", *query, "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1001  # CSV and JSON: every row unless asked


@needs_tmux
def test_the_report_reads_at_80_columns(upgrade: Path, terminal: Terminal):
    terminal.start(
        f"env -u COLUMNS -u LINES {KVAUDIT} report {upgrade}; echo REPORT-DONE; sleep 60", width=80, height=50
    )
    terminal.wait_for("REPORT-DONE")
    report = terminal.history()  # a line longer than the terminal would show whole
    assert max(len(line.rstrip()) for line in report) <= 80
    assert any(line.split()[:3] == ["r1", "│", "r2"] and "layout" in line for line in report)  # fields by name
    assert not any('{"' in line for line in report)  # not as JSON folded into a column
    # Column names wrap between their words (`pages stored`), not into letters.
    assert any({"stored", "stores", "pages"} <= set(line.split()) for line in report)


def test_the_report_in_full_as_json(upgrade: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["report", str(upgrade), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    finding = next(f for f in report["findings"] if f["code"] == "KVA005")
    assert set(finding["fields"]["layout"]) >= {"fetched", "consumer"}  # every field's values
    assert set(report["sections"]) >= {"hit_rate", "reuse", "transfer_overhead"} and report["capacity"]["points"]


def test_tui_refuses_a_stdout_that_is_not_a_terminal(trace_dir: Path):
    alert_traces.clean(trace_dir)
    result = subprocess.run(
        [sys.executable, "-m", "kvaudit", "tui", str(trace_dir)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "kvaudit tui: error: stdout is not a terminal:"
        " the live view needs one (--snapshot prints its figures as JSON)\n"
    )
