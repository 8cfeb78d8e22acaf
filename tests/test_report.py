"""`kvaudit report`: every section in the terminal, one self-contained HTML file."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvaudit.cli import main

from .fleet import Fleet, page


def test_report_terminal_and_html(
    trace_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    fleet = Fleet(trace_dir, monkeypatch)
    r1, r2 = fleet.replica("r1"), fleet.replica("r2")
    fleet.at(0).store(r1, [page("a", 0), page("b", 1)], "q1")
    fleet.at(5).fetch(r2, [page("a", 0, used=True), page("b", 1, used=True, layout="PACKED")], "q2", duration_s=0.01)
    fleet.open().close()
    html = tmp_path / "report.html"
    assert main(["report", str(trace_dir), "--html", str(html), "--sample-rate", "1"]) == 1
    out = capsys.readouterr().out
    for title in (
        "Headline",
        "critical findings",
        "Findings",
        "KVA004",
        "Reuse",
        "Hit rates",
        "Transfer overhead",
        "Pool capacity",
    ):
        assert title in out
    text = html.read_text()
    assert text.count("<section>") == 9 and "Plotly.newPlot" in text
    assert "<script src" not in text  # self-contained: plotly.js is inline
    assert "store-fetch-mismatch" in text
