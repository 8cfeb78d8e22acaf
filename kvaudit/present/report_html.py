"""The report as one self-contained HTML file: plotly charts (plotly.js inlined) and tables."""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path
from typing import Any, Final

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from kvaudit.present.report import Report, Table, capacity_points

FINDINGS_SHOWN: Final = 100
_SEVERITY_COLOR: Final = {"critical": "#c0392b", "warning": "#d68910", "info": "#2471a3"}


def write_html(report: Report, path: str | Path, *, title: str = "kvaudit report") -> None:
    sections = [
        _findings(report),
        _figure("Pool capacity: hit rate against pool size", _capacity_figure(report)),
        _figure("Cross-replica reuse: tokens fetched, producer -> consumer", _matrix_figure(report)),
        _figure("Hit rate over time", _hit_rate_figure(report.tables["hit_rate"])),
        _figure("Latency distribution of fetches and stores", _latency_figure(report.tables["latency_histogram"])),
        _figure("Prefix locality: reusable share of each prompt", _locality_figure(report.tables["prefix_locality"])),
        _table("Transfer overhead", report.tables["transfer_overhead"]),
        _table("Reuse: reuse time, wasted stores, evictions", report.tables["reuse"]),
        _table("Cross-replica reuse", report.tables["cross_replica_reuse"]),
    ]
    Path(path).write_text(
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f"<script>{get_plotlyjs()}</script></head><body>"
        f"<h1>{html.escape(title)}</h1>{''.join(sections)}</body></html>",
        encoding="utf-8",
    )


def _findings(report: Report) -> str:
    counts = Counter((f.severity, f.code, f.rule) for f in report.findings)
    if not counts:
        return "<section><h2>Findings</h2><p class='ok'>No findings.</p></section>"
    summary = "".join(
        f"<tr><td style='color:{_SEVERITY_COLOR.get(s, '')}'>{s}</td><td>{c}</td><td>{r}</td><td>{n}</td></tr>"
        for (s, c, r), n in counts.items()
    )
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(v))}</td>"
            for v in (f.severity, f.code, f.replica or "", f.producer or "", f.key or "", f.message)
        )
        + "</tr>"
        for f in report.findings[:FINDINGS_SHOWN]
    )
    more = len(report.findings) - FINDINGS_SHOWN
    return (
        "<section><h2>Findings</h2>"
        f"<table><tr><th>severity</th><th>code</th><th>rule</th><th>findings</th></tr>{summary}</table>"
        f"<details><summary>The first {min(len(report.findings), FINDINGS_SHOWN)} findings</summary>"
        "<table><tr><th>severity</th><th>code</th><th>replica</th><th>producer</th>"
        f"<th>key</th><th>message</th></tr>{rows}</table>"
        + (f"<p>... and {more} more (kvaudit audit --format json lists them all)</p>" if more > 0 else "")
        + "</details></section>"
    )


def _capacity_figure(report: Report) -> go.Figure | None:
    curve = report.capacity
    if curve is None or not curve.accesses:
        return None
    points = capacity_points(curve).records()
    figure = go.Figure(
        go.Scatter(x=[p["capacity_gib"] for p in points], y=[p["hit_rate"] for p in points], mode="lines+markers")
    )
    figure.add_hline(y=curve.ideal_hit_rate, line_dash="dot", annotation_text="unbounded pool")
    figure.update_layout(
        xaxis_title="pool capacity (GiB)", yaxis_title=f"hit rate ({curve.method}, {curve.accesses} accesses)"
    )
    figure.update_yaxes(range=[0, 1])
    return figure


def _matrix_figure(report: Report) -> go.Figure | None:
    records = report.tables["cross_replica_reuse"].records()
    if not records:
        return None
    producers = sorted({r["producer"] or "(unknown)" for r in records})
    consumers = sorted({r["consumer"] for r in records})
    tokens = {(r["producer"] or "(unknown)", r["consumer"]): 0 for r in records}
    for r in records:
        tokens[(r["producer"] or "(unknown)", r["consumer"])] += r["tokens"] or 0
    z = [[tokens.get((p, c), 0) for c in consumers] for p in producers]
    figure = go.Figure(go.Heatmap(z=z, x=consumers, y=producers, colorscale="Blues", texttemplate="%{z}"))
    figure.update_layout(xaxis_title="consumer", yaxis_title="producer")
    return figure


def _hit_rate_figure(table: Table) -> go.Figure | None:
    figure = _series_figure(table, ("replica", "hook", "op"), "bucket_start", "hit_rate")
    if figure is not None:
        figure.update_layout(yaxis_title="tokens hit / tokens requested")
        figure.update_yaxes(range=[0, 1.05])
    return figure


def _latency_figure(table: Table) -> go.Figure | None:
    figure = _series_figure(table, ("replica", "op"), "bucket_ms", "operations")
    if figure is not None:
        figure.update_layout(xaxis_title="duration (ms, power-of-two buckets)", yaxis_title="operations")
        figure.update_xaxes(type="log")
    return figure


def _series_figure(table: Table, series_by: tuple[str, ...], x: str, y: str) -> go.Figure | None:
    """One line per distinct value of the `series_by` columns."""
    records = table.records()
    if not records:
        return None
    figure = go.Figure()
    for series in sorted({tuple(r[c] for c in series_by) for r in records}):
        points = [r for r in records if tuple(r[c] for c in series_by) == series]
        figure.add_trace(
            go.Scatter(x=[p[x] for p in points], y=[p[y] for p in points], mode="lines+markers", name=" ".join(series))
        )
    return figure


def _locality_figure(table: Table) -> go.Figure | None:
    records = [r for r in table.records() if r["locality"] is not None]
    if not records:
        return None
    figure = go.Figure(
        go.Scatter(
            x=[r["locality"] for r in records],
            y=[r["cumulative_share"] for r in records],
            mode="lines",
            line_shape="hv",
        )
    )
    figure.update_layout(xaxis_title="reusable prefix tokens / prompt tokens", yaxis_title="share of requests")
    return figure


def _figure(title: str, figure: go.Figure | None) -> str:
    if figure is None:
        return f"<section><h2>{html.escape(title)}</h2><p>No data.</p></section>"
    figure.update_layout(height=420, margin={"l": 60, "r": 20, "t": 20, "b": 50}, template="plotly_white")
    body = figure.to_html(full_html=False, include_plotlyjs=False)
    return f"<section><h2>{html.escape(title)}</h2>{body}</section>"


def _table(title: str, table: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    rows = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in table.rows)
    return f"<section><h2>{html.escape(title)}</h2><table><tr>{head}</tr>{rows}</table></section>"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


_CSS: Final = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
section { margin-bottom: 2.5em; overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3em 0.8em; text-align: left; }
th { background: #f4f6f8; }
.ok { color: #1e8449; }
summary { cursor: pointer; margin: 1em 0; font-weight: 600; }
"""
