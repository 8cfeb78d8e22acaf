"""Derived metrics for Prometheus: what `kvaudit exporter` serves on /metrics.

Counters add what each read of the trace files took in (`exporter_counts`); the audit's
findings are brought up to date by auditing what arrived (`kvaudit.analyse.live_audit`)
and the reuse left on the table adds the requests that settled since the last analysis
(`exporter_reuse`), in the background; a scrape serves the last figures of both
(`TraceMetrics`). Names are defined OTel-style (dotted, with a UCUM
unit) and translated the way OpenTelemetry's Prometheus exporter does
(`kvaudit.fetch.duration` in `s` → `kvaudit_fetch_duration_seconds`), so dashboards
built on either path agree.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kvaudit.analyse.derived_views import prepare
from kvaudit.analyse.live_audit import LiveAudit
from kvaudit.backends import Backend
from kvaudit.backends.duckdb_backend import Tables
from kvaudit.causes import MISSES
from kvaudit.present.exporter_counts import LATENCY_BUCKETS_S, ExporterCounts
from kvaudit.present.exporter_reuse import SETTLE_S, SETTLED, ReuseCounts

logger = logging.getLogger(__name__)

# UCUM units as OpenTelemetry's Prometheus translation spells them.
_UNIT_WORDS: Final = {"By": "bytes", "s": "seconds", "ms": "milliseconds", "1": "ratio"}
_PER_UNIT_WORDS: Final = {"s": "second", "m": "minute", "h": "hour", "d": "day"}  # after `/`: singular


def prometheus_name(name: str, unit: str, kind: str) -> str:
    """The Prometheus name of an OTel-style metric; `_total` on counters is left to prometheus_client.

    `{token}`-style annotations carry no unit; `1` becomes `ratio` on gauges only, as
    in the OpenTelemetry specification's Prometheus compatibility rules.
    """
    base = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_:]", "_", name)).strip("_")
    unit = re.sub(r"\{[^}]*\}", "", unit)
    numerator, _, denominator = unit.partition("/")
    words = _UNIT_WORDS.get(numerator, numerator)
    if denominator:
        words = f"{words}_per_{_PER_UNIT_WORDS.get(denominator, denominator)}"
    if unit == "1" and kind != "gauge":
        words = ""
    if words and not base.endswith(words):
        base = f"{base}_{words}"
    return base


@dataclass(frozen=True)
class _Spec:
    name: str
    unit: str
    kind: str  # counter | gauge | histogram
    help: str

    @property
    def prometheus(self) -> str:
        return prometheus_name(self.name, self.unit, self.kind)


TOKENS_REQUESTED: Final = _Spec("kvaudit.fetch.tokens.requested", "{token}", "counter", "Tokens asked of the pool")
TOKENS_HIT: Final = _Spec("kvaudit.fetch.tokens.hit", "{token}", "counter", "Tokens the pool served")
HIT_RATIO: Final = _Spec("kvaudit.fetch.hit", "1", "gauge", "Tokens hit / tokens requested over fetches")
FETCH_SIZE: Final = _Spec("kvaudit.fetch.size", "By", "counter", "Bytes of KV pages fetched")
FETCH_DURATION: Final = _Spec("kvaudit.fetch.duration", "s", "histogram", "Latency of fetch operations")
CROSS_TOKENS: Final = _Spec(
    "kvaudit.fetch.cross_replica.tokens",
    "{token}",
    "counter",
    "Tokens of fetched pages that were used and produced by another replica",
)
PAGES: Final = _Spec("kvaudit.pages", "{page}", "counter", "Page descriptors in the traces, by operation")
READ_ERRORS: Final = _Spec("kvaudit.trace.read_errors", "{line}", "gauge", "Unreadable trace file lines")
FINDINGS: Final = _Spec("kvaudit.audit.findings", "{finding}", "gauge", "Audit findings (kvaudit audit), by rule")
PROMPT_TOKENS: Final = _Spec(
    "kvaudit.reuse.prompt.tokens",
    "{token}",
    "counter",
    "Prompt tokens of the requests looked up (queries/reuse_left.sql)",
)
REUSE_HIT_TOKENS: Final = _Spec("kvaudit.reuse.hit.tokens", "{token}", "counter", "Prompt tokens reused (hits)")
ACHIEVABLE_TOKENS: Final = _Spec(
    "kvaudit.reuse.achievable.tokens",
    "{token}",
    "counter",
    "Prompt tokens of the longest prefix a compatible copy of existed anywhere in the fleet at each lookup",
)
MISSED_TOKENS: Final = _Spec(
    "kvaudit.reuse.missed.tokens", "{token}", "counter", "Prompt tokens of missed pages, by cause (kvaudit explain)"
)
REUSE_HIT: Final = _Spec("kvaudit.reuse.hit", "1", "gauge", "Hit tokens / prompt tokens")
REUSE_ACHIEVABLE: Final = _Spec(
    "kvaudit.reuse.achievable", "1", "gauge", "Achievable tokens / prompt tokens: the hit rate the fleet could have had"
)

BEHIND: Final = _Spec("kvaudit.exporter.behind", "By", "gauge", "Bytes of the trace files not read yet (0: caught up)")
PRODUCERS_FORGOTTEN: Final = _Spec(
    "kvaudit.exporter.producers_forgotten",
    "{key}",
    "counter",
    "Page keys whose earliest store was forgotten (a bounded map): their fetches count as produced by no one",
)
DUPLICATE_SPANS: Final = _Spec(
    "kvaudit.exporter.duplicate_spans", "{span}", "counter", "Spans read a second time (an OTLP retry) and not counted"
)

_FINDINGS: Final = "SELECT code, rule, severity, count(*) FROM findings GROUP BY ALL ORDER BY ALL"
# How often the findings and the reuse left are figured again at most (each analysis audits
# and explains what arrived since the last), and how long the reader rests once caught up.
ANALYSE_EVERY_S: Final = 60.0
READ_PAUSE_S: Final = 1.0


@dataclass
class _Analysis:
    """What the analysis found when last run: rows of `_FINDINGS` and `ReuseCounts.rows`."""

    findings: list[tuple[object, ...]] = field(default_factory=list)
    reuse: list[tuple[object, ...]] = field(default_factory=list)


@dataclass
class _Arrived:
    """One read's rows, added to the counters part by part, and counted."""

    counts: ExporterCounts
    rows: int = 0

    def add(self, tables: Tables) -> None:
        self.rows += tables.num_rows
        self.counts.add(tables)


