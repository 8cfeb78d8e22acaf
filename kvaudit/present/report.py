"""The whole picture of a set of traces: findings, reuse, hit rates, reuse left, overhead, capacity.

`gather` runs the auditor, the named queries and the capacity curve once; the terminal
(`print_report`) and HTML (`kvaudit.present.report_html`) renderings only lay the results
out, both starting with the same headline (`headline`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Final, TextIO

import numpy as np

from kvaudit.analyse.audit import Finding, pages_found, run_audit
from kvaudit.analyse.capacity import CapacityCurve, capacity_curve
from kvaudit.analyse.named_queries import run_named
from kvaudit.backends import Source
from kvaudit.causes import MISSES
from kvaudit.present.findings import write_table
from kvaudit.present.rows import write_rows
from kvaudit.present.terminal import console as terminal_console
from kvaudit.present.units import byte_size, count, duration_s, percent

# The named queries a report shows, in order, with their section titles.
SECTIONS: Final = {
    "cross_replica_reuse": "Reuse: producer -> consumer of fetched pages",
    "reuse": "Reuse: reuse time, wasted stores, evictions",
    "prefix_locality": "Prefix locality per request",
    "hit_rate": "Hit rates",
    "reuse_left": "Reuse left on the table: achievable hit rate, misses by cause",
    "transfer_overhead": "Transfer overhead",
    "latency_histogram": "Latency distribution",
}
# What the terminal shows of each section (the HTML report has every column).
TERMINAL_COLUMNS: Final = {
    "cross_replica_reuse": ["request_class", "producer", "consumer", "pages", "tokens", "token_share"],
    "reuse": [
        "replica",
        "pages_stored",
        "wasted_stores",
        "reused_pages",
        "reuse_p50_s",
        "reuse_p90_s",
        "evicted_pages",
        "evicted_before_reuse",
    ],
    "prefix_locality": ["requests", "locality_p10", "locality_p50", "locality_p90", "reusable_tokens", "hit_tokens"],
    "hit_rate": ["replica", "hook", "op", "operations", "tokens_requested", "tokens_hit", "hit_rate"],
    "reuse_left": ["replica", "requests", "prompt_tokens", "hit_rate", "achievable_rate", "lost_rate"],
    "transfer_overhead": [
        "replica",
        "op",
        "backend",
        "p50_ms",
        "p99_ms",
        "gb_per_s",
        "ms_per_token",
        "slower_than_recompute",
    ],
}
# A bucket longer than any trace: the terminal shows one total per replica and layer.
WHOLE_TRACE_S: Final = 4e9  # ~127 years, and still within int64 nanoseconds
CAPACITY_POINTS: Final = 64


@dataclass
class Table:
    columns: list[str]
    rows: list[tuple[Any, ...]]

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]


@dataclass
class Report:
    findings: list[Finding]
    headline: Table | None = None  # the named query `headline`: one row
    tables: dict[str, Table] = field(default_factory=dict)
    hit_rate_totals: Table | None = None
    capacity: CapacityCurve | None = None


def gather(
    source: Source,
    *,
    skew_s: float = 1.0,
    bucket_s: float = 60.0,
    sample_rate: float | None = None,
) -> Report:
    """Run everything a report shows over the traces (a store, or a backend such as ClickHouse)."""
    report = Report(run_audit(source, skew_s=skew_s), Table(*run_named(source, "headline")))
    variables = {"kvaudit_skew_s": skew_s, "kvaudit_bucket_s": bucket_s}
    for name in SECTIONS:
        report.tables[name] = Table(*run_named(source, name, variables))
    report.hit_rate_totals = Table(*run_named(source, "hit_rate", {"kvaudit_bucket_s": WHOLE_TRACE_S}))
    report.capacity = capacity_curve(source, sample_rate=sample_rate)
    return report


@dataclass(frozen=True)
class Figure:
    """One figure of the headline: what it is, how it reads, the value behind it, a note."""

    name: str
    label: str
    text: str
    value: Any
    note: str = ""
    alarm: bool = False  # a figure that should be zero and is not


def headline(report: Report) -> list[Figure]:
    """What an operator looks at first: replicas, time range, requests, hit rate, bytes, pages prevention
    kept from another geometry's replicas (docs/design.md section 4.5), critical pages."""
    row = report.headline.records()[0] if report.headline is not None and report.headline.rows else {}
    first, last = row.get("first_time"), row.get("last_time")
    span = ""
    if first is not None and last is not None:
        span = f"{_utc(first)} → {_utc(last)}"
    rate = row.get("hit_rate")
    prevented = row.get("prevented_pages") or 0
    # One bad page is one critical page, whichever rules fired on it (KVA005 and KVA008 often both do).
    critical = pages_found(report.findings, "critical")
    rules = sorted({code for page in critical for code in page.rules})
    critical_findings = sum(f.severity == "critical" for f in report.findings)
    others = len(report.findings) - critical_findings
    note = f"{count(critical_findings)} findings ({', '.join(rules)})" if critical else ""
    if others:
        note = f"{note}; {count(others)} warning or info" if note else f"{count(others)} warning or info"
    return [
        Figure("replicas", "replicas", count(row.get("replicas") or 0), row.get("replicas") or 0),
        Figure(
            "time_range",
            "time range (UTC)",
            span or "–",
            span,
            duration_s((last - first).total_seconds()) if span else "",
        ),
        Figure("requests", "requests", count(row.get("requests") or 0), row.get("requests") or 0),
        Figure(
            "hit_rate",
            "hit rate",
            "–" if rate is None else percent(rate),
            rate,
            f"{count(row.get('tokens_hit') or 0)} of {count(row.get('tokens_requested') or 0)} fetched tokens",
        ),
        Figure("fetch_bytes", "fetched", byte_size(row.get("fetch_bytes") or 0), row.get("fetch_bytes") or 0),
        Figure(
            "prevented_pages",
            "prevented",
            count(prevented),
            prevented,
            "pages recomputed: the pool held them for another geometry" if prevented else "",
        ),
        Figure(
            "critical_pages",
            "critical pages",
            count(len(critical)),
            len(critical),
            note,
            alarm=bool(critical),
        ),
    ]


