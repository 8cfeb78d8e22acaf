"""The exporter's counters, each read's new rows added: what a scrape serves costs nothing to serve.

Prometheus' model: a counter only adds what arrived, and windows are PromQL's (`rate`,
`increase`). So `kvaudit exporter` never recomputes its counters over the history: each
refresh of the trace files hands over the rows it added (`TraceStore.refresh`), and the
same SQL that figures a whole history (`FETCH_SPANS`, `PAGES`) runs over those rows
alone, on a connection of its own, and is added to the totals.

Cross-replica tokens need each fetched page's producer: the replica of the earliest
store of its key (queries/cross_replica_reuse.sql). The producers are kept in a map of
page key to earliest store, bounded (`PRODUCERS` keys, the oldest stored forgotten
first, counted by `producers_forgotten`): a page fetched after its key was forgotten
counts as produced by no one in the traces. A fetch is credited to the producer known
when it is read: the stores of one read are taken in before its fetches, and a store
read later is not credited back (a counter does not go back).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from typing import Final

from kvaudit.backends import Backend
from kvaudit.backends.duckdb_backend import ReadRows, Tables

# Upper bounds (seconds) of the fetch latency histogram: from a cached chunk on the
# same host (sub-millisecond) to a remote tier moving a 92 MiB page (seconds).
LATENCY_BUCKETS_S: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BUCKET_COLUMNS: Final = ", ".join(f"count(*) FILTER (WHERE duration_ms <= {b * 1000})" for b in LATENCY_BUCKETS_S)
# Per replica: tokens requested, tokens hit, bytes, fetches, seconds, then the bucket counts.
FETCH_SPANS: Final = f"""
    SELECT replica, coalesce(sum(tokens_requested), 0), coalesce(sum(tokens_hit), 0), coalesce(sum(bytes), 0),
           count(*), coalesce(sum(duration_ms), 0) / 1e3, {_BUCKET_COLUMNS}
    FROM spans WHERE op = 'fetch' AND replica IS NOT NULL GROUP BY replica ORDER BY replica"""
PAGES: Final = "SELECT replica, op, count(*) FROM pages WHERE op IS NOT NULL GROUP BY ALL ORDER BY ALL"
READ_ERRORS: Final = "SELECT count(*) FROM read_errors"
# The named query `cross_replica_reuse` (a view, see `derived_views`) knows each fetched page's producer.
CROSS_REPLICA: Final = """
    SELECT consumer, producer, sum(tokens) FROM query_cross_replica_reuse WHERE crossed GROUP BY ALL ORDER BY ALL"""
# What the incremental count of cross-replica tokens reads of one read's rows (see the module's docstring).
_STORES: Final = """
    SELECT key, arg_min(replica, time_ns), min(time_ns) FROM pages
    WHERE op = 'store' AND key IS NOT NULL GROUP BY key ORDER BY min(time_ns)"""
_FETCHED: Final = """
    SELECT replica, key, coalesce(token_end - token_start, 0), time_ns FROM pages
    WHERE op = 'fetch' AND (used IS NULL OR used) AND source_key IS NULL"""
# Producers kept (a key's hash, a time and a replica each; their memory is in docs/operations.md):
# many times the pages a fleet's pool holds, so a key is forgotten long after its pages were evicted.
PRODUCERS: Final = 524_288


class ExporterCounts:
    """Cumulative figures by replica, with each read's rows added (`add`).

    Args:
        skew_s: clock skew allowed between replicas (a store this far after a fetch still produced it).
        producers: page keys whose earliest store is kept (default `PRODUCERS`).
        lock: held while the figures change (a reader of `snapshot` takes it too); the
            queries over a read's rows run before, without it.
    """

    def __init__(
        self, *, skew_s: float = 1.0, producers: int | None = None, lock: threading.Lock | None = None
    ) -> None:
        self._lock = lock or threading.Lock()
        self.fetches: dict[str, list[float]] = {}  # replica -> the columns of FETCH_SPANS
        self.pages: Counter[tuple[str, str]] = Counter()  # (replica, op) -> page rows
        self.read_errors = 0
        self.cross: Counter[tuple[str, str]] = Counter()  # (consumer, producer) -> tokens
        self.producers_forgotten = 0
        self._skew_ns = int(skew_s * 1e9)
        self._capacity = PRODUCERS if producers is None else producers
        self._producers: OrderedDict[int, tuple[int, str | None]] = OrderedDict()  # hash(key) -> (time, replica)
        self._rows: ReadRows | None = None

    def add(self, added: Tables) -> None:
        """Add the figures of the rows one read added."""
        if not added.num_rows:
            return
        self._rows = self._rows or ReadRows()
        fetches = self._rows.query(added, FETCH_SPANS)
        pages = self._rows.query(added, PAGES)
        stores = self._rows.query(added, _STORES) if added.pages.num_rows else []
        fetched = self._rows.query(added, _FETCHED) if added.pages.num_rows else []
        with self._lock:
            for replica, *columns in fetches:
                totals = self.fetches.setdefault(replica, [0] * len(columns))
                for k, value in enumerate(columns):
                    totals[k] += value
            for replica, op, count in pages:
                self.pages[(replica, op)] += count
            self.read_errors += added.errors.num_rows
            self._remember_producers(stores)
            self._count_crossed(fetched)

    def snapshot(self) -> ExporterCounts:
        """A copy of the figures (the producers left out), as they are now."""
        with self._lock:
            copy = ExporterCounts.__new__(ExporterCounts)
            copy.fetches = {replica: list(columns) for replica, columns in self.fetches.items()}
            copy.pages, copy.cross = Counter(self.pages), Counter(self.cross)
            copy.read_errors, copy.producers_forgotten = self.read_errors, self.producers_forgotten
            return copy

    def _remember_producers(self, stores: list[tuple[str, str | None, int]]) -> None:
        for key, replica, stored_ns in stores:
            identity = hash(key)
            known = self._producers.get(identity)
            if known is None:
                self._producers[identity] = (stored_ns, replica)
                if len(self._producers) > self._capacity:
                    self._producers.popitem(last=False)
                    self.producers_forgotten += 1
            elif stored_ns < known[0]:
                self._producers[identity] = (stored_ns, replica)

    def _count_crossed(self, fetched: list[tuple[str | None, str | None, int, int]]) -> None:
        for consumer, key, tokens, fetched_ns in fetched:
            known = self._producers.get(hash(key)) if key is not None else None
            if known is None or consumer is None:
                continue
            stored_ns, producer = known
            if producer is not None and producer != consumer and stored_ns <= fetched_ns + self._skew_ns:
                self.cross[(consumer, producer)] += tokens

    @classmethod
    def of_history(cls, backend: Backend, *, skew_s: float = 1.0) -> ExporterCounts:
        """The same figures over the backend's whole history, by the full queries (a backend that
        reads no files, such as ClickHouse, and the tests and benchmark that compare)."""
        from kvaudit.analyse.derived_views import prepare

        counts = cls(skew_s=skew_s)
        counts.fetches = {replica: list(columns) for replica, *columns in backend.query(FETCH_SPANS)[1]}
        counts.pages = Counter({(replica, op): count for replica, op, count in backend.query(PAGES)[1]})
        [(counts.read_errors,)] = backend.query(READ_ERRORS)[1]
        prepare(backend, [CROSS_REPLICA], audit=None)
        crossed = backend.query(CROSS_REPLICA, {"kvaudit_skew_s": skew_s})[1]
        counts.cross = Counter({(consumer, producer): tokens for consumer, producer, tokens in crossed})
        return counts

    def close(self) -> None:
        if self._rows is not None:
            self._rows.close()
