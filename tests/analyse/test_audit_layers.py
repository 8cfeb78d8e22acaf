"""The auditor reading two layers together: vLLM blocks served by LMCache chunks (docs/design.md section 4.2).

Hand-built traces of the reference deployment (docs/design.md section 6.4): each
replica's vLLM layer records a page per block with key, hash algorithm, token range and
the key of the LMCache chunk that served it (`source_key`); its LMCache layer, a child
span in the same trace, records the chunk with everything the object carried.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvaudit.analyse.audit import Finding, run_audit
from kvaudit.analyse.named_queries import run_named
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.contract import PageDescriptor
from kvaudit.tui.figures import Analysis, compute_figures
from kvaudit.tui.producers import ProducerIndex
from kvaudit.tui.window import window_named

from ..support.fleet import Fleet
from ..support.layers import CHUNK, Layers, block_pages, chunk_page

# A replica that splits the same width into other heads: LMCache's keys cannot tell.
SPLIT = {"kv_heads": 1, "head_size": 64}


@pytest.fixture
def fleet(trace_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    return Fleet(trace_dir, monkeypatch)


def _stored(fleet: Fleet, chunk: PageDescriptor | None = None, **consumer_geometry: object) -> Layers:
    """r1 stores `chunk` (default c1) at time 0; r2, ready to read it at time 5."""
    producer, consumer = Layers(fleet, "r1"), Layers(fleet, "r2", **consumer_geometry)
    fleet.at(0)
    producer.store(chunk or chunk_page("c1"))
    fleet.at(5)
    return consumer


def _audit(fleet: Fleet) -> list[Finding]:
    store = fleet.open()
    try:
        return run_audit(store)
    finally:
        store.close()


def _by_layer(findings: list[Finding]) -> list[tuple[str, str, str]]:
    """(code, severity, layer) per finding, the layer told by the key: chunks are `c*`."""
    return sorted((f.code, f.severity, "lmcache" if (f.key or "").startswith("c") else "vllm") for f in findings)


def test_clean_reuse_through_both_layers_has_no_findings(fleet: Fleet):
    _stored(fleet).fetch(chunk_page("c1", used=True), block_pages("c1", used=True))
    assert _audit(fleet) == []


def test_a_block_whose_chunk_is_not_in_its_trace_is_still_incomplete(fleet: Fleet):
    consumer = _stored(fleet)
    # No LMCache page at all, then one in another trace: neither describes these blocks.
    consumer.fetch(None, block_pages("c1", used=True))
    fleet.at(6)
    consumer.fetch(chunk_page("c1", used=True), block_pages("c1", used=True), other_trace=True)
    findings = _audit(fleet)
    assert _by_layer(findings) == [("KVA001", "critical", "vllm")] * 16
    assert all(f.fields == ["model", "dtype", "shape", "layout", "bytes", "world_size", "rank"] for f in findings)


def test_a_block_without_a_source_is_judged_alone(fleet: Fleet):
    consumer = _stored(fleet)
    consumer.fetch(chunk_page("c1", used=True), block_pages("c1", used=True, source=False))
    assert _by_layer(_audit(fleet)) == [("KVA001", "critical", "vllm")] * 8


def test_a_chunk_missing_metadata_leaves_its_blocks_incomplete(fleet: Fleet):
    consumer = _stored(fleet)
    bare = chunk_page("c1", used=False, dtype=None, shape=None, layout=None)
    consumer.fetch(bare, block_pages("c1", used=False))
    findings = _audit(fleet)
    # Rejected by the guard on both layers: safe misses, warnings.
    assert _by_layer(findings) == [("KVA001", "warning", "lmcache")] + [("KVA001", "warning", "vllm")] * 8
    assert {tuple(f.fields) for f in findings} == {("dtype", "shape", "layout")}


def test_a_head_split_the_keys_cannot_tell_is_caught_on_both_layers(fleet: Fleet):
    consumer = _stored(fleet, chunk_page("c1", kv_heads=2, head_size=32), **SPLIT)
    consumer.fetch(chunk_page("c1", used=True), block_pages("c1", used=True))
    findings = _audit(fleet)
    assert _by_layer(findings) == [("KVA005", "critical", "lmcache")] + [("KVA005", "critical", "vllm")] * 8
    for finding in findings:
        assert finding.producer == "r1"
        # The stored head split comes from the producer's chunk, through its blocks' source.
        assert finding.fields["kv_heads"] == {"fetched": None, "stored": 2, "consumer": 1}


def test_cross_replica_reuse_counts_each_transfer_once(fleet: Fleet):
    _stored(fleet).fetch(chunk_page("c1", used=True), block_pages("c1", used=True))
    store = fleet.open()
    try:
        columns, rows = run_named(store, "cross_replica_reuse")
    finally:
        store.close()
    (row,) = [dict(zip(columns, r, strict=True)) for r in rows]
    assert (row["producer"], row["consumer"], row["pages"], row["tokens"]) == ("r1", "r2", 1, CHUNK)
    assert row["bytes"] == 2 * 2 * CHUNK * 64 * 2 and row["crossed"]


@pytest.mark.parametrize("indexed", [True, False])
def test_the_tuis_reuse_matrix_counts_each_transfer_once(fleet: Fleet, trace_dir: Path, indexed: bool):
    _stored(fleet).fetch(chunk_page("c1", used=True), block_pages("c1", used=True))
    store = fleet.open()
    # Indexed: the producer index the TUI keeps over DuckDB; else the join it runs elsewhere.
    if indexed:
        ProducerIndex(store, skew_s=1.0)
    figures = compute_figures(DuckDBBackend(store), window_named("all"), analysis=Analysis(), indexed=indexed)
    store.close()
    assert [(c.producer, c.consumer, c.pages, c.used_tokens) for c in figures.reuse] == [("r1", "r2", 1, CHUNK)]
