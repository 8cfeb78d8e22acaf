"""queries/views.sql in a plain duckdb connection gives the columns and rows of kvaudit's own views."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

from kvaudit.analyse.named_queries import load
from kvaudit.contract import Hook, Op, PageDescriptor
from kvaudit.read.store import TraceStore

from ..support.fleet import Fleet, page
from ..support.reference_answers import tag_fetches

ORDER = {
    "spans": "file, line, span_id",
    "pages": "file, line, span_id, time_ns, key",
    "replicas": "replica, engine",
    "read_errors": "file, line",
}


def _view(con: Any, name: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Columns and rows of a view, resource_id replaced by the process it names (ids differ by design)."""
    processes = con.execute("SELECT resource_id, replica, engine, pid FROM replicas").fetchall()
    process = {rid: (replica, engine, pid) for rid, replica, engine, pid in processes}
    cursor = con.execute(f"SELECT * FROM {name} ORDER BY {ORDER[name]}")
    columns = [d[0] for d in cursor.description]
    rows = cursor.fetchall()
    if "resource_id" in columns:
        index = columns.index("resource_id")
        rows = [(*row[:index], process[row[index]], *row[index + 1 :]) for row in rows]
    return columns, rows


def test_views_sql_equals_the_store(trace_dir: Path, monkeypatch: pytest.MonkeyPatch):
    fleet = Fleet(trace_dir, monkeypatch)
    r1, r2 = fleet.replica("r1", max_pages_per_span=3), fleet.replica("r2", engine="lmcache")
    fleet.at(0).store(r1, [page("a", 0), page("b", 1, address=7), page("c", 2), page("d", 3)], "q1")
    bare = PageDescriptor(key="e", used=True, transfer="raw_ptr", address=0x7F00DEAD0000, shape=())
    fleet.at(1).fetch(r2, [page("a", 0, used=True), page("b", 1, used=False), bare], "q2", hook=Hook.LMCACHE_ENGINE)
    broken = r2.operation(Op.FETCH, hook=Hook.LMCACHE_ENGINE)
    broken.add_page("not a descriptor")  # type: ignore[arg-type]
    broken.end()  # a telemetry span reports the error
    fleet.open().close()
    tag_fetches(trace_dir, "workload", {"q2": "chat"})
    first = (trace_dir / "r1-vllm.jsonl").read_bytes().splitlines(keepends=True)[0]
    (trace_dir / "r1-vllm-again.jsonl").write_bytes(first)  # its spans on disk twice: read once by both
    with (trace_dir / "r1-vllm.jsonl").open("a") as f:
        f.write('not json\n{"resourceSpans": "nope"}\n{"resourceSpans": [')

    pattern = str(trace_dir / "*.jsonl")
    store = TraceStore([pattern], workers=1)
    store.refresh()
    shell = duckdb.connect()
    shell.execute("SET VARIABLE kvaudit_traces = ?", [pattern])
    shell.execute(load("views"))
    for name in ORDER:
        ours, theirs = _view(shell, name), _view(store.con, name)
        assert ours[0] == theirs[0], name
        if name == "read_errors":  # reasons are worded differently
            assert [row[:2] for row in ours[1]] == [row[:2] for row in theirs[1]]
        else:
            assert ours[1] == theirs[1], name
    assert len(_view(shell, "pages")[1]) == 6 and len(_view(shell, "read_errors")[1]) == 3
    [(attributes,)] = shell.execute("SELECT attributes FROM spans WHERE request_id = 'q2'").fetchall()
    assert attributes == {"workload": "chat"}
