"""`kvaudit exporter`: derived metrics scraped over HTTP, and the OTel-to-Prometheus name translation."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.causes import MISSES
from kvaudit.commands.metrics_server import serve
from kvaudit.present.exporter_metrics import prometheus_name
from kvaudit.read.store import TraceStore
from kvaudit.simulator.engine import GIB, SimConfig, simulate
from kvaudit.simulator.stats import summarise_by

from ..support import alert_traces
from ..support.exporter import scrape_caught_up


def test_scraped_over_http_and_updated_as_files_grow(trace_dir: Path):
    alert_traces.recomputed_prefixes(trace_dir)
    server, port = serve(DuckDBBackend(TraceStore([trace_dir])), "127.0.0.1", 0, analyse_every_s=0, settle_s=0)
    try:
        first = scrape_caught_up(server, port)
        assert first["kvaudit_pages_total"] == {
            (("op", "store"), ("replica", "r1")): 24,
            (("op", "store"), ("replica", "r2")): 24,
        }
        assert "kvaudit_fetch_tokens_requested_total" not in first  # no fetches yet
        alert_traces.used_malformed_page(trace_dir)  # r2 now fetches r1's pages, and one bare page
        metrics = scrape_caught_up(server, port)
    finally:
        server.shutdown()
    r2 = (("replica", "r2"),)
    assert metrics["kvaudit_fetch_tokens_requested_total"][r2] == 25 * 32
    assert metrics["kvaudit_fetch_tokens_hit_total"][r2] == 25 * 32
    assert metrics["kvaudit_fetch_hit_ratio"][r2] == 1.0
    assert metrics["kvaudit_fetch_size_bytes_total"][r2] == 24 * 16384
    assert metrics["kvaudit_fetch_duration_seconds_count"][r2] == 25
    assert metrics["kvaudit_fetch_duration_seconds_bucket"][(("le", "+Inf"), ("replica", "r2"))] == 25
    assert metrics["kvaudit_fetch_cross_replica_tokens_total"][(("producer", "r1"), ("replica", "r2"))] == 24 * 32
    assert metrics["kvaudit_trace_read_errors"][()] == 0
    findings = metrics["kvaudit_audit_findings"]
    assert findings[(("code", "KVA001"), ("rule", "incomplete-metadata"), ("severity", "critical"))] == 1


def test_reuse_left_per_replica_is_the_simulators(tmp_path: Path):
    # Small private pools: pages are evicted, and held where the other replica cannot reach them.
    config = SimConfig(duration_s=90, rate=0.5, seed=3, shared=False, pool_bytes=16 * GIB)
    result = simulate(config, tmp_path)
    server, port = serve(DuckDBBackend(TraceStore(result.files)), "127.0.0.1", 0, settle_s=0)
    try:
        metrics = scrape_caught_up(server, port)
    finally:
        server.shutdown()
    summaries = {s.group: s for s in summarise_by(result.requests, lambda r: r.replica)}
    prompt = Counter()
    for request in result.requests:
        prompt[request.replica] += request.tokens
    missed = Counter((p.replica, p.cause.value) for p in result.pages if not p.cause.hit)
    for replica in ("r1", "r2"):
        labels = (("replica", replica),)
        assert metrics["kvaudit_reuse_prompt_tokens_total"][labels] == prompt[replica]
        assert metrics["kvaudit_reuse_hit_ratio"][labels] == pytest.approx(summaries[replica].hit)
        assert metrics["kvaudit_reuse_achievable_ratio"][labels] == pytest.approx(summaries[replica].achievable)
        for cause in MISSES:
            tokens = metrics["kvaudit_reuse_missed_tokens_total"][(("cause", cause.value), *labels)]
            assert tokens == missed[replica, cause.value] * config.page_tokens
    assert {cause for (_, cause), pages in missed.items() if pages} >= {"routed_away", "evicted", "never_stored"}
    assert summaries["all"].achievable > summaries["all"].hit


def test_names_are_translated_the_prometheus_way():
    assert prometheus_name("kvaudit.fetch.duration", "s", "histogram") == "kvaudit_fetch_duration_seconds"
    assert prometheus_name("kvaudit.fetch.size", "By", "counter") == "kvaudit_fetch_size_bytes"
    assert prometheus_name("kvaudit.fetch.hit", "1", "gauge") == "kvaudit_fetch_hit_ratio"
    assert prometheus_name("kvaudit.fetch.tokens.hit", "{token}", "counter") == "kvaudit_fetch_tokens_hit"
    assert prometheus_name("kvaudit.pool.bytes", "By", "gauge") == "kvaudit_pool_bytes"
    assert prometheus_name("kvaudit.transfer.rate", "By/s", "gauge") == "kvaudit_transfer_rate_bytes_per_second"
