"""`kvaudit explain` and `reuse_left` against the simulator's ground truth (docs/design.md section 7).

The simulator knows the exact state of every cache at every lookup and records each
page's cause (`kvaudit.simulator.page_truth`); the named query `explain` decides the
same from the traces alone. Under every router and each way of making the causes happen
(eviction pressure, local tiers and private pools that split sessions, the guard with
faults, late stores, a rolling upgrade without the guard), every page of every request
must get the simulator's cause, every hit its producer and store time, and every request
the simulator's achievable prefix.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from kvaudit.analyse.explain import explain
from kvaudit.analyse.named_queries import describe, load
from kvaudit.backends import Backend, as_backend
from kvaudit.backends.clickhouse import ChdbConnection, ClickHouseBackend
from kvaudit.backends.clickhouse_load import create_table, load_files
from kvaudit.causes import DROPPED, HITS, MISSES, Cause
from kvaudit.cli import main
from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
from kvaudit.emit.setup import setup_emitter
from kvaudit.read.store import TraceStore
from kvaudit.simulator.engine import GIB, PAGE_TRUTH_FILE, SimConfig, SimResult, simulate
from kvaudit.simulator.faults import Faults
from kvaudit.simulator.page_truth import read_page_truth
from kvaudit.simulator.router import ROUTERS
from kvaudit.simulator.stats import summarise_by

from ..support.backend_fleet import answers
from ..support.pages import KV, full_page

BASE = SimConfig(duration_s=90, rate=0.5, seed=3)
MODES = {
    "clean": BASE,
    # A small pool: pages are evicted, and the local tiers keep what the pool lost.
    "pressure": dataclasses.replace(BASE, pool_bytes=8 * GIB, local_bytes=16 * GIB),
    "private-pools": dataclasses.replace(BASE, shared=False, pool_bytes=16 * GIB),
    "guard-and-faults": dataclasses.replace(
        BASE,
        pool_bytes=16 * GIB,
        local_bytes=8 * GIB,
        faults=Faults(raw_ptr=0.03, upgrade_at_s=30, guard=True, store_delay_s=8),
    ),
    "upgrade-unguarded": dataclasses.replace(
        BASE, pool_bytes=12 * GIB, local_bytes=8 * GIB, faults=Faults(upgrade_at_s=30)
    ),
}
COLUMNS = ("request_id", "token_start", "cause", "producer", "stored_ns", "achievable")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    """Each (router, mode) simulated once for the module: its result and its traces."""

    @cache
    def run(router: str, mode: str) -> tuple[SimResult, Backend]:
        out = tmp_path_factory.mktemp(f"{router}-{mode}")
        result = simulate(dataclasses.replace(MODES[mode], router=router), out)
        assert read_page_truth(out / PAGE_TRUTH_FILE) == result.pages
        store = TraceStore(result.files)
        store.refresh()
        # One backend per store: it resets the variables a query leaves unset, which it alone knows of.
        return result, as_backend(store)

    return run


def _explained(backend: Backend) -> dict[tuple[str, int], dict]:
    columns, rows = backend.query(load("explain"))
    return {(row[0], row[columns.index("token_start")]): dict(zip(columns, row)) for row in rows}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("router", ROUTERS)
def test_every_page_gets_the_simulators_cause(runs, router: str, mode: str):
    result, store = runs(router, mode)
    explained = _explained(store)
    assert len(explained) == len(result.pages) > 500
    wrong = Counter()
    for truth in result.pages:
        page = explained[truth.request_id, truth.token_start]
        assert (page["replica"], page["key"]) == (truth.replica, truth.key)
        if page["cause"] != truth.cause:
            wrong[truth.cause.value, page["cause"]] += 1
        elif truth.cause in HITS:
            assert (page["producer"], page["stored_ns"]) == (truth.producer, truth.stored_ns)
    assert not wrong, f"(truth, explained) pages: {dict(wrong)}"
    achievable = Counter()
    for page in explained.values():
        achievable[page["request_id"]] += (page["token_end"] - page["token_start"]) * page["achievable"]
    assert achievable == Counter({r.request_id: r.achievable_tokens for r in result.requests if r.achievable_tokens})


def test_the_simulator_makes_every_cause_but_the_gpu_tier_happen(runs):
    seen = {page.cause for mode in MODES for page in runs("round-robin", mode)[0].pages}
    # The simulator models no GPU prefix cache, nor a hybrid model's sliding-window groups.
    assert seen == set(Cause) - {Cause.HIT_GPU} - DROPPED


@pytest.mark.parametrize("mode", ["pressure", "guard-and-faults"])
def test_reuse_left_has_the_simulators_hit_and_achievable_rates(runs, mode: str):
    result, store = runs("round-robin", mode)
    columns, rows = store.query(load("reuse_left"), {"kvaudit_bucket_s": 30})
    assert len(rows) > 2 * 2  # two replicas, several buckets
    sums: dict[str, Counter] = {}
    for row in rows:
        values = dict(zip(columns, row))
        sums.setdefault(values["replica"], Counter()).update(
            {name: values[name] for name in ("requests", "prompt_tokens", "hit_tokens", "achievable_tokens")}
        )
        missed = sum(values[cause.value] for cause in MISSES)
        assert values["hit_tokens"] + missed <= values["prompt_tokens"]  # partial last pages are no page
    columns, rows = store.query(load("reuse_left_requests"))
    per_request = {row[1]: dict(zip(columns, row)) for row in rows}
    assert {rid: (r["hit_tokens"], r["achievable_tokens"]) for rid, r in per_request.items()} == {
        r.request_id: (r.used_tokens, r.achievable_tokens) for r in result.requests
    }
    assert [row[columns.index("lost_tokens")] for row in rows] == sorted(
        (row[columns.index("lost_tokens")] for row in rows), reverse=True
    )
    summaries = {s.group: s for s in summarise_by(result.requests, lambda r: r.replica)}
    for replica, total in sums.items():
        summary = summaries[replica]
        assert total["requests"] == summary.reqs
        assert total["hit_tokens"] / total["prompt_tokens"] == pytest.approx(summary.hit)
        assert total["achievable_tokens"] / total["prompt_tokens"] == pytest.approx(summary.achievable)
    assert summaries["all"].achievable > summaries["all"].hit


@pytest.mark.slow
def test_clickhouse_explains_as_duckdb_does(runs):
    result, store = runs("round-robin", "guard-and-faults")
    clickhouse = ClickHouseBackend(ChdbConnection())
    try:
        create_table(clickhouse)
        load_files(clickhouse, [str(path) for path in result.files])
        request = next(page for page in result.pages if page.cause == Cause.REJECTED).request_id
        for name, params in (
            ("explain", {}),
            ("explain_evictions", {"kvaudit_request_id": request}),
            ("reuse_left_requests", {"kvaudit_replica": "r2"}),
            ("reuse_left", {}),
        ):
            expected = answers(store, load(name), params)
            assert expected[1] and answers(clickhouse, load(name), params) == expected
    finally:
        clickhouse.close()


def test_one_request_names_the_rule_the_guard_broke(runs):
    result, store = runs("round-robin", "guard-and-faults")
    rejected = next(page for page in result.pages if page.cause == Cause.REJECTED)
    [explanation] = explain(store, rejected.request_id)
    page = next(p for p in explanation.pages if p.token_start == rejected.token_start)
    assert page.cause == Cause.REJECTED and page.rule
    assert page.rule.split(", ")[0].startswith(("KVA001", "KVA005 layout"))
    assert explanation.pages[-1].page == len(explanation.pages) - 1
    assert explain(store, rejected.request_id, replica="nowhere") == []


def test_reuse_left_and_explain_evictions_include_explain():
    for name in ("reuse_left", "reuse_left_requests", "explain_evictions"):
        assert load(name).count(load("explain").strip().rstrip(";")) == 1
    assert set(describe("reuse_left").parameters) == {
        "kvaudit_request_id",
        "kvaudit_replica",
        "kvaudit_trace_id",
        "kvaudit_since_ns",
        "kvaudit_bucket_s",
    }


# ---- the command ----


def test_cli_explains_one_request_as_a_table_and_as_json(runs, capsys: pytest.CaptureFixture[str]):
    result, _ = runs("round-robin", "guard-and-faults")
    traces = str(result.files[0].parent)
    request = next(page for page in result.pages if page.cause == Cause.REJECTED).request_id
    assert main(["explain", traces, request]) == 0
    out = capsys.readouterr().out
    assert f"request {request} on" in out and "rejected" in out and "left on the table" in out
    assert "google/gemma-2-27b" in out  # the recompute cost's model, named by the replica's resource
    assert main(["explain", traces, request, "--format", "json"]) == 0
    pages = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    truth = [page for page in result.pages if page.request_id == request]
    assert [(p["token_start"], p["cause"]) for p in pages] == [(t.token_start, t.cause.value) for t in truth]
    assert all(p["recompute_s"] is None for p in pages if p["cause"] in HITS)
    assert all(p["recompute_s"] > 0 for p in pages if p["cause"] not in HITS)


def test_cli_says_in_one_line_that_it_never_saw_a_request(runs, capsys: pytest.CaptureFixture[str]):
    result, _ = runs("round-robin", "clean")
    assert main(["explain", str(result.files[0].parent), "no-such-request"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-request" in err


def test_trace_values_are_shown_as_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    hostile = "r[bold]\x1b]0;owned\x07"
    emitter = setup_emitter(hostile, f"file:{tmp_path}/r.jsonl", kv=KV, export_delay_s=0.01)
    with emitter.operation(Op.LOOKUP, hook=Hook.VLLM_CONNECTOR, request_id="q\x1b[2J", tokens_requested=64) as op:
        op.add_page(PageDescriptor(key="k0", token_start=0, token_end=32))
        op.end(Outcome.MISS, tokens_hit=0)
    with emitter.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id="q\x1b[2J", backend="x\x1b[31m") as op:
        op.add_page(full_page("k0", 0))
        op.end(Outcome.HIT, tokens_stored=32)
    emitter.shutdown()
    assert main(["explain", str(tmp_path), "q\x1b[2J"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "q\\x1b[2J" in out and "r[bold]\\x1b]0;owned\\x07" in out and "never_stored" in out


@pytest.mark.parametrize("mode", ["pressure", "guard-and-faults"])
def test_a_windows_requests_are_explained_as_over_the_whole_history(runs, mode: str):
    """`kvaudit_since_ns` keeps the requests looked up from then on, each explained over all
    the traces (a copy stored before the window still counts): the same rows as the whole
    history's, filtered, at the cost of the window's requests."""
    _, store = runs("round-robin", mode)
    columns, everything = store.query(load("reuse_left_requests"))
    lookups = sorted(row[columns.index("lookup_ns")] for row in everything)
    since = lookups[len(lookups) * 2 // 3]
    _, window = store.query(load("reuse_left_requests"), {"kvaudit_since_ns": since})
    assert 0 < len(window) < len(everything)
    assert sorted(window) == sorted(row for row in everything if row[columns.index("lookup_ns")] >= since)
