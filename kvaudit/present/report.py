"""The whole picture of a set of traces: findings, reuse, hit rates, overhead, capacity.

`gather` runs the auditor, the named queries and the capacity curve once; the terminal
(`print_report`) and HTML (`kvaudit.report_html`) renderings only lay the results out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final, TextIO

import numpy as np

from kvaudit.analyse.audit import Finding, run_audit
from kvaudit.analyse.capacity import CapacityCurve, capacity_curve
from kvaudit.analyse.named_queries import run_named
from kvaudit.backends import Source
from kvaudit.present.findings import write_table
from kvaudit.present.rows import write_rows
from kvaudit.present.terminal import console as terminal_console

# The named queries a report shows, in order, with their section titles.
SECTIONS: Final = {
    "cross_replica_reuse": "Reuse: producer -> consumer of fetched pages",
    "reuse": "Reuse: reuse time, wasted stores, evictions",
    "prefix_locality": "Prefix locality per request",
    "hit_rate": "Hit rates",
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
        "pages_fetched",
        "reuse_p50_s",
        "reuse_p90_s",
        "evicted_pages",
        "evicted_before_reuse",
    ],
    "prefix_locality": ["requests", "locality_p10", "locality_p50", "locality_p90", "reusable_tokens", "hit_tokens"],
    "hit_rate": ["replica", "hook", "op", "operations", "tokens_requested", "tokens_hit", "hit_rate"],
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
    report = Report(run_audit(source, skew_s=skew_s))
    variables = {"kvaudit_skew_s": skew_s, "kvaudit_bucket_s": bucket_s}
    for name in SECTIONS:
        report.tables[name] = Table(*run_named(source, name, variables))
    report.hit_rate_totals = Table(*run_named(source, "hit_rate", {"kvaudit_bucket_s": WHOLE_TRACE_S}))
    report.capacity = capacity_curve(source, sample_rate=sample_rate)
    return report


def capacity_points(curve: CapacityCurve, points: int = CAPACITY_POINTS) -> Table:
    """The curve at evenly spaced capacities, as a table."""
    grid = curve.grid(points)
    rates = curve.hit_rate(grid)
    return Table(["capacity_gib", "hit_rate"], [(c / 2**30, float(r)) for c, r in zip(grid, rates)])


def print_report(report: Report, stream: TextIO) -> None:
    """The report for a terminal (80 columns and up): findings by rule with their fields named,
    and each section's main columns; the HTML report and `--format json` have every column."""
    console = terminal_console(stream)
    console.rule("[bold]Findings")
    write_table(report.findings, stream, rows_per_group=10)
    for name, columns in TERMINAL_COLUMNS.items():
        table = report.hit_rate_totals if name == "hit_rate" else report.tables[name]
        if name == "prefix_locality":
            table = _locality_summary(report.tables[name])
        if table is None:
            continue
        console.rule(f"[bold]{SECTIONS[name]}")
        rows = [tuple(r.get(c) for c in columns) for r in table.records()]
        write_rows(_headers(columns), rows, stream=stream)
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