def _utc(moment: dt.datetime) -> str:
    """A span time (the views' timestamps are UTC) to the second."""
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def capacity_points(curve: CapacityCurve, points: int = CAPACITY_POINTS) -> Table:
    """The curve at evenly spaced capacities, as a table."""
    grid = curve.grid(points)
    rates = curve.hit_rate(grid)
    return Table(["capacity_gib", "hit_rate"], [(c / 2**30, float(r)) for c, r in zip(grid, rates)])


def print_report(report: Report, stream: TextIO) -> None:
    """The report for a terminal (80 columns and up): findings by rule with their fields named,
    and each section's main columns; the HTML report and `--format json` have every column."""
    console = terminal_console(stream)
    console.rule("[bold]Headline")
    for figure in headline(report):
        note = f"  ({figure.note})" if figure.note else ""
        console.print(f"{figure.label:>17}: {figure.text}{note}", markup=False, highlight=False)
    console.rule("[bold]Findings")
    write_table(report.findings, stream, rows_per_group=10)
    for name, columns in TERMINAL_COLUMNS.items():
        table = report.hit_rate_totals if name == "hit_rate" else report.tables[name]
        if name == "prefix_locality":
            table = _locality_summary(report.tables[name])
        if name == "reuse_left":
            table = reuse_left_by_replica(report.tables[name])
        if table is None:
            continue
        console.rule(f"[bold]{SECTIONS[name]}")
        rows = [tuple(r.get(c) for c in columns) for r in table.records()]
        write_rows(_headers(columns), rows, stream=stream)
        if name == "reuse_left":
            misses = misses_by_cause(table)
            write_rows(_headers(misses.columns), misses.rows, stream=stream)
    if report.capacity is not None:
        curve = report.capacity
        console.rule("[bold]Pool capacity")
        console.print(
            f"{curve.accesses} page accesses ({curve.method}); an unbounded pool would hit {curve.ideal_hit_rate:.1%}"
        )
        points = capacity_points(curve, 11)
        write_rows(_headers(points.columns), points.rows, stream=stream)


def _headers(columns: list[str]) -> list[str]:
    """Column names with spaces for underscores: a narrow terminal wraps `pages stored` between the words."""
    return [name.replace("_", " ") for name in columns]


def report_json(report: Report) -> dict[str, Any]:
    """Everything the report found, every column and finding field: `kvaudit report --format json`."""
    capacity = None
    if report.capacity is not None:
        curve = report.capacity
        capacity = {
            "method": curve.method,
            "accesses": curve.accesses,
            "ideal_hit_rate": float(curve.ideal_hit_rate),
            "points": capacity_points(curve).records(),
        }
    return {
        "headline": report.headline.records()[0] if report.headline is not None and report.headline.rows else None,
        "findings": [dataclasses.asdict(finding) for finding in report.findings],
        "sections": {name: table.records() for name, table in report.tables.items()},
        "hit_rate_totals": report.hit_rate_totals.records() if report.hit_rate_totals is not None else None,
        "capacity": capacity,
    }


def _locality_summary(table: Table) -> Table:
    """Quantiles of per-request locality: the table itself has one row per request."""
    records = table.records()
    localities = np.array([r["locality"] for r in records if r["locality"] is not None], dtype=float)
    if not len(localities):
        return Table(["requests"], [(len(records),)])  # the other columns show as empty
    quantiles = np.quantile(localities, [0.1, 0.5, 0.9])
    reusable = sum(r["reusable_tokens"] for r in records)
    hit = sum(r["hit_tokens"] for r in records)
    return Table(
        ["requests", "locality_p10", "locality_p50", "locality_p90", "reusable_tokens", "hit_tokens"],
        [(len(records), *map(float, quantiles), reusable, hit)],
    )


def reuse_left_by_replica(table: Table) -> Table:
    """`reuse_left`'s time buckets summed per replica: tokens, hit and achievable rates, missed tokens per cause."""
    summed = ("requests", "prompt_tokens", "hit_tokens", "achievable_tokens", *MISSES)
    totals: dict[str, dict[str, int]] = {}
    for record in table.records():
        total = totals.setdefault(record["replica"], dict.fromkeys(summed, 0))
        for column in summed:
            total[column] += record[column] or 0
    rows = []
    for replica, total in sorted(totals.items()):
        prompt = total["prompt_tokens"]
        hit = total["hit_tokens"] / prompt if prompt else None
        achievable = total["achievable_tokens"] / prompt if prompt else None
        lost = None if hit is None or achievable is None else achievable - hit
        rows.append((replica, *total.values(), hit, achievable, lost))
    return Table(["replica", *summed, "hit_rate", "achievable_rate", "lost_rate"], rows)


def misses_by_cause(by_replica: Table) -> Table:
    """Per replica, each cause that kept prompt tokens from reuse: its tokens, and their share of the prompt tokens."""
    rows = [
        (r["replica"], cause, r[cause], r[cause] / r["prompt_tokens"] if r["prompt_tokens"] else None)
        for r in by_replica.records()
        for cause in MISSES
        if r[cause]
    ]
    return Table(["replica", "cause", "missed_tokens", "prompt_share"], rows)
