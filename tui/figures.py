"""The figures every panel shows, computed by the named `tui/*` queries over a backend.

`Figures` is one consistent picture at one moment: the panels render it and
`--snapshot` prints it, so the screen and the JSON can never disagree. Every figure
answers for the window shown, the findings and their counts included; the alerts are
what the rules say now (each rule reads its own window).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from kvaudit.analyse.audit import pages_found
from kvaudit.analyse.named_queries import load
from kvaudit.backends import Backend
from kvaudit.tui.alerting import AlertRow
from kvaudit.tui.findings import CRITICAL, FindingRow
from kvaudit.tui.window import Window

SPARK_BUCKETS: Final = 24
_QUERIES: Final = {
    name: load(name) for name in ("tui/replicas", "tui/reuse", "tui/reuse_joined", "tui/activity", "prevented")
}
# Over all the traces: pages prevention kept from replicas of another geometry, figured with
# the analysis (it reads every store: not a refresh's cost).
PREVENTED: Final = _QUERIES["prevented"]


@dataclass(frozen=True)
class ReplicaFigures:
    replica: str
    requests: int
    hit_rate: float | None
    cross_replica_hit_tokens: int
    fetch_gbps: float | None
    p99_fetch_ms: float | None
    rejected_pages: int
    # Fetched pages with a critical finding in the window; None: no auditor, or (critical_pending) not audited yet.
    critical_pages: int | None
    activity: tuple[int, ...]  # tokens hit per time bucket over the window, oldest first
    critical_pending: bool = False  # the first audit has not finished: unknown, not zero


@dataclass(frozen=True)
class ReuseCell:
    producer: str | None  # None: no earlier store of the key was seen
    consumer: str
    pages: int
    used_pages: int
    rejected_pages: int
    used_tokens: int
    used_bytes: int


@dataclass(frozen=True)
class Analysis:
    """What the auditor and the alerting engine said last; a None list comes with its note.

    `findings_pending`: None findings mean "not audited yet" (the note says so), not
    "no auditor". `alerts_source`: the rules the alerts come from.
    """

    findings: tuple[FindingRow, ...] | None = None
    findings_note: str = ""
    findings_pending: bool = False
    alerts: tuple[AlertRow, ...] | None = None
    alerts_note: str = ""
    alerts_source: str = ""
    prevented_pages: int = 0  # over all the traces (PREVENTED)


@dataclass(frozen=True)
class Figures:
    window: str
    since_ns: int | None
    latest_ns: int | None
    pages_loaded: int
    read_errors: int
    replicas: tuple[ReplicaFigures, ...] = ()
    reuse: tuple[ReuseCell, ...] = ()
    findings: tuple[FindingRow, ...] | None = None  # in the window; None: none known (findings_note says why)
    findings_note: str = ""
    findings_pending: bool = False  # None findings because the first audit has not finished
    findings_total: int | None = None  # over all the traces, whatever the window
    alerts: tuple[AlertRow, ...] | None = None  # None: none known (alerts_note says why)
    alerts_note: str = ""
    alerts_source: str = ""  # the rule file, or the default pack
    # Over all the traces: pages prevention kept from replicas of another geometry (queries/prevented.sql).
    prevented_pages: int = 0
    # The order figures were computed in (LiveSource numbers them): two workers hand theirs
    # to the screen in either order, and the older must not replace the newer.
    serial: int = field(default=0, compare=False)

    def as_json(self) -> dict[str, Any]:
        figures = asdict(self)
        del figures["serial"]
        return figures


@dataclass(frozen=True)
class _Extent:
    earliest_ns: int | None
    latest_ns: int | None
    pages: int
    read_errors: int


def compute_figures(
    backend: Backend,
    window: Window,
    *,
    analysis: Analysis,
    indexed: bool,
    skew_s: float = 1.0,
) -> Figures:
    """Every panel's figures over `window`, with the findings and alerts known so far.

    Args:
        indexed: the backend carries a `ProducerIndex`, which the reuse figures then read;
            otherwise they join each fetch to its producer here.
        skew_s: clock skew allowed between replicas (without the index).
    """
    extent = _extent(backend)
    if extent.latest_ns is None or extent.earliest_ns is None:
        return Figures(
            window.name,
            None,
            None,
            extent.pages,
            extent.read_errors,
            **_analysed(analysis, None),
        )
    since = window.since_ns(extent.earliest_ns, extent.latest_ns)
    analysed = _analysed(analysis, since)
    if indexed:
        reuse_rows = _rows(backend, "tui/reuse", since_ns=since)
    else:
        reuse_rows = _rows(backend, "tui/reuse_joined", since_ns=since, skew_ns=int(skew_s * 1e9))
    reuse = tuple(ReuseCell(*row) for row in reuse_rows)
    bucket_ns = max(1, -(-(extent.latest_ns - since + 1) // SPARK_BUCKETS))
    activity: dict[str, list[int]] = defaultdict(lambda: [0] * SPARK_BUCKETS)
    for replica, bucket, tokens in _rows(backend, "tui/activity", since_ns=since, bucket_ns=bucket_ns):
        activity[replica][min(bucket, SPARK_BUCKETS - 1)] += int(tokens)
    critical: dict[str | None, int] = defaultdict(int)
    findings = analysed["findings"]
    # One bad page is one, whichever rules fired on it.
    for page in pages_found(findings or (), CRITICAL):
        critical[page.replica] += 1
    replicas = tuple(
        ReplicaFigures(
            replica=replica,
            requests=int(requests),
            hit_rate=hit_rate,
            cross_replica_hit_tokens=sum(
                c.used_tokens for c in reuse if c.consumer == replica and c.producer not in (None, replica)
            ),
            fetch_gbps=gbps,
            p99_fetch_ms=p99,
            rejected_pages=sum(c.rejected_pages for c in reuse if c.consumer == replica),
            critical_pages=None if findings is None else critical[replica],
            activity=tuple(activity[replica]),
            critical_pending=analysis.findings_pending,
        )
        for replica, requests, _, _, hit_rate, _, _, gbps, p99 in _rows(backend, "tui/replicas", since_ns=since)
    )
    return Figures(
        window.name,
        since,
        extent.latest_ns,
        extent.pages,
        extent.read_errors,
        replicas,
        reuse,
        **analysed,
    )


def _analysed(analysis: Analysis, since_ns: int | None) -> dict[str, Any]:
    """The analysis as `Figures` fields, its findings narrowed to the window starting at `since_ns`."""
    fields = vars(analysis) | {"findings_total": None if analysis.findings is None else len(analysis.findings)}
    if analysis.findings is not None:
        fields["findings"] = tuple(f for f in analysis.findings if f.in_window(since_ns))
    return fields


def _extent(backend: Backend) -> _Extent:
    _, [(earliest, latest)] = backend.query("SELECT min(start_ns), max(end_ns) FROM spans WHERE op IS NOT NULL")
    _, [(pages, errors)] = backend.query("SELECT (SELECT count(*) FROM pages), (SELECT count(*) FROM read_errors)")
    return _Extent(earliest, latest, pages, errors)


def _rows(backend: Backend, name: str, **params: int) -> Sequence[tuple[Any, ...]]:
    return backend.query(_QUERIES[name], {f"kvaudit_{key}": value for key, value in params.items()})[1]
