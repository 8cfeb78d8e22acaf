"""The fleet simulator: determinism, its LRU against a brute-force one, and faults as the traces show them."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from kvaudit.analyse.audit import run_audit
from kvaudit.analyse.named_queries import run_named
from kvaudit.cli import main
from kvaudit.contract import REQUIRED_ON_FETCH
from kvaudit.read.store import TraceStore
from kvaudit.simulator.engine import GROUND_TRUTH_FILE, PAGE_TRUTH_FILE, SimConfig, SimResult, simulate
from kvaudit.simulator.faults import RAW_PTR, ROLLING_UPGRADE, Faults, parse_faults, read_ground_truth
from kvaudit.simulator.model import LAYOUT_PACKED, LAYOUT_SPLIT, PRESETS, CostModel, load_model
from kvaudit.simulator.stats import summarise
from kvaudit.simulator.workload import TokenStream, parse_mix

SMALL = SimConfig(duration_s=90, rate=0.4, seed=7)
FAULTY = dataclasses.replace(SMALL, faults=Faults(raw_ptr=0.05, upgrade_at_s=45))


def _run(config: SimConfig, out: Path) -> tuple[SimResult, TraceStore]:
    result = simulate(config, out)
    store = TraceStore(result.files)
    store.refresh()
    return result, store


def test_presets_match_the_design_numbers():
    gemma2, gemma3 = PRESETS["gemma-2-27b"], PRESETS["gemma-3-27b"]
    assert gemma2.kv_bytes_per_token == 376_832
    assert gemma2.page_bytes(256) == 92 * 2**20
    assert round(256 * 2**30 / gemma2.kv_bytes_per_token, -3) == 729_000
    assert gemma3.kv_bytes_per_token == 496 * 1024
    for layout in (LAYOUT_SPLIT, LAYOUT_PACKED):
        shape = gemma2.page_shape(layout, 256)
        assert 2 * math.prod(shape) == gemma2.page_bytes(256)  # bf16: 2 bytes
    cost = CostModel()  # the linear part: 2 x 27.2e9 FLOPs per token at 989.4 TFLOP/s x MFU 0.5
    assert cost.prefill_flops(gemma2, 1) / cost.effective_flops == pytest.approx(0.110e-3, rel=0.01)
    assert 3e9 < cost.breakeven_bytes_per_s(gemma2, 4096) < 4e9


def test_model_geometry_from_json(tmp_path: Path):
    path = tmp_path / "tiny.json"
    path.write_text('{"name": "tiny", "params": 1e9, "layers": 2, "kv_heads": 2, "head_size": 64}')
    assert load_model(str(path)).kv_bytes_per_token == 2 * 2 * 2 * 64 * 2
    path.write_text('{"name": "tiny", "params": 1e9, "layers": 2, "kv_heads": 2, "head_size": 64, "dtype": "int4"}')
    for spec in (str(path), "gemma-9-1t"):
        with pytest.raises(ValueError):
            load_model(spec)


def test_page_keys_are_chained_prefix_hashes():
    a, b = TokenStream(4), TokenStream(4)
    for stream in (a, b):
        stream.append("system", 6)
    a.append("alice", 6)
    b.append("bob", 6)
    # Page 0 lies inside the shared prefix, page 1 straddles the divergence.
    assert a.page_keys()[0] == b.page_keys()[0]
    assert a.page_keys()[1:] != b.page_keys()[1:]
    before = a.page_keys()
    a.append("more", 4)
    assert a.page_keys()[: len(before)] == before and len(a.page_keys()) == 4


def test_parse_mix_and_faults_reject_bad_input():
    assert parse_mix("chat=3,oneshot=1") == {"chat": 0.75, "oneshot": 0.25}
    for bad in ("chat=x", "nope", "chat=0"):
        with pytest.raises(ValueError):
            parse_mix(bad)
    assert parse_faults(["raw-ptr:0.01", "rolling-upgrade:30"], guard=True) == Faults(0.01, 30.0, True)
    for bad in ("raw-ptr:2", "rolling-upgrade:-1", "meteor:1", "raw-ptr"):
        with pytest.raises(ValueError):
            parse_faults([bad])


def test_deterministic_for_a_seed(tmp_path: Path):
    def snapshot(out: Path) -> tuple[list, list, bytes]:
        _, store = _run(FAULTY, out)
        _, pages = store.query("SELECT * EXCLUDE (file, line, span_id, resource_id) FROM pages ORDER BY ALL")
        _, spans = store.query(
            "SELECT trace_id, parent_span_id, name, start_ns, end_ns, op, request_id, tokens_requested, tokens_hit,"
            " tokens_stored, pages, bytes, outcome FROM spans ORDER BY ALL"
        )
        return pages, spans, (out / GROUND_TRUTH_FILE).read_bytes()

    first, second = snapshot(tmp_path / "a"), snapshot(tmp_path / "b")
    assert first[0] and first[2]
    assert first == second
    other = simulate(dataclasses.replace(FAULTY, seed=8))
    assert summarise("all", other.requests) != summarise("all", simulate(FAULTY).requests)


def _brute_force_hits(result: SimResult, capacity_pages: int) -> dict[str, int]:
    """Replay each request's lookup (at its start) and store (at its end) on a list-based LRU."""
    events = []
    for record in result.requests:
        events.append((record.start_ns, 1, "lookup", record))
        events.append((record.finish_ns, 0, "store", record))
    lru: list[str] = []
    hits: dict[str, int] = {}
    for _, _, kind, record in sorted(events, key=lambda e: e[:2]):
        if kind == "lookup":
            hit = 0
            for key in record.keys:
                if key not in lru:
                    break
                lru.remove(key)
                lru.append(key)
                hit += 1
            hits[record.request_id] = hit
            continue
        for key in record.keys[hits[record.request_id] :]:
            if key in lru:
                lru.remove(key)
            else:
                while len(lru) >= capacity_pages:
                    lru.pop(0)
            lru.append(key)
    return hits


