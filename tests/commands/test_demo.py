"""`kvaudit demo` end to end: simulation, summary, audit where installed, and where to look further."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvaudit.cli import main


def test_demo_runs_and_ends_with_the_commands_to_look_further(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--guard"]) == 0
    text = capsys.readouterr().out
    assert "rolling-upgrade" in text and "summary" in text
    further = text[text.index("Look further") :].splitlines()
    assert further[1].strip().startswith("kvaudit tui") and any("kvaudit sql" in line for line in further)
    assert (out / "ground_truth.jsonl").stat().st_size > 0


def test_demo_never_replaces_a_directory_it_did_not_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "precious.txt").write_text("keep me")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    assert "more than a previous demo's output" in capsys.readouterr().err
    assert (tmp_path / "precious.txt").read_text() == "keep me"
