"""Derived metrics for Prometheus: what `kvaudit exporter` serves on /metrics.

Each scrape reads what was appended to the trace files since the last one and
computes the figures with SQL over the views, the named queries and the audit's
findings (see `kvaudit.analyse.derived_views`). Names are defined OTel-style (dotted,
with a UCUM unit) and translated the way OpenTelemetry's Prometheus exporter does
(`kvaudit.fetch.duration` in `s` → `kvaudit_fetch_duration_seconds`), so dashboards
built on either path agree.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kvaudit.analyse.derived_views import prepare
from kvaudit.backends import Backend
from kvaudit.causes import MISSES

# UCUM units as OpenTelemetry's Prometheus translation spells them.
_UNIT_WORDS: Final = {"By": "bytes", "s": "seconds", "ms": "milliseconds", "1": "ratio"}
_PER_UNIT_WORDS: Final = {"s": "second", "m": "minute", "h": "hour", "d": "day"}  # after `/`: singular
# Upper bounds (seconds) of the fetch latency histogram: from a cached chunk on the
# same host (sub-millisecond) to a remote tier moving a 92 MiB page (seconds).
LATENCY_BUCKETS_S: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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

_BUCKET_COLUMNS: Final = ", ".join(f"count(*) FILTER (WHERE duration_ms <= {b * 1000})" for b in LATENCY_BUCKETS_S)
_FETCH_SPANS: Final = f"""
    SELECT replica, coalesce(sum(tokens_requested), 0), coalesce(sum(tokens_hit), 0), coalesce(sum(bytes), 0),
           count(*), coalesce(sum(duration_ms), 0) / 1e3, {_BUCKET_COLUMNS}
    FROM spans WHERE op = 'fetch' AND replica IS NOT NULL GROUP BY replica ORDER BY replica"""
# The named query `cross_replica_reuse` (a view, see `derived_views`) knows each fetched page's producer.
_CROSS_REPLICA: Final = """
    SELECT consumer, producer, sum(tokens) FROM query_cross_replica_reuse WHERE crossed GROUP BY ALL ORDER BY ALL"""
_FINDINGS: Final = "SELECT code, rule, severity, count(*) FROM findings GROUP BY ALL ORDER BY ALL"
_PAGES: Final = "SELECT replica, op, count(*) FROM pages WHERE op IS NOT NULL GROUP BY ALL ORDER BY ALL"
# A request whose spans name no tokens requested has no prompt tokens: NULL, counted as none.
_REUSE_COLUMNS: Final = ("prompt_tokens", "hit_tokens", "achievable_tokens", *(cause.value for cause in MISSES))
# The named query `reuse_left` (a view, see `derived_views`) per replica over all its time buckets.
_REUSE_LEFT: Final = f"""
    SELECT replica, {", ".join(f"coalesce(sum({column}), 0)" for column in _REUSE_COLUMNS)}
    FROM query_reuse_left GROUP BY replica ORDER BY replica"""


class TraceMetrics(Collector):
    """A prometheus_client collector over a backend; each scrape takes in what arrived first.

    Args:
        backend: the traces (trace files are read as they grow; other backends as they are).
        skew_s: clock skew allowed between replicas (the audit's findings).
    """

    def __init__(self, backend: Backend, *, skew_s: float = 1.0) -> None:
        self.backend = backend
        self._skew_s = skew_s
        # One connection serves every scrape: scrapes take turns.
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self.backend.refresh(final=False)
            prepare(self.backend, [_CROSS_REPLICA, _REUSE_LEFT], skew_s=self._skew_s)
            yield from self._fetch_families()
            yield self._family(CROSS_TOKENS, ["replica", "producer"], _CROSS_REPLICA)
            yield self._family(PAGES, ["replica", "op"], _PAGES)
            yield self._family(READ_ERRORS, [], "SELECT count(*) FROM read_errors")
            yield self._family(FINDINGS, ["code", "rule", "severity"], _FINDINGS)
            yield from self._reuse_families()

    def _fetch_families(self) -> Iterator[Metric]:
        requested = CounterMetricFamily(TOKENS_REQUESTED.prometheus, TOKENS_REQUESTED.help, labels=["replica"])
        hit = CounterMetricFamily(TOKENS_HIT.prometheus, TOKENS_HIT.help, labels=["replica"])
        ratio = GaugeMetricFamily(HIT_RATIO.prometheus, HIT_RATIO.help, labels=["replica"])
        size = CounterMetricFamily(FETCH_SIZE.prometheus, FETCH_SIZE.help, labels=["replica"])
        duration = HistogramMetricFamily(FETCH_DURATION.prometheus, FETCH_DURATION.help, labels=["replica"])
        for replica, req, got, nbytes, count, seconds, *buckets in self.backend.query(_FETCH_SPANS)[1]:
            requested.add_metric([replica], req)
            hit.add_metric([replica], got)
            if req:
                ratio.add_metric([replica], got / req)
            size.add_metric([replica], nbytes)
            bounds = [(repr(b), n) for b, n in zip(LATENCY_BUCKETS_S, buckets)] + [("+Inf", count)]
            duration.add_metric([replica], bounds, seconds)
        yield from (requested, hit, ratio, size, duration)

    def _reuse_families(self) -> Iterator[Metric]:
        prompt = CounterMetricFamily(PROMPT_TOKENS.prometheus, PROMPT_TOKENS.help, labels=["replica"])
        hit = CounterMetricFamily(REUSE_HIT_TOKENS.prometheus, REUSE_HIT_TOKENS.help, labels=["replica"])
        achievable = CounterMetricFamily(ACHIEVABLE_TOKENS.prometheus, ACHIEVABLE_TOKENS.help, labels=["replica"])
        missed = CounterMetricFamily(MISSED_TOKENS.prometheus, MISSED_TOKENS.help, labels=["replica", "cause"])
        hit_ratio = GaugeMetricFamily(REUSE_HIT.prometheus, REUSE_HIT.help, labels=["replica"])
        achievable_ratio = GaugeMetricFamily(REUSE_ACHIEVABLE.prometheus, REUSE_ACHIEVABLE.help, labels=["replica"])
        for replica, prompt_tokens, hit_tokens, achievable_tokens, *per_cause in self.backend.query(_REUSE_LEFT)[1]:
            prompt.add_metric([replica], prompt_tokens)
            hit.add_metric([replica], hit_tokens)
            achievable.add_metric([replica], achievable_tokens)
            for cause, tokens in zip(MISSES, per_cause):
                missed.add_metric([replica, cause.value], tokens)
            if prompt_tokens:
                hit_ratio.add_metric([replica], hit_tokens / prompt_tokens)
                achievable_ratio.add_metric([replica], achievable_tokens / prompt_tokens)
        yield from (prompt, hit, achievable, missed, hit_ratio, achievable_ratio)

    def _family(self, spec: _Spec, labels: list[str], query: str) -> Metric:
        family_type = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
        family = family_type(spec.prometheus, spec.help, labels=labels)
        for *values, number in self.backend.query(query)[1]:
            family.add_metric([str(v) for v in values], number)
        return family
