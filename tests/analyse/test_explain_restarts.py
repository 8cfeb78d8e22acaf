"""`kvaudit explain` on hand-built traces of restarted processes (docs/design.md section 7.1).

vLLM's offline ids ("0", "1", ...) restart with every process, so one request id on one
replica can name several requests: a lookup of an id that was fetched or stored since its
last lookup starts another request. Each is explained on its own, in the order of the
lookups, and `--trace-id` picks one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvaudit.analyse.explain import explain
from kvaudit.analyse.named_queries import run_named
from kvaudit.backends import Backend, as_backend
from kvaudit.causes import Cause
from kvaudit.cli import main
from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter
from kvaudit.read.store import TraceStore

from ..support.pages import KV, full_page

PAGES = 2  # of 32 tokens each


def _lookup(emitter: Emitter, request_id: str, hit: int = 0) -> None:
    """A lookup of the prompt's pages, the first `hit` of them a hit."""
    with emitter.operation(Op.LOOKUP, hook=Hook.VLLM_CONNECTOR, request_id=request_id, tokens_requested=64) as op:
        for index in range(PAGES):
            op.add_page(PageDescriptor(key=f"k{index}", token_start=32 * index, token_end=32 * (index + 1)))
        op.end(Outcome.HIT if hit else Outcome.MISS, tokens_hit=32 * hit)


def _store(emitter: Emitter, request_id: str) -> None:
    with emitter.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id=request_id, backend="pool") as op:
        for index in range(PAGES):
            op.add_page(full_page(f"k{index}", index))
        op.end(Outcome.HIT, tokens_stored=32 * PAGES)


def _fetch(emitter: Emitter, request_id: str) -> None:
    with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id=request_id, backend="pool") as op:
        for index in range(PAGES):
            op.add_page(full_page(f"k{index}", index, used=True))
        op.end(Outcome.HIT, tokens_hit=32 * PAGES)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Request id "0" served twice by replica r1, by a process and then by its restart:
    the first time computed and stored in its CPU tier, the second time fetched from there."""
    folder = tmp_path_factory.mktemp("restarts")
    first = setup_emitter("r1", f"file:{folder}/first.jsonl", kv=KV, export_delay_s=0.01)
    _lookup(first, "0")
    _store(first, "0")
    first.shutdown()
    second = setup_emitter("r1", f"file:{folder}/second.jsonl", kv=KV, export_delay_s=0.01)
    _lookup(second, "0", hit=PAGES)
    _fetch(second, "0")
    second.shutdown()
    return folder


@pytest.fixture(scope="module")
def backend(traces: Path) -> Iterator[Backend]:
    store = TraceStore([traces])
    store.refresh()
    yield as_backend(store)
    store.close()


def test_a_reused_id_is_explained_as_one_request_per_lookup(backend: Backend):
    first, second = explain(backend, "0")
    assert first.lookup_ns < second.lookup_ns
    assert [page.cause for page in first.pages] == [Cause.NEVER_STORED] * PAGES
    assert [(page.cause, page.producer) for page in second.pages] == [(Cause.HIT_LOCAL, "r1")] * PAGES
    for request in (first, second):
        assert "request id 0 names 2 requests on r1" in request.notes[0]


def test_reuse_left_counts_each_request(backend: Backend):
    columns, rows = run_named(backend, "reuse_left_requests", {"kvaudit_request_id": "0"})
    totals = sorted((row[columns.index("lookup_ns")], row[columns.index("hit_tokens")]) for row in rows)
    assert [hit for _, hit in totals] == [0, 32 * PAGES]


def test_the_trace_id_picks_one_of_them(traces: Path, capsys: pytest.CaptureFixture[str]):
    store = TraceStore([traces])
    store.refresh()
    _, rows = store.query("SELECT trace_id FROM spans WHERE op = 'lookup' ORDER BY start_ns")
    store.close()
    later = rows[1][0]
    assert main(["explain", str(traces), "0", "--trace-id", later]) == 0
    out = capsys.readouterr().out
    assert out.count("request 0 on r1") == 1 and "hit_local" in out and "never_stored" not in out
    assert "names 2 requests" not in out
