"""The report as one self-contained HTML file: a headline, plotly charts (plotly.js inlined) and tables.

Laid out for the operator who opens it: the headline first (`report.headline`), every
number with its unit (`kvaudit.present.units`), colour scales from zero, histograms as
bars, tables that wrap between words (never inside one) rather than scroll, and a print
layout (A4 landscape, charts redrawn to the page's width, the plotly mode bar hidden). Every value from the traces is
HTML-escaped, and reaches plotly as data, never as markup.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from kvaudit.causes import MISSES
from kvaudit.present.report import Report, Table, capacity_points, headline, reuse_left_by_replica
from kvaudit.present.units import column_header, column_value, count

FINDINGS_SHOWN: Final = 100
_SEVERITY_COLOR: Final = {"critical": "#c0392b", "warning": "#d68910", "info": "#2471a3"}
_OPS: Final = {"lookup": "lookups", "fetch": "fetches", "store": "stores"}  # in panel order
# Plotly's mode bar sits in the figure's top margin, clear of the plot, when the margin is this tall.
_MARGIN: Final = {"l": 70, "r": 30, "t": 48, "b": 60}
_CONFIG: Final = {
    "displaylogo": False,
    "responsive": True,
    "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"],
}


def write_html(report: Report, path: str | Path, *, title: str = "kvaudit report") -> None:
    sections = [
        _findings(report),
        _figure("Pool capacity: hit rate against pool size", _capacity_figure(report)),
        _figure("Cross-replica reuse: tokens fetched, producer → consumer", _matrix_figure(report)),
        _figure("Hit rate over time", _hit_rate_figure(report.tables["hit_rate"])),
        _figure(
            "Reuse left on the table: the hit rate against the achievable one, misses by cause",
            _reuse_left_figure(report.tables["reuse_left"]),
        ),
        _figure("Latency distribution of fetches and stores", _latency_figure(report.tables["latency_histogram"])),
        _figure("Prefix locality: reusable share of each prompt", _locality_figure(report.tables["prefix_locality"])),
        _table("Transfer overhead", report.tables["transfer_overhead"]),
        _table("Reuse: reuse time, wasted stores, evictions", report.tables["reuse"]),
        _table("Cross-replica reuse", report.tables["cross_replica_reuse"]),
    ]
    Path(path).write_text(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f"<script>{get_plotlyjs()}</script></head><body>"
        f"{_headline(report, title)}{''.join(sections)}<script>{_PRINT_SCRIPT}</script></body></html>",
        encoding="utf-8",
    )


def _headline(report: Report, title: str) -> str:
    figures = "".join(
        f"<div class='figure{' alarm' if figure.alarm else ''}'><dt>{html.escape(figure.label)}</dt>"
        f"<dd data-figure='{figure.name}' data-value='{html.escape(str(figure.value), quote=True)}'>"
        f"{html.escape(figure.text)}</dd>"
        + (f"<dd class='note'>{html.escape(figure.note)}</dd>" if figure.note else "")
        + "</div>"
        for figure in headline(report)
    )
    return f"<header><h1>{html.escape(title)}</h1><dl class='headline'>{figures}</dl></header>"


def _findings(report: Report) -> str:
    counts = Counter((f.severity, f.code, f.rule) for f in report.findings)
    if not counts:
        return "<section><h2>Findings</h2><p class='ok'>No findings.</p></section>"
    summary = "".join(
        f"<tr><td style='color:{_SEVERITY_COLOR.get(s, '')}'>{html.escape(s)}</td><td>{html.escape(c)}</td>"
        f"<td>{html.escape(r)}</td><td class='number'>{count(n)}</td></tr>"
        for (s, c, r), n in counts.items()
    )
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td{' class=key' if name == 'key' else ''}>{html.escape(str(v))}</td>"
            for name, v in (
                ("severity", f.severity),
                ("code", f.code),
                ("replica", f.replica or ""),
                ("producer", f.producer or ""),
                ("key", f.key or ""),
                ("message", f.message),
            )
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
        + (f"<p>... and {count(more)} more (kvaudit audit --format json lists them all)</p>" if more > 0 else "")
        + "</details></section>"
    )


def _capacity_figure(report: Report) -> go.Figure | None:
    curve = report.capacity
    if curve is None or not curve.accesses:
        return None
    points = capacity_points(curve).records()
    figure = go.Figure(
        go.Scatter(
            x=[p["capacity_gib"] for p in points],
            y=[p["hit_rate"] for p in points],
            mode="lines+markers",
            name="hit rate",
            hovertemplate="%{x:.3g} GiB: %{y:.1%}<extra></extra>",
        )
    )
    figure.add_hline(
        y=curve.ideal_hit_rate, line_dash="dot", annotation_text=f"unbounded pool: {curve.ideal_hit_rate:.1%}"
    )
    figure.update_layout(
        xaxis_title="pool capacity (GiB)",
        yaxis_title=f"hit rate ({curve.method}, {count(curve.accesses)} page accesses)",
        showlegend=False,
    )
    figure.update_xaxes(rangemode="tozero", ticksuffix=" GiB")
    figure.update_yaxes(range=[0, 1.02], tickformat=".0%")
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
    top = max((v for row in z for v in row), default=0)
    figure = go.Figure(
        go.Heatmap(
            z=z,
            x=[_label(c) for c in consumers],
            y=[_label(p) for p in producers],
            text=[[_short_count(v) + " tok" for v in row] for row in z],
            texttemplate="%{text}",
            colorscale="Blues",
            zmin=0,  # a scale from the smallest cell would make a busy row look empty
            zmax=max(top, 1),
            colorbar={"title": {"text": "tokens"}},
            hovertemplate="producer %{y} → consumer %{x}: %{z:,} tokens<extra></extra>",
        )
    )
    figure.update_layout(xaxis_title="consumer (replica that fetched)", yaxis_title="producer (replica that stored)")
    figure.update_xaxes(type="category")
    figure.update_yaxes(type="category", autorange="reversed")
    return figure


def _hit_rate_figure(table: Table) -> go.Figure | None:
    """One panel per operation (lookup, fetch): their rates often coincide, and one panel would hide a line."""
    records = table.records()
    if not records:
        return None
    ops = [op for op in _OPS if any(r["op"] == op for r in records)]
    series = sorted({(r["replica"], r["hook"]) for r in records})
    colors = _colors(len(series))
    figure = _panels(ops)
    for row, op in enumerate(ops, start=1):
        for (replica, hook), color in zip(series, colors):
            points = [r for r in records if (r["replica"], r["hook"], r["op"]) == (replica, hook, op)]
            if not points:
                continue
            figure.add_trace(
                go.Scatter(
                    x=[p["bucket_start"] for p in points],
                    y=[p["hit_rate"] for p in points],
                    mode="lines+markers",
                    name=_label(f"{replica} {hook}"),
                    legendgroup=f"{replica} {hook}",
                    showlegend=row == 1,
                    line={"color": color},
                    customdata=[[p["tokens_hit"], p["tokens_requested"]] for p in points],
                    hovertemplate=f"{op}: %{{y:.1%}} (%{{customdata[0]:,}} of %{{customdata[1]:,}} tokens)"
                    "<extra>%{fullData.name}</extra>",
                ),
                row=row,
                col=1,
            )
        figure.update_yaxes(title_text="tokens hit / requested", range=[0, 1.05], tickformat=".0%", row=row, col=1)
    figure.update_xaxes(title_text="time (UTC)", row=len(ops), col=1)
    return figure


def _reuse_left_figure(table: Table) -> go.Figure | None:
    """Above, each replica's hit rate and achievable hit rate over time (docs/design.md section 7.3); below,
    its prompt tokens split into the reused ones and the missed ones by cause (section 7.2)."""
    records = [r for r in table.records() if r["prompt_tokens"]]
    if not records:
        return None
    totals = [r for r in reuse_left_by_replica(table).records() if r["prompt_tokens"]]
    replicas = [r["replica"] for r in totals]
    figure = make_subplots(
        rows=2,
        cols=1,
        vertical_spacing=0.16,
        subplot_titles=[
            "hit rate (solid) and achievable hit rate (dotted)",
            "prompt tokens: reused, and missed by cause",
        ],
    )
    for replica, color in zip(replicas, _colors(len(replicas))):
        points = [r for r in records if r["replica"] == replica]
        for column, name, dash in (("hit_rate", "hit", "solid"), ("achievable_rate", "achievable", "dot")):
            figure.add_trace(
                go.Scatter(
                    x=[p["bucket_start"] for p in points],
                    y=[p[column] for p in points],
                    mode="lines+markers",
                    name=_label(f"{replica} {name}"),
                    line={"color": color, "dash": dash},
                    customdata=[[p["requests"], p["prompt_tokens"]] for p in points],
                    hovertemplate=f"{name}: %{{y:.1%}} of %{{customdata[1]:,}} prompt tokens"
                    " (%{customdata[0]:,} requests)<extra>%{fullData.name}</extra>",
                ),
                row=1,
                col=1,
            )
    parts = [("hit_tokens", "reused")] + [(cause, cause) for cause in MISSES if any(r[cause] for r in totals)]
    for column, name in parts:
        figure.add_trace(
            go.Bar(
                x=[_label(replica) for replica in replicas],
                y=[r[column] / r["prompt_tokens"] for r in totals],
                customdata=[r[column] for r in totals],
                name=name,
                marker_color=_PART_COLORS[column],
                hovertemplate=f"{name}: %{{y:.1%}} of the prompt tokens (%{{customdata:,}})<extra>%{{x}}</extra>",
            ),
            row=2,
            col=1,
        )
    figure.update_yaxes(title_text="tokens / prompt tokens", range=[0, 1.05], tickformat=".0%", row=1, col=1)
    figure.update_yaxes(title_text="share of prompt tokens", range=[0, 1.05], tickformat=".0%", row=2, col=1)
    figure.update_xaxes(title_text="time (UTC)", row=1, col=1)
    figure.update_xaxes(type="category", title_text="replica", row=2, col=1)
    figure.update_layout(barmode="stack", height=760)
    return figure


def _latency_figure(table: Table) -> go.Figure | None:
    """Bars over power-of-two buckets, every bucket between the fastest and the slowest shown (empty ones too)."""
    records = table.records()
    if not records:
        return None
    exponents = [round(math.log2(r["bucket_ms"])) for r in records]
    ladder = list(range(min(exponents), max(exponents) + 1))
    labels = [_bucket_label(e) for e in ladder]
    ops = [op for op in _OPS if any(r["op"] == op for r in records)]
    replicas = sorted({r["replica"] for r in records})
    colors = _colors(len(replicas))
    figure = _panels(ops)
    for row, op in enumerate(ops, start=1):
        for replica, color in zip(replicas, colors):
            counts = dict.fromkeys(ladder, 0)
            for r, e in zip(records, exponents):
                if (r["replica"], r["op"]) == (replica, op):
                    counts[e] += r["operations"]
            if not any(counts.values()):
                continue
            figure.add_trace(
                go.Bar(
                    x=labels,
                    y=list(counts.values()),
                    name=_label(replica),
                    legendgroup=replica,
                    showlegend=row == 1,
                    marker_color=color,
                    hovertemplate=f"{op} %{{x}}: %{{y:,}} operations<extra>%{{fullData.name}}</extra>",
                ),
                row=row,
                col=1,
            )
        figure.update_yaxes(title_text="operations", rangemode="tozero", row=row, col=1)
    figure.update_xaxes(type="category", categoryorder="array", categoryarray=labels)
    figure.update_xaxes(title_text="duration (power-of-two buckets)", row=len(ops), col=1)
    figure.update_layout(barmode="group", bargap=0.15)
    return figure


def _bucket_label(exponent: int) -> str:
    """The bucket [2^e, 2^(e+1)) ms, in µs, ms or s."""
    low, high = 2.0**exponent, 2.0 ** (exponent + 1)
    if high <= 1:
        return f"{low * 1e3:.3g}–{high * 1e3:.3g} µs"
    if low >= 1024:
        return f"{low / 1e3:.3g}–{high / 1e3:.3g} s"
    return f"{low:.3g}–{high:.3g} ms"


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
            hovertemplate="%{y:.1%} of requests could reuse at most %{x:.1%} of their prompt<extra></extra>",
        )
    )
    figure.update_layout(
        xaxis_title="reusable prefix tokens / prompt tokens", yaxis_title="share of requests (cumulative)"
    )
    figure.update_xaxes(range=[0, 1.02], tickformat=".0%")
    figure.update_yaxes(range=[0, 1.02], tickformat=".0%")
    return figure


def _panels(ops: list[str]) -> go.Figure:
    """One panel per operation, stacked, sharing the x axis."""
    figure = make_subplots(
        rows=len(ops), cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=[_OPS[op] for op in ops]
    )
    figure.update_layout(height=260 + 200 * len(ops))
    return figure


def _label(text: object) -> str:
    """A value from the traces as plotly text: escaped, so plotly's few HTML tags show as written."""
    return html.escape(str(text))


