"""`kvaudit report`: every section in the terminal, one self-contained HTML file."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import pytest

from kvaudit.cli import main
from kvaudit.present.report import gather, misses_by_cause, print_report, reuse_left_by_replica
from kvaudit.present.report_html import write_html
from kvaudit.read.store import TraceStore
from kvaudit.simulator.engine import GIB, SimConfig, simulate
from kvaudit.simulator.stats import summarise_by

from ..support.fleet import Fleet, page


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
        "critical pages",
        "Findings",
        "KVA004",
        "Reuse",
        "Hit rates",
        "Reuse left on the table",
        "Transfer overhead",
        "Pool capacity",
    ):
        assert title in out
    text = html.read_text()
    assert text.count("<section>") == 10 and "Plotly.newPlot" in text
    assert "<script src" not in text  # self-contained: plotly.js is inline
    assert "store-fetch-mismatch" in text


def test_reuse_left_per_replica_is_the_simulators(tmp_path: Path):
    # Small private pools: pages are evicted, and held where the other replica cannot reach them.
    config = SimConfig(duration_s=90, rate=0.5, seed=3, shared=False, pool_bytes=16 * GIB)
    result = simulate(config, tmp_path / "sim")
    store = TraceStore(result.files)
    store.refresh()
    report = gather(store, bucket_s=30)
    assert len(report.tables["reuse_left"].rows) > 2 * 2  # two replicas, several buckets
    by_replica = {r["replica"]: r for r in reuse_left_by_replica(report.tables["reuse_left"]).records()}
    summaries = {s.group: s for s in summarise_by(result.requests, lambda r: r.replica)}
    assert by_replica.keys() == {"r1", "r2"}
    for replica, totals in by_replica.items():
        assert totals["requests"] == summaries[replica].reqs
        assert totals["hit_rate"] == pytest.approx(summaries[replica].hit)
        assert totals["achievable_rate"] == pytest.approx(summaries[replica].achievable)
        assert totals["lost_rate"] == pytest.approx(summaries[replica].achievable - summaries[replica].hit)
    missed = Counter((p.replica, p.cause.value) for p in result.pages if not p.cause.hit)
    misses = misses_by_cause(reuse_left_by_replica(report.tables["reuse_left"])).records()
    assert {(m["replica"], m["cause"]): m["missed_tokens"] for m in misses} == {
        key: pages * config.page_tokens for key, pages in missed.items()
    }
    assert {m["cause"] for m in misses} >= {"routed_away", "evicted", "never_stored"}

    terminal = io.StringIO()
    print_report(report, terminal)
    section = terminal.getvalue().split("Reuse left on the table")[1]
    assert "achievable" in section and "routed_away" in section
    html = tmp_path / "report.html"
    write_html(report, html)
    text = html.read_text()
    assert "Reuse left on the table: the hit rate against the achievable one, misses by cause" in text
    assert "r1 achievable" in text and '"name":"routed_away"' in text


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