@pytest.mark.parametrize("router", ["round-robin", "session-affinity"])
def test_hit_rates_match_abrute_force_lru(tmp_path: Path, router: str):
    page = PRESETS["gemma-2-27b"].page_bytes(256)
    capacity = 60
    config = dataclasses.replace(SMALL, pool_bytes=capacity * page, router=router)
    result, store = _run(config, tmp_path)
    expected = _brute_force_hits(result, capacity)
    _, rows = store.query("SELECT request_id, tokens_hit FROM spans WHERE op = 'fetch'")
    traced = dict(rows)
    assert traced == {rid: hit * 256 for rid, hit in expected.items()}
    _, [(evicted,)] = store.query("SELECT count(*) FROM pages WHERE op = 'evict'")
    assert evicted > 0  # the pool was full: the replay checked eviction order too
    hit_rate = sum(traced.values()) / sum(r.tokens for r in result.requests)
    assert hit_rate == pytest.approx(summarise("all", result.requests).hit)


def test_clean_run_pages_are_complete_and_match_their_consumer(tmp_path: Path):
    result, store = _run(SMALL, tmp_path)
    assert result.ground_truth == [] and (tmp_path / GROUND_TRUTH_FILE).read_bytes() == b""
    missing = " OR ".join(f"p.{name} IS NULL" for name in sorted(REQUIRED_ON_FETCH))
    _, [(fetched, bad)] = store.query(
        f"SELECT count(*), count(*) FILTER ({missing} OR p.layout <> r.layout OR p.transfer <> 'copy') "
        "FROM pages p JOIN replicas r USING (resource_id) WHERE p.op = 'fetch'"
    )
    assert fetched > 100 and bad == 0
    _, [(too_early,)] = store.query(
        "SELECT count(*) FROM pages f WHERE f.op = 'fetch' AND NOT EXISTS "
        "(SELECT 1 FROM pages s WHERE s.op = 'store' AND s.key = f.key AND s.time_ns <= f.time_ns)"
    )
    assert too_early == 0  # every fetched page has an earlier store: no orphans on a clean run


@pytest.mark.parametrize("guard", [False, True])
def test_ground_truth_is_what_the_traces_show(tmp_path: Path, guard: bool):
    config = dataclasses.replace(FAULTY, faults=dataclasses.replace(FAULTY.faults, guard=guard))
    result, store = _run(config, tmp_path)
    truth = read_ground_truth(tmp_path / GROUND_TRUTH_FILE)
    assert truth == result.ground_truth
    assert {t.fault for t in truth} == {RAW_PTR, ROLLING_UPGRADE}
    assert all(t.used is not guard for t in truth)
    _, rows = store.query(
        "SELECT p.replica, p.trace_id, p.key, p.used, p.transfer, p.address IS NOT NULL,"
        " p.dtype IS NULL AND p.shape IS NULL AND p.layout IS NULL, p.layout IS DISTINCT FROM r.layout, r.layout"
        " FROM pages p JOIN replicas r USING (resource_id) WHERE p.op = 'fetch'"
    )
    raw = {(row[0], row[1], row[2]) for row in rows if row[4] == "raw_ptr" and row[5] and row[6]}
    mismatched = {(row[0], row[1], row[2]): row[8] for row in rows if row[4] == "copy" and row[7]}
    assert {(t.replica, t.trace_id, t.key) for t in truth if t.fault == RAW_PTR} == raw
    upgrade = {(t.replica, t.trace_id, t.key): t.consumer_layout for t in truth if t.fault == ROLLING_UPGRADE}
    assert upgrade == mismatched
    assert all(row[3] is not guard for row in rows if (row[0], row[1], row[2]) in raw | mismatched.keys())
    if guard:  # a rejected page is recomputed: it costs its prefill and is not counted as a hit
        cost, model = config.cost, config.model
        for record in result.requests:
            new = record.tokens - record.used_tokens
            assert record.prefill_s == pytest.approx(cost.prefill_s(model, new, record.used_tokens))
        # The first page the guard refuses breaks the prefix: the pages after it are not used either.
        _, [(unused,)] = store.query("SELECT count(*) FROM pages WHERE op = 'fetch' AND NOT used")
        assert sum(r.rejected_tokens for r in result.requests) == 256 * unused >= 256 * len(truth)


