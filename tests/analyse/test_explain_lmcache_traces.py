"""`kvaudit explain` and `reuse_left` on traces of a real LMCache 0.5.6 engine (docs/design.md section 7).

LMCache's store pages carry no tier (one store goes to all its backends), its eviction
pages name the tier of their backend: queries/store_events.sql is the one rule that
makes a capacity eviction from `lmcache.local_cpu` end the copy a store put there. The
engine (tests/support/lmcache_engine.py) has a local CPU pool of four pages. Request a
stores prompt A (3 pages), request b stores prompt B (3 pages), which evicts A's first
two pages for capacity; request c then looks prompt A up (a miss) and stores it again,
as a serving engine stores what it recomputed. Request d looks up two pages of prompt D
and stores three: the third is its output, no prompt page. Request e only looks up.

At `sample_rate` 0.5 the hook records b and c, not a or d (by the CRC-32 of their ids,
docs/design.md section 3.10): a's store is missing from the traces, but b's evictions of
a's pages, which are always recorded, prove it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("lmcache", reason="LMCache is installed by scripts/install-lmcache.sh")
pytest.importorskip("torch")

from kvaudit.analyse.explain import explain
from kvaudit.analyse.named_queries import run_named
from kvaudit.backends import Backend, as_backend
from kvaudit.causes import REMEDIES, Cause
from kvaudit.cli import main
from kvaudit.read.store import TraceStore

from ..support.lmcache_engine import CHUNK, POOL_GB, hooked_engine, kv, sequence

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*LoggingHandler.*:DeprecationWarning")]


def _run(traces: Path, sample_rate: float) -> Path:
    with hooked_engine(traces, f"explain-{sample_rate}", sample_rate, max_local_cpu_size=POOL_GB) as engine:
        for request, prompt in (("a", 1), ("b", 2), ("c", 1)):
            engine.lookup(sequence(prompt), lookup_id=request)
            engine.store(sequence(prompt), kvcache=kv(), req_id=request)
        engine.lookup(sequence(4, pages=2), lookup_id="d")
        engine.store(sequence(4), kvcache=kv(), req_id="d")  # the prompt and its output
        engine.lookup(sequence(5), lookup_id="e")  # a lookup alone: LMCache's names no pages
    return traces


def _backend(traces: Path) -> Iterator[Backend]:
    store = TraceStore([traces])
    store.refresh()
    yield as_backend(store)
    store.close()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("lmcache_explain"), 1.0)


@pytest.fixture(scope="module")
def backend(traces: Path) -> Iterator[Backend]:
    yield from _backend(traces)


@pytest.fixture(scope="module")
def sampled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    yield from _backend(_run(tmp_path_factory.mktemp("lmcache_explain_sampled"), 0.5))


def test_a_capacity_eviction_ends_the_copy_lmcache_stored(backend: Backend):
    (request,) = explain(backend, "c")
    causes = [page.cause for page in request.pages]
    assert causes == [Cause.EVICTED, Cause.EVICTED, Cause.PREFIX_BROKEN]
    evicted = request.pages[0]
    assert (evicted.tier, evicted.holder, evicted.producer) == ("cpu", "r1", "r1")
    assert evicted.eviction().startswith("capacity from cpu of r1 (lmcache.local_cpu)")
    assert evicted.evicted_by == "b"
    # The prefix the engine held at c's lookup began with an evicted page: nothing was achievable.
    assert [page.achievable for page in request.pages] == [False, False, False]
    # Nothing was left on the table, but the fleet had held two of its three pages.
    assert request.rates().endswith("achievable 0 (0%): 0% left on the table; lost to eviction 512 (67%)")
    assert request.notes == []


def test_reuse_left_counts_no_evicted_page_as_achievable(backend: Backend):
    columns, rows = run_named(backend, "reuse_left_requests")
    by_request = {row[columns.index("request_id")]: dict(zip(columns, row)) for row in rows}
    c = by_request["c"]
    assert (c["prompt_tokens"], c["hit_tokens"], c["achievable_tokens"], c["lost_tokens"]) == (3 * CHUNK, 0, 0, 0)
    assert (c["evicted"], c["prefix_broken"], c["never_stored"]) == (2 * CHUNK, CHUNK, 0)
    never_stored = {name: by_request[name]["never_stored"] for name in "abd"}
    assert never_stored == {"a": 3 * CHUNK, "b": 3 * CHUNK, "d": 2 * CHUNK}


def test_occupancy_takes_the_tier_from_the_same_rule(backend: Backend):
    columns, rows = run_named(backend, "evictions/occupancy")
    assert {(row[columns.index("backend")], row[columns.index("tier")]) for row in rows} == {
        ("lmcache.local_cpu", "cpu")
    }
    assert sum(row[columns.index("evicted")] for row in rows) >= 2


def test_pages_stored_past_the_prompt_are_not_prompt_pages(backend: Backend):
    (request,) = explain(backend, "d")
    assert request.prompt_tokens == 2 * CHUNK
    assert [(page.token_start, page.cause) for page in request.pages] == [
        (0, Cause.NEVER_STORED),
        (CHUNK, Cause.NEVER_STORED),
    ]


def test_an_eviction_proves_a_store_the_sample_left_out(sampled: Backend):
    _, stored = sampled.query("SELECT DISTINCT request_id FROM pages WHERE op = 'store' ORDER BY 1")
    assert stored == [("b",), ("c",)]
    (request,) = explain(sampled, "c")
    assert [page.cause for page in request.pages] == [Cause.EVICTED, Cause.EVICTED, Cause.NEVER_STORED]
    assert request.pages[0].producer is None  # the store itself is not in the traces
    assert request.pages[0].eviction().startswith("capacity from cpu of r1 (lmcache.local_cpu)")
    assert request.notes == [
        "2 evicted page(s) have no store in these traces (the eviction proves one):"
        " the store was not recorded (a sampled replica) or its span was lost",
        "r1 records a share of its requests (sample rate 0.5, docs/design.md section 3.10):"
        " a store by a request it did not record is not in these traces",
    ]
    _, rates = sampled.query("SELECT DISTINCT sample_rate FROM replicas")
    assert rates == [(0.5,)]


def test_the_table_collapses_runs_and_names_each_causes_remedy(traces: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["explain", str(traces), "c"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "evicted" in line or "prefix_broken" in line]
    # Pages 0 and 1 are one row, a range of tokens; page 2 another.
    assert any(line.split()[:2] == ["0-1", "│"] and "0-512" in line and "evicted" in line for line in rows)
    assert any("512-768" in line and "prefix_broken" in line for line in rows)
    assert REMEDIES[Cause.EVICTED][:40] in out and REMEDIES[Cause.PREFIX_BROKEN][:40] in out
    assert main(["explain", str(traces), "c", "--format", "json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3  # JSON stays one record per page


def test_a_wrong_replica_is_told_which_served_the_request(traces: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["explain", str(traces), "c", "--replica", "r9"]) == 2
    assert capsys.readouterr().err == "kvaudit explain: error: request 'c' was not served by r9; it was by: r1\n"


def test_a_lookup_without_pages_says_what_is_known(traces: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["explain", str(traces), "e"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("request e on r1: 1 lookup(s) of 768 tokens, 0 hit;") and "no page to explain" in out
