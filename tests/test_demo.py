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
