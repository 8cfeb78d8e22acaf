"""The command line: `python -m kvaudit` is `kvaudit`, and bad input is one line and exit 2 however it is started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvaudit import __version__


def _run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_python_dash_m_kvaudit_is_the_command():
    result = _run("-m", "kvaudit", "--version")
    assert result.returncode == 0
    assert result.stdout.splitlines()[0] == f"kvaudit {__version__}"
    assert result.stdout.splitlines()[1].startswith("page scanner: ")
    assert "audit" in _run("-m", "kvaudit", "--help").stdout


@pytest.mark.parametrize("module", ["kvaudit", "kvaudit.cli"])
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sql", "{tmp}"], "kvaudit sql: error: give a query after the paths, -q NAME or -f FILE"),
        (["sql", "{tmp}/nothing-here", "SELECT 1"], "kvaudit sql: error: {tmp}/nothing-here: no such file"),
        (["audit", "--backend", "postgres://x/y"], "kvaudit audit: error: postgres://x/y: expected clickhouse://"),
        (["tui", "--snapshot"], "kvaudit tui: error: give trace PATHs, --collect [ADDR] or --backend URL"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, module: str, argv: list[str], message: str):
    result = _run("-m", module, *(arg.format(tmp=tmp_path) for arg in argv))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(message.format(tmp=tmp_path))


@pytest.mark.parametrize(("argv", "wanted"), [(["--help"], set()), (["--debug", "sql", "--help"], {"sql"})])
def test_only_the_command_named_is_imported(argv: list[str], wanted: set[str]):
    """`kvaudit --help` lists the commands from `kvaudit.commands.SUMMARIES`; `kvaudit CMD` imports its module alone."""
    from kvaudit.commands import SUMMARIES

    probe = (
        "import contextlib, io, sys\n"
        "from kvaudit.cli import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main({argv!r})\n"
        "print(' '.join(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('kvaudit.commands.')))\n"
    )
    loaded = set(_run("-c", probe).stdout.split())
    assert loaded & set(SUMMARIES) == wanted
