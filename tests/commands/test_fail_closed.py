"""Fail closed: an empty bearer token is refused, a FIFO or device named on the command line is bad
input and never opened, and what a directory holds under a trace file's name that is no file is named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvaudit.cli import main

from ..support.hostile import good_lines

KVAUDIT = [sys.executable, "-m", "kvaudit"]


@pytest.mark.parametrize("how", ["flag", "variable", "spaces"])
def test_an_empty_bearer_token_is_refused_with_exit_2(tmp_path: Path, how: str):
    command = ["collect", "--out", str(tmp_path / "out"), "127.0.0.1:0"]
    env = dict(os.environ)
    env.pop("KVAUDIT_BEARER_TOKEN", None)
    if how == "variable":
        env["KVAUDIT_BEARER_TOKEN"] = ""  # a variable set from an empty secret
    else:
        command += ["--bearer-token", "" if how == "flag" else "   "]
    # As a command runs: the default is read from the environment when the parser is built.
    done = subprocess.run([*KVAUDIT, *command], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2
    assert "is empty" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_fifo_named_on_the_command_line_is_exit_2_and_never_opened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    fifo = tmp_path / "traces.jsonl"
    os.mkfifo(fifo)
    # Opening a FIFO with no writer would block: the command returning at all shows it was not opened.
    assert main(["sql", str(fifo), "SELECT count(*) FROM spans"]) == 2
    assert capsys.readouterr().err == f"kvaudit sql: error: {fifo}: a FIFO, not a trace file (not opened)\n"


def test_a_device_named_on_the_command_line_is_exit_2(capsys: pytest.CaptureFixture[str]):
    assert main(["sql", "/dev/zero", "SELECT count(*) FROM spans"]) == 2
    assert "/dev/zero: a character device, not a trace file (not opened)" in capsys.readouterr().err


def test_what_a_directory_holds_that_is_no_file_is_a_read_error_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    directory = tmp_path / "traces"
    directory.mkdir()
    (directory / "good.jsonl").write_bytes(b"".join(good_lines()))
    os.mkfifo(directory / "fifo.jsonl")
    (directory / "dangling.jsonl").symlink_to(tmp_path / "nowhere")
    (directory / "loop.jsonl").symlink_to("loop.jsonl")
    (directory / "folder.jsonl").mkdir()
    (directory / "device.jsonl").symlink_to("/dev/null")
    query = "SELECT file, line, reason FROM read_errors ORDER BY file"
    assert main(["sql", "--format", "json", str(directory), query]) == 0
    out, err = capsys.readouterr()
    reasons = {os.path.basename(row["file"]): (row["line"], row["reason"]) for row in _rows(out)}
    assert reasons == {
        "dangling.jsonl": (0, "cannot read the file: a dangling symbolic link"),
        "device.jsonl": (0, "cannot read the file: a character device, not a trace file (not opened)"),
        "fifo.jsonl": (0, "cannot read the file: a FIFO, not a trace file (not opened)"),
        "folder.jsonl": (0, "cannot read the file: a directory, not a trace file"),
        "loop.jsonl": (0, "cannot read the file: Too many levels of symbolic links"),
    }
    assert err.count("cannot read the file") == 5


def _rows(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]  # JSON lines