# Reused tokens in green, each cause of a miss in a colour of its own, the same in every report.
_PART_COLORS: Final = dict(
    zip(
        ("hit_tokens", *MISSES),
        ("#2ca02c", "#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#7f7f7f", "#bcbd22", "#17becf"),
    )
)


def _colors(n: int) -> list[str]:
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]
    return [palette[i % len(palette)] for i in range(n)]


def _short_count(value: float) -> str:
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.0f}"


def _figure(title: str, figure: go.Figure | None) -> str:
    if figure is None:
        return f"<section><h2>{html.escape(title)}</h2><p>No data.</p></section>"
    if figure.layout.height is None:
        figure.update_layout(height=420)
    figure.update_layout(margin=_MARGIN, template="plotly_white", autosize=True)
    body = figure.to_html(full_html=False, include_plotlyjs=False, config=_CONFIG, default_width="100%")
    return f"<section><h2>{html.escape(title)}</h2>{body}</section>"


def _table(title: str, table: Table) -> str:
    head = "".join(f"<th>{html.escape(column_header(c))}</th>" for c in table.columns)
    numeric = [_is_numeric(table.rows, i) for i in range(len(table.columns))]
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td{' class=number' if numeric[i] else ''}>{html.escape(column_value(c, v))}</td>"
            for i, (c, v) in enumerate(zip(table.columns, row))
        )
        + "</tr>"
        for row in table.rows
    )
    if not table.rows:
        return f"<section><h2>{html.escape(title)}</h2><p>No data.</p></section>"
    return f"<section><h2>{html.escape(title)}</h2><table><tr>{head}</tr>{rows}</table></section>"


