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


def test_prevent_headline_counts_each_page_stored_under_a_further_geometry(
    trace_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    from kvaudit.analyse.named_queries import run_named
    from kvaudit.present.report import Report, Table, headline

    fleet = Fleet(trace_dir, monkeypatch)
    r1, r2, r3 = fleet.replica("r1"), fleet.replica("r2"), fleet.replica("r3")
    one, two = "@kvaudit_geometry%0123456789abcdef", "@kvaudit_geometry%fedcba9876543210"
    fleet.at(0).store(r1, [page(f"a{one}", 0), page(f"b{one}", 1)])
    fleet.at(1).store(r2, [page(f"a{two}", 0), page(f"c{two}", 1)])  # a: the pool held it for r1's geometry
    fleet.at(2).store(r3, [page(f"a{one}", 0), page("b", 1)])  # r1's geometry again; an untagged key
    store = fleet.open()
    try:
        row = Table(*run_named(store, "headline"))
    finally:
        store.close()
    assert row.records()[0]["prevented_pages"] == 1
    figure = next(f for f in headline(Report([], row)) if f.name == "prevented_pages")
    assert (figure.label, figure.text, figure.note) == (
        "prevented",
        "1",
        "pages recomputed: the pool held them for another geometry",
    )