class TraceMetrics(Collector):
    """A prometheus_client collector that serves the last figures; threads of its own make them.

    A reader thread takes in what was appended to the trace files and adds each part's
    rows to the counters (`ExporterCounts`) as it is read; an analyser thread audits what
    arrived (`LiveAudit`) and counts the reuse left of the requests that settled
    (`ReuseCounts`), at most every `analyse_every_s`, when rows arrived or requests
    settled. A scrape only copies the last figures: it never waits for a read or a query,
    and answers from the first moment (`kvaudit_exporter_behind_bytes` says how much is
    still to read). A backend that reads no files (ClickHouse, an
    ingested database) has its counters figured by the full queries, by the analyser.

    Args:
        backend: the traces (trace files are read as they grow; other backends as they are).
        skew_s: clock skew allowed between replicas (the audit's findings, cross-replica tokens).
        analyse_every_s: the least time between two analyses.
        read_pause_s: how long the reader waits, once caught up, before it looks again.
        settle_s: how long after its lookup, or after the last rows arrived, a request's
            reuse left is counted (`exporter_reuse`).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        skew_s: float = 1.0,
        analyse_every_s: float = ANALYSE_EVERY_S,
        read_pause_s: float = READ_PAUSE_S,
        settle_s: float = SETTLE_S,
    ) -> None:
        self.backend = backend
        self._skew_s = skew_s
        self._analyse_every_s = analyse_every_s
        self._read_pause_s = read_pause_s
        self._lock = threading.Lock()  # held only to change or copy the figures
        self._counts = ExporterCounts(skew_s=skew_s, lock=self._lock)
        self._audit = LiveAudit(skew_s=skew_s)  # on the analyser's connection: it audits what arrived
        self._reuse = ReuseCounts(settle_s)  # the analyser's alone
        self._last_arrival = time.monotonic()
        self._analysis: _Analysis | None = None
        self._behind = backend.behind_bytes()
        self._reads = 0  # reads done
        self._arrivals = 0  # reads that added rows, and the first (what the analyser waits for)
        self._analysed = 0  # the arrivals the last analysis saw
        self._reading = False
        self._arrived = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> TraceMetrics:
        """Start reading and analysing in the background."""
        for target, name in ((self._read, "kvaudit-exporter-read"), (self._analyse, "kvaudit-exporter-analyse")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop the threads (each ends its current read or query first)."""
        self._stop.set()
        with self._arrived:
            self._arrived.notify_all()
        for thread in self._threads:
            thread.join()

    def caught_up(self) -> bool:
        """Whether every byte of the files is read and figured, the analysis included (tests wait on it)."""
        with self._arrived:
            done = self._reads > 0 and not self._reading and self._analysed == self._arrivals
        return done and self._reuse.settled and self.backend.behind_bytes() == 0

    def _read(self) -> None:
        if not self.backend.follows_files:  # nothing to read: the analyser figures the counters
            self._behind = 0
            self._arrive(added_rows=True)
            return
        while not self._stop.is_set():
            behind = self._behind

            def progress(n: int) -> None:
                nonlocal behind
                behind = max(behind - n, 0)
                self._behind = behind

            arrived = _Arrived(self._counts)
            self._reading = True
            try:
                self.backend.refresh(final=False, added=arrived.add, progress=progress)
            except Exception:  # the exporter serves on; the next read tries again
                logger.exception("kvaudit exporter: reading the traces failed")
            added_rows = arrived.rows > 0
            self._behind = self.backend.behind_bytes()
            self._arrive(added_rows)
            if not added_rows:
                self._stop.wait(self._read_pause_s)

    def _arrive(self, added_rows: bool) -> None:
        """Count a read done, and tell the analyser."""
        with self._arrived:
            self._reads += 1
            self._arrivals += added_rows or self._reads == 1
            if added_rows:
                self._last_arrival = time.monotonic()
            self._reading = False
            self._arrived.notify_all()

    def _analyse(self) -> None:
        backend = self.backend.cursor()
        analysed = 0  # the arrivals the last analysis saw
        while not self._stop.is_set():
            with self._arrived:
                # Rows arriving wake it, and so does the quiet that settles the last requests.
                quiet_in = None if self._reuse.settled else self._last_arrival + self._reuse.settle_s - time.monotonic()
                self._arrived.wait_for(
                    lambda seen=analysed: self._stop.is_set() or self._arrivals > seen, timeout=quiet_in
                )
                if self._stop.is_set():
                    return
                seen = self._arrivals
                analysed = seen if self.backend.follows_files else 0  # elsewhere, at every turn
            started = time.monotonic()
            try:
                self._analyse_once(backend)
            except Exception:  # the last figures stay served; the next analysis tries again
                logger.exception("kvaudit exporter: analysing the traces failed")
            with self._arrived:
                self._analysed = seen
                self._arrived.notify_all()
            self._stop.wait(max(self._analyse_every_s - (time.monotonic() - started), 0))

    def _analyse_once(self, backend: Backend) -> None:
        with self._arrived:  # no read under way, and none added rows for settle_s
            quiet = not self._reading and time.monotonic() - self._last_arrival >= self._reuse.settle_s
        prepare(backend, [SETTLED], audit=self._audit)
        self._reuse.add_settled(backend, quiet=quiet)
        analysis = _Analysis(backend.query(_FINDINGS)[1], self._reuse.rows())
        counts = None if self.backend.follows_files else ExporterCounts.of_history(backend, skew_s=self._skew_s)
        with self._lock:
            self._analysis = analysis
            if counts is not None:
                self._counts = counts

    def collect(self) -> Iterator[Metric]:
        counts = self._counts.snapshot()
        analysis = self._analysis
        yield from _fetch_families(counts)
        yield _labelled(CROSS_TOKENS, ["replica", "producer"], [(*pair, n) for pair, n in counts.cross.items()])
        yield _labelled(PAGES, ["replica", "op"], [(*pair, n) for pair, n in counts.pages.items()])
        yield _labelled(READ_ERRORS, [], [(counts.read_errors,)])
        if analysis is not None:
            yield _labelled(FINDINGS, ["code", "rule", "severity"], analysis.findings)
            yield from _reuse_families(analysis.reuse)
        yield _labelled(BEHIND, [], [(self._behind,)])
        yield _labelled(PRODUCERS_FORGOTTEN, [], [(counts.producers_forgotten,)])
        yield _labelled(DUPLICATE_SPANS, [], [(self.backend.repeated_spans(),)])