def _is_numeric(rows: Sequence[tuple[Any, ...]], index: int) -> bool:
    values = [row[index] for row in rows if row[index] is not None]
    return bool(values) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


# Charts redraw at the page's width before printing, and back after; details print open.
_PRINT_SCRIPT: Final = """
(function () {
  function redraw() {
    document.querySelectorAll('.js-plotly-plot').forEach(function (plot) { Plotly.Plots.resize(plot); });
  }
  var closed = [];
  window.addEventListener('beforeprint', function () {
    closed = Array.prototype.filter.call(document.querySelectorAll('details'), function (d) { return !d.open; });
    closed.forEach(function (d) { d.open = true; });
    redraw();
  });
  window.addEventListener('afterprint', function () {
    closed.forEach(function (d) { d.open = false; });
    redraw();
  });
})();
"""

_CSS: Final = """
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; max-width: 1600px; }
h1 { font-size: 1.6em; margin: 0 0 0.6em; overflow-wrap: anywhere; }
section { margin-bottom: 2.5em; }
table { border-collapse: collapse; font-size: 0.85em; max-width: 100%; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top;
         overflow-wrap: break-word; }
th { background: #f4f6f8; font-weight: 600; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
td.key { font-family: ui-monospace, monospace; word-break: break-all; min-width: 12ch; }
.ok { color: #1e8449; }
summary { cursor: pointer; margin: 1em 0; font-weight: 600; }
header { margin-bottom: 2em; }
dl.headline { display: flex; flex-wrap: wrap; gap: 0.8em; margin: 0; }
dl.headline .figure { border: 1px solid #d5dbe1; border-radius: 6px; padding: 0.6em 1em; min-width: 10em;
                      background: #fafbfc; }
dl.headline dt { font-size: 0.8em; color: #566; text-transform: uppercase; letter-spacing: 0.04em; }
dl.headline dd { margin: 0.15em 0 0; font-size: 1.5em; font-weight: 600; font-variant-numeric: tabular-nums; }
dl.headline dd.note { font-size: 0.8em; font-weight: normal; color: #566; }
dl.headline .alarm { border-color: #c0392b; background: #fdf2f0; }
dl.headline .alarm dd[data-figure] { color: #c0392b; }
@page { size: A4 landscape; margin: 12mm; }
@media print {
  body { margin: 0; max-width: none; font-size: 10pt; }
  section { break-inside: avoid; page-break-inside: avoid; }
  section table { break-inside: auto; }
  h2 { break-after: avoid; }
  .modebar-container { display: none !important; }
  dl.headline .figure, dl.headline .alarm { print-color-adjust: exact; -webkit-print-color-adjust: exact; }
}
"""