def test_auditor_finds_every_injected_fault_and_nothing_on_a_clean_run(tmp_path: Path):
    result, store = _run(FAULTY, tmp_path / "faulty")
    found = {(f.replica, f.trace_id, f.key) for f in run_audit(store)}
    missed = [t for t in result.ground_truth if (t.replica, t.trace_id, t.key) not in found]
    assert not missed, f"{len(missed)} of {len(result.ground_truth)} injected faults not found, e.g. {missed[0]}"
    _, clean = _run(SMALL, tmp_path / "clean")
    assert run_audit(clean) == []


def test_local_tier_serves_its_own_replica_first(tmp_path: Path):
    config = dataclasses.replace(SMALL, local_bytes=64 * 2**30, router="session-affinity")
    result, store = _run(config, tmp_path)
    _, tiers = store.query("SELECT tier, count(*) FROM pages WHERE op = 'fetch' GROUP BY ALL")
    assert dict(tiers).keys() == {"cpu", "remote"}
    # Local hits (pages this replica stored) move at the local tier's bandwidth, faster than the pool's.
    transfer_s = sum(r.transfer_s for r in result.requests)
    assert transfer_s < config.cost.transfer_s(sum(r.fetched_bytes for r in result.requests))


def test_cli_simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "out"
    args = ["simulate", "--out", str(out), "--duration", "30", "--rate", "0.5", "--fault", "rolling-upgrade:10"]
    assert main([*args, "--router", "prefix-aware", "--local-gib", "16", "--guard", "--prevent"]) == 0
    assert "Per workload" in capsys.readouterr().out
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.*")) == [
        GROUND_TRUTH_FILE,
        PAGE_TRUTH_FILE,
        "traces/r1.jsonl",
        "traces/r2.jsonl",
    ]
    assert main(["simulate", "--out", str(out), "--fault", "raw-ptr:7"]) == 2
    assert "raw-ptr:7" in capsys.readouterr().err
    assert main(["simulate", "--out", str(out), "--gpu", "a100", "--precision", "fp8"]) == 2
    assert "no fp8 tensor cores" in capsys.readouterr().err


def _records(store: TraceStore, query: str) -> list[dict[str, object]]:
    columns, rows = run_named(store, query)
    return [dict(zip(columns, row)) for row in rows]


UPGRADE = dataclasses.replace(SMALL, faults=Faults(upgrade_at_s=45, guard=True))
# The bytes of fetched pages whose layout is not their consumer's: what the guard rejects.
FOREIGN_BYTES = (
    "SELECT coalesce(sum(p.bytes), 0) FROM pages p JOIN replicas r USING (resource_id)"
    " WHERE p.op = 'fetch' AND p.layout IS DISTINCT FROM r.layout"
)


def test_prevent_rolling_upgrade_moves_no_bytes_for_pages_the_guard_would_reject(tmp_path: Path):
    guarded, guard_store = _run(UPGRADE, tmp_path / "guard")
    config = dataclasses.replace(UPGRADE, faults=dataclasses.replace(UPGRADE.faults, prevent=True))
    prevented, store = _run(config, tmp_path / "prevent")
    # Guard only: the old layout's pages reach the upgraded replica, move, and are rejected
    # (each one the ground truth records; the pages after a refused one are not fetched).
    refused = [truth for truth in guarded.ground_truth if not truth.used]
    assert refused
    assert guard_store.query(FOREIGN_BYTES)[1] == [(len(refused) * UPGRADE.model.page_bytes(UPGRADE.page_tokens),)]
    # Prevention: they are never found, so nothing of theirs moves and nothing is rejected.
    assert store.query(FOREIGN_BYTES)[1] == [(0,)]
    assert prevented.ground_truth == []
    assert sum(r.rejected_tokens for r in prevented.requests) == 0
    assert run_audit(store) == []
    # Guard only, every refused page is one of another fingerprint (KVA008, a safe miss);
    # with prevention the pages of the other layout were recomputed instead, and counted.
    kva008 = [f for f in run_audit(guard_store) if f.code == "KVA008"]
    assert len(kva008) == len(refused) and {f.severity for f in kva008} == {"warning"}
    [prevented_pages] = [row["prevented_pages"] for row in _records(store, "headline")]
    [none] = [row["prevented_pages"] for row in _records(guard_store, "headline")]
    assert prevented_pages > 0 and none == 0
    # The upgraded replica still reuses pages of its own layout.
    _, packed = store.query(
        "SELECT count(*) FROM pages p JOIN replicas r USING (resource_id)"
        " WHERE p.op = 'fetch' AND p.used AND r.layout = $layout",
        {"layout": LAYOUT_PACKED},
    )
    assert packed[0][0] > 0
