"""`kvaudit explain` on hand-built traces of restarted processes (docs/design.md section 7.1).

vLLM's offline ids ("0", "1", ...) restart with every process, so one request id on one
replica can name several requests: a lookup of an id that was fetched or stored since its
last lookup starts another request. Each is explained on its own, in the order of the
lookups, and `--trace-id` picks one.

In a container a restarted process often has the same pid: its resource differs from the
old one's only in `process.creation.time` (docs/design.md section 3.2), simulated here by
two emitters in one test process whose start times differ. A raw-pointer page stored
before the restart and fetched after it is another process's: rule KVA002 fires. Traces
written without the start time keep the old answer: the same pid and configuration are
one process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvaudit.analyse.audit import run_audit
from kvaudit.analyse.explain import explain
from kvaudit.analyse.named_queries import run_named
from kvaudit.backends import Backend, as_backend
from kvaudit.causes import Cause
from kvaudit.cli import main
from kvaudit.contract import Hook, Op, Outcome, PageDescriptor, Res
from kvaudit.emit import setup
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
    """Request id "0" served twice by replica r1, by a process and then by its restart with
    the same pid: the first time computed and stored in its CPU tier (pages with a raw
    address), the second time fetched from there."""
    folder = tmp_path_factory.mktemp("restarts")
    with pytest.MonkeyPatch.context() as patch:
        for name, started in (("first", "2026-12-07T10:00:00.000Z"), ("second", "2026-12-07T10:05:00.000Z")):
            patch.setattr(setup, "process_started", lambda started=started: started)
            emitter = setup_emitter("r1", f"file:{folder}/{name}.jsonl", kv=KV, export_delay_s=0.01)
            if name == "first":
                _lookup(emitter, "0")
                _store(emitter, "0")
            else:
                _lookup(emitter, "0", hit=PAGES)
                _fetch(emitter, "0")
            emitter.shutdown()
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


def _kva002(traces: Path) -> list:
    store = TraceStore([traces])
    store.refresh()
    try:
        return [finding for finding in run_audit(store) if finding.code == "KVA002"]
    finally:
        store.close()


def test_a_raw_pointer_stored_before_a_same_pid_restart_is_another_processs(traces: Path):
    store = TraceStore([traces])
    store.refresh()
    _, processes = store.query("SELECT DISTINCT pid, started FROM replicas ORDER BY started")
    store.close()
    assert [started for _, started in processes] == ["2026-12-07T10:00:00.000Z", "2026-12-07T10:05:00.000Z"]
    assert len({pid for pid, _ in processes}) == 1
    findings = _kva002(traces)
    assert len(findings) == PAGES
    assert {(f.severity, f.producer, f.message) for f in findings} == {
        ("critical", "r1", "fetched page refers to an address local to another process of replica r1")
    }


def test_traces_without_a_start_time_keep_a_same_pid_restart_one_process(traces: Path, tmp_path: Path):
    for file in traces.glob("*.jsonl"):
        lines = []
        for line in file.read_text().splitlines():
            data = json.loads(line)
            for resource_spans in data["resourceSpans"]:
                attributes = resource_spans["resource"]["attributes"]
                attributes[:] = [a for a in attributes if a["key"] != Res.PROCESS_CREATION_TIME]
            lines.append(json.dumps(data))
        (tmp_path / file.name).write_text("\n".join(lines) + "\n")
    assert _kva002(tmp_path) == []
