"""`kvaudit explain` and the audit on hand-built traces of a hybrid model (docs/design.md section 7.2).

A hybrid model (Gemma 3: sliding-window and global layers) keeps one KV cache group per
kind of layer group, and each group holds a page of the same tokens. The engine drops a
sliding-window group's pages once they fall before the window: for a later request of the
same prefix they are `outside_window`, neither `evicted` nor `never_stored`, and not reuse
left on the table; the audit raises nothing for them. A sliding-window page inside the
window that was evicted stays `evicted`.

Replica r1, pages of 32 tokens, window 64 tokens. Request "a" (128 tokens) stores pages 0-3
of both groups; the sliding-window group's pages 0-1 are then evicted (dropped). Request
"b", the same 128 tokens, fetches and uses the full-attention group's pages 0-3 and the
sliding-window group's pages 2-3, its window (tokens 64-128). Then the sliding-window
group's page 3 is evicted too, and request "c", the same tokens, fetches nothing; request
"d" fetches all it can: the full-attention group's pages 0-3, the sliding-window group's page 2.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from kvaudit.analyse.audit import run_audit
from kvaudit.analyse.explain import explain
from kvaudit.analyse.named_queries import run_named
from kvaudit.backends import Backend, as_backend
from kvaudit.causes import MISSES, Cause
from kvaudit.cli import main
from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter
from kvaudit.read.store import TraceStore

from ..support.pages import KV, full_page

PAGES = 4  # of 32 tokens each
PROMPT = 32 * PAGES
WINDOW = 64
FULL, SLIDING = 0, 1
GROUPS = {FULL: ("full_attention", None), SLIDING: ("sliding_window", WINDOW)}


def _page(index: int, group: int, *, used: bool | None = None) -> PageDescriptor:
    kind, window = GROUPS[group]
    # No process-local address: the copy is portable, as vLLM's own is to its process.
    return msgspec.structs.replace(
        full_page(f"k{index}", index, used=used),
        address=None,
        kv_group=group,
        kv_group_kind=kind,
        sliding_window=window,
    )


def _lookup(emitter: Emitter, request_id: str, hits: dict[int, list[int]]) -> None:
    hit = sum(len(indices) for indices in hits.values())
    with emitter.operation(Op.LOOKUP, hook=Hook.VLLM_CONNECTOR, request_id=request_id, tokens_requested=PROMPT) as op:
        for group in GROUPS:
            for index in range(PAGES):
                op.add_page(_page(index, group))
        op.end(Outcome.HIT if hit else Outcome.MISS, tokens_hit=32 * len(hits.get(FULL, [])))


def _pages_op(emitter: Emitter, op_name: Op, request_id: str | None, pages: dict[int, list[int]], **kw) -> None:
    used = True if op_name == Op.FETCH else None
    with emitter.operation(op_name, hook=Hook.VLLM_CONNECTOR, request_id=request_id, backend="pool") as op:
        for group, indices in pages.items():
            for index in indices:
                op.add_page(_page(index, group, used=used))
        op.end(Outcome.HIT, **kw)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hybrid")
    emitter = setup_emitter("r1", f"file:{folder}/r1.jsonl", kv=KV, export_delay_s=0.01)
    every = list(range(PAGES))
    _lookup(emitter, "a", {})
    _pages_op(emitter, Op.STORE, "a", {FULL: every, SLIDING: every}, tokens_stored=PROMPT)
    _pages_op(emitter, Op.EVICT, None, {SLIDING: [0, 1]})
    _lookup(emitter, "b", {FULL: every, SLIDING: [2, 3]})
    _pages_op(emitter, Op.FETCH, "b", {FULL: every, SLIDING: [2, 3]}, tokens_hit=PROMPT)
    _pages_op(emitter, Op.EVICT, None, {SLIDING: [3]})
    _lookup(emitter, "c", {})
    _lookup(emitter, "d", {FULL: every, SLIDING: [2]})
    _pages_op(emitter, Op.FETCH, "d", {FULL: every, SLIDING: [2]}, tokens_hit=PROMPT)
    emitter.shutdown()
    return folder


@pytest.fixture(scope="module")
def backend(traces: Path) -> Iterator[Backend]:
    store = TraceStore([traces])
    store.refresh()
    yield as_backend(store)
    store.close()


def test_the_pages_carry_their_group_and_its_kind(backend: Backend):
    _, rows = backend.query(
        "SELECT DISTINCT kv_group, kv_group_kind, sliding_window FROM pages WHERE op = 'store' ORDER BY kv_group"
    )
    assert [tuple(row) for row in rows] == [(FULL, "full_attention", None), (SLIDING, "sliding_window", WINDOW)]


def test_a_sliding_window_page_before_the_window_is_outside_window_not_evicted(backend: Backend):
    (request,) = explain(backend, "b")
    causes = {(page.kv_group, page.token_start // 32): page.cause for page in request.pages}
    assert causes == {
        **{(FULL, index): Cause.HIT_LOCAL for index in range(PAGES)},
        (SLIDING, 0): Cause.OUTSIDE_WINDOW,
        (SLIDING, 1): Cause.OUTSIDE_WINDOW,
        (SLIDING, 2): Cause.HIT_LOCAL,
        (SLIDING, 3): Cause.HIT_LOCAL,
    }
    assert {page.kv_group_kind for page in request.pages if page.kv_group == SLIDING} == {"sliding_window"}


def test_a_sliding_window_page_inside_the_window_that_was_evicted_stays_evicted(backend: Backend):
    (request,) = explain(backend, "c")
    causes = {page.token_start // 32: page.cause for page in request.pages if page.kv_group == SLIDING}
    assert causes == {0: Cause.OUTSIDE_WINDOW, 1: Cause.OUTSIDE_WINDOW, 2: Cause.PREFIX_BROKEN, 3: Cause.EVICTED}
    # The full-attention group's copies are all present: one of each token range counts.
    assert request.tokens_by_cause()[Cause.PREFIX_BROKEN] == PROMPT


def test_outside_window_is_ranked_right_after_rejected_and_is_no_miss():
    order = list(Cause)
    assert order.index(Cause.OUTSIDE_WINDOW) == order.index(Cause.REJECTED) + 1
    assert Cause.OUTSIDE_WINDOW not in MISSES


def test_pages_dropped_by_design_are_not_left_on_the_table(backend: Backend):
    (request,) = explain(backend, "b")
    # Each token range counts once: the full-attention group's page stands for it.
    assert request.hit_tokens == PROMPT and request.achievable_tokens == PROMPT
    assert request.tokens_by_cause()[Cause.OUTSIDE_WINDOW] == 0
    columns, rows = run_named(backend, "reuse_left_requests", {"kvaudit_request_id": "b"})
    (row,) = [dict(zip(columns, row)) for row in rows]
    assert (row["prompt_tokens"], row["hit_tokens"], row["achievable_tokens"], row["lost_tokens"]) == (
        PROMPT,
        PROMPT,
        PROMPT,
        0,
    )
    assert all(row[cause.value] == 0 for cause in MISSES)


def test_the_first_request_misses_every_page_its_lookup_needs(backend: Backend):
    (request,) = explain(backend, "a")
    # Before the window, a sliding-window page is not needed even by a cold request.
    assert [(page.kv_group, page.cause) for page in request.pages] == [(FULL, Cause.NEVER_STORED)] * PAGES + [
        (SLIDING, Cause.OUTSIDE_WINDOW),
        (SLIDING, Cause.OUTSIDE_WINDOW),
        (SLIDING, Cause.NEVER_STORED),
        (SLIDING, Cause.NEVER_STORED),
    ]
    # Counted once per token range: the prompt, not twice it.
    assert request.tokens_by_cause()[Cause.NEVER_STORED] == PROMPT


def test_the_audit_raises_nothing_for_pages_dropped_by_design(traces: Path):
    store = TraceStore([traces])
    store.refresh()
    try:
        assert run_audit(store) == []
    finally:
        store.close()


def test_the_table_names_the_group_and_the_remedy(traces: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["explain", str(traces), "b"]) == 0
    out = capsys.readouterr().out
    assert "outside_window (group 1, sliding_window)" in out
    assert "drops these by design" in out.replace("\n", " ")


def test_a_token_range_counts_as_missed_where_one_group_missed_it(backend: Backend):
    (request,) = explain(backend, "d")
    last = {page.kv_group: page.cause for page in request.pages if page.token_start == 3 * 32}
    assert last == {FULL: Cause.HIT_LOCAL, SLIDING: Cause.EVICTED}
    # The engine reuses tokens 96-128 only with both groups' pages: they count as evicted.
    assert request.hit_tokens == 3 * 32 and request.tokens_by_cause()[Cause.EVICTED] == 32