def _fetch_families(counts: ExporterCounts) -> Iterator[Metric]:
    requested = CounterMetricFamily(TOKENS_REQUESTED.prometheus, TOKENS_REQUESTED.help, labels=["replica"])
    hit = CounterMetricFamily(TOKENS_HIT.prometheus, TOKENS_HIT.help, labels=["replica"])
    ratio = GaugeMetricFamily(HIT_RATIO.prometheus, HIT_RATIO.help, labels=["replica"])
    size = CounterMetricFamily(FETCH_SIZE.prometheus, FETCH_SIZE.help, labels=["replica"])
    duration = HistogramMetricFamily(FETCH_DURATION.prometheus, FETCH_DURATION.help, labels=["replica"])
    for replica, (req, got, nbytes, count, seconds, *buckets) in sorted(counts.fetches.items()):
        requested.add_metric([replica], req)
        hit.add_metric([replica], got)
        if req:
            ratio.add_metric([replica], got / req)
        size.add_metric([replica], nbytes)
        bounds = [(repr(b), n) for b, n in zip(LATENCY_BUCKETS_S, buckets)] + [("+Inf", count)]
        duration.add_metric([replica], bounds, seconds)
    yield from (requested, hit, ratio, size, duration)


def _reuse_families(rows: list[tuple[object, ...]]) -> Iterator[Metric]:
    prompt = CounterMetricFamily(PROMPT_TOKENS.prometheus, PROMPT_TOKENS.help, labels=["replica"])
    hit = CounterMetricFamily(REUSE_HIT_TOKENS.prometheus, REUSE_HIT_TOKENS.help, labels=["replica"])
    achievable = CounterMetricFamily(ACHIEVABLE_TOKENS.prometheus, ACHIEVABLE_TOKENS.help, labels=["replica"])
    missed = CounterMetricFamily(MISSED_TOKENS.prometheus, MISSED_TOKENS.help, labels=["replica", "cause"])
    hit_ratio = GaugeMetricFamily(REUSE_HIT.prometheus, REUSE_HIT.help, labels=["replica"])
    achievable_ratio = GaugeMetricFamily(REUSE_ACHIEVABLE.prometheus, REUSE_ACHIEVABLE.help, labels=["replica"])
    for replica, prompt_tokens, hit_tokens, achievable_tokens, *per_cause in rows:
        prompt.add_metric([str(replica)], prompt_tokens)  # type: ignore[arg-type]
        hit.add_metric([str(replica)], hit_tokens)  # type: ignore[arg-type]
        achievable.add_metric([str(replica)], achievable_tokens)  # type: ignore[arg-type]
        for cause, tokens in zip(MISSES, per_cause):
            missed.add_metric([str(replica), cause.value], tokens)  # type: ignore[arg-type]
        if prompt_tokens:
            hit_ratio.add_metric([str(replica)], hit_tokens / prompt_tokens)  # type: ignore[operator]
            achievable_ratio.add_metric([str(replica)], achievable_tokens / prompt_tokens)  # type: ignore[operator]
    yield from (prompt, hit, achievable, missed, hit_ratio, achievable_ratio)


def _labelled(spec: _Spec, labels: list[str], rows: Iterable[tuple[object, ...]]) -> Metric:
    family_type = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    family = family_type(spec.prometheus, spec.help, labels=labels)
    for *values, number in sorted(rows, key=repr):
        family.add_metric([str(v) for v in values], number)  # type: ignore[arg-type]
    return family
