"""`kvaudit exporter` live: it answers before its first read ends, and its counters add what each read took in."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvaudit.backends.duckdb_backend import DuckDBBackend, Tables
from kvaudit.commands.metrics_server import serve
from kvaudit.present.exporter_counts import ExporterCounts
from kvaudit.read.open import open_store
from kvaudit.read.store import TraceStore
from kvaudit.simulator.engine import GIB, SimConfig, simulate

from ..support import alert_traces
from ..support.exporter import Samples, scrape, scrape_caught_up

COUNTERS = (
    "kvaudit_pages_total",
    "kvaudit_fetch_tokens_requested_total",
    "kvaudit_fetch_tokens_hit_total",
    "kvaudit_fetch_size_bytes_total",
    "kvaudit_fetch_duration_seconds_count",
    "kvaudit_fetch_duration_seconds_sum",
    "kvaudit_fetch_cross_replica_tokens_total",
)


class _Gated(DuckDBBackend):
    """A live DuckDB backend whose reads wait for a gate: a first read that has not ended yet, for as
    long as the test wants (a real read of a large history ends by itself, at a time no test can know)."""

    def __init__(self, store: TraceStore) -> None:
        super().__init__(store)
        self.gate = threading.Event()

    def refresh(self, *, final: bool = True, added: Callable[[Tables], None] | None = None, **kwargs: Any) -> Any:
        self.gate.wait()
        return super().refresh(final=final, added=added, **kwargs)


def test_it_answers_before_its_first_read_ends(trace_dir: Path):
    alert_traces.recomputed_prefixes(trace_dir)
    backend = _Gated(TraceStore([trace_dir], ":memory:"))
    server, port = serve(backend, "127.0.0.1", 0, analyse_every_s=0, settle_s=0)
    try:
        waiting = scrape(port)  # the first read is held at its gate
        assert waiting["kvaudit_exporter_behind_bytes"][()] == sum(f.stat().st_size for f in trace_dir.iterdir())
        assert "kvaudit_pages_total" not in waiting  # nothing read yet: no series
        backend.gate.set()
        metrics = scrape_caught_up(server, port)
    finally:
        backend.gate.set()
        server.shutdown()
    assert sum(metrics["kvaudit_pages_total"].values()) == 48


def _lines_by_time(files: list[Path]) -> list[tuple[str, int, bytes]]:
    """Every line of the files with its file's name and its first span's start time."""
    lines = []
    for path in files:
        for line in path.read_bytes().splitlines(keepends=True):
            spans = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]
            lines.append((path.name, int(spans[0]["startTimeUnixNano"]), line))
    return lines


def _counters(samples: Samples) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(name, labels): value for name in COUNTERS for labels, value in samples.get(name, {}).items()}


def test_counters_add_each_read_and_end_equal_to_the_whole_history(tmp_path: Path):
    # Small private pools: pages are fetched across replicas, evicted, and stored again.
    config = SimConfig(duration_s=60, rate=0.5, seed=3, shared=False, pool_bytes=16 * GIB)
    result = simulate(config, tmp_path / "sim")
    lines = _lines_by_time(result.files)
    times = sorted(at for _, at, _ in lines)
    cuts = [times[len(times) // 3], times[2 * len(times) // 3], max(times) + 1]
    live = tmp_path / "live"
    live.mkdir()
    # A batch the receiver took twice (an OTLP retry after a restart): its spans count once.
    name, _, repeated = lines[len(lines) // 2]
    server, port = serve(DuckDBBackend(TraceStore([live], ":memory:")), "127.0.0.1", 0, analyse_every_s=0, settle_s=0)
    scraped = []
    try:
        low = 0
        for high in cuts:  # appended in three parts, each a span of time of every replica
            for file, at, line in lines:
                if low <= at < high:
                    with (live / file).open("ab") as f:
                        f.write(line)
            if high == cuts[1]:
                with (live / name).open("ab") as f:
                    f.write(repeated)
            low = high
            scraped.append(scrape_caught_up(server, port))
    finally:
        server.shutdown()
    counters = [_counters(samples) for samples in scraped]
    for before, after in itertools.pairwise(counters):
        assert all(after.get(series, 0) >= value for series, value in before.items()), "a counter went down"
    assert counters[0] != counters[-1]
    assert scraped[-1]["kvaudit_exporter_duplicate_spans_total"][()] == len(
        json.loads(repeated)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    )
    history = ExporterCounts.of_history(DuckDBBackend(open_store([str(f) for f in result.files])))
    assert counters[-1] == pytest.approx(_expected(history), rel=1e-12)  # sums of seconds, added in another order
    assert any(name == "kvaudit_fetch_cross_replica_tokens_total" for name, _ in counters[-1])


def _expected(counts: ExporterCounts) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for (replica, op), n in counts.pages.items():
        expected[("kvaudit_pages_total", (("op", op), ("replica", replica)))] = n
    for replica, (requested, hit, nbytes, count, seconds, *_) in counts.fetches.items():
        labels = (("replica", replica),)
        expected[("kvaudit_fetch_tokens_requested_total", labels)] = requested
        expected[("kvaudit_fetch_tokens_hit_total", labels)] = hit
        expected[("kvaudit_fetch_size_bytes_total", labels)] = nbytes
        expected[("kvaudit_fetch_duration_seconds_count", labels)] = count
        expected[("kvaudit_fetch_duration_seconds_sum", labels)] = seconds
    for (consumer, producer), tokens in counts.cross.items():
        expected[("kvaudit_fetch_cross_replica_tokens_total", (("producer", producer), ("replica", consumer)))] = tokens
    return expected


def test_producers_past_the_bound_are_forgotten_and_counted(trace_dir: Path):
    alert_traces.recomputed_prefixes(trace_dir)  # r1 and r2 each store the same 24 pages
    alert_traces.used_malformed_page(trace_dir)  # r2 fetches 24 of r1's
    store = TraceStore([trace_dir])
    bounded = ExporterCounts(producers=4)
    bounded.add(store.refresh())
    assert bounded.producers_forgotten == 24 - 4
    assert sum(bounded.cross.values()) < sum(ExporterCounts.of_history(DuckDBBackend(store)).cross.values())
