"""`kvaudit ingest --parquet`: the dataset read in place gives what the trace files give."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kvaudit.analyse.named_queries import load
from kvaudit.cli import main
from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
from kvaudit.durations import DAY_NS
from kvaudit.emit.setup import setup_emitter
from kvaudit.read.open import open_store
from kvaudit.read.store import TraceStore

from ..support.backend_fleet import named_queries, write_fleet
from ..support.pages import KV

VIEWS = ("spans", "pages", "replicas", "read_errors")


def rows(store: TraceStore, sql: str) -> list[tuple]:
    return sorted(store.query(sql)[1], key=repr)


@pytest.fixture
def fleet(tmp_path: Path) -> tuple[TraceStore, TraceStore, Path]:
    traces, dataset = tmp_path / "traces", tmp_path / "dataset"
    traces.mkdir()
    write_fleet(traces)
    (traces / "broken.jsonl").write_text("not json\n")
    assert main(["ingest", str(traces), "--parquet", str(dataset), "-q"]) == 0
    return open_store([str(traces)]), open_store([str(dataset)]), dataset


def test_views_and_queries_read_the_same_as_the_json_files(fleet):
    from_json, from_parquet, _ = fleet
    for view in VIEWS:
        assert (
            from_parquet.query(f"SELECT * FROM {view} LIMIT 0")[0]
            == from_json.query(f"SELECT * FROM {view} LIMIT 0")[0]
        )
        assert rows(from_parquet, f"SELECT * FROM {view}") == rows(from_json, f"SELECT * FROM {view}"), view
    for name in named_queries():
        # As sets of rows: a query that other queries include (store_events) has no order of its own.
        (columns, found), (expected_columns, expected) = from_parquet.query(load(name)), from_json.query(load(name))
        assert (columns, sorted(found, key=repr)) == (expected_columns, sorted(expected, key=repr)), name


def test_partitioned_by_day_and_replica_and_sorted_by_key(fleet):
    _, from_parquet, dataset = fleet
    [(day,)] = from_parquet.query("SELECT DISTINCT strftime(time, '%Y-%m-%d') FROM pages")[1]
    folders = sorted(p.relative_to(dataset / "pages").as_posix() for p in (dataset / "pages").glob("*/*"))
    assert folders == [f"day={day}/replica={replica}" for replica in ("r1", "r2", "r3")]
    for file in (dataset / "pages").rglob("*.parquet"):
        keys = pq.read_table(file, columns=["key"]).column("key").to_pylist()
        assert keys == sorted(keys, key=lambda key: (key is None, key or ""))  # no key last


def test_ingest_twice_adds_nothing_and_reads_empty_tables(tmp_path: Path):
    emitter = setup_emitter("r1", f"file:{tmp_path}/r1.jsonl", engine="vllm", kv=KV, export_delay_s=0.01)
    with emitter.operation(Op.LOOKUP, hook=Hook.VLLM_CONNECTOR, request_id="q", tokens_requested=32) as op:
        op.end(Outcome.MISS, tokens_hit=0)
    emitter.shutdown()
    dataset = tmp_path / "dataset"
    for _ in range(2):  # the second finds nothing new in the file
        assert main(["ingest", str(tmp_path / "r1.jsonl"), "--parquet", str(dataset), "-q"]) == 0
    store = open_store([str(dataset)])
    assert store.query("SELECT count(*) FROM spans")[1] == [(1,)]
    assert store.query("SELECT count(*) FROM pages")[1] == [(0,)]
    assert store.query("SELECT count(*) FROM replicas")[1] == [(1,)]


def test_ingest_needs_one_target(tmp_path: Path, capsys):
    with pytest.raises(SystemExit):
        main(["ingest", str(tmp_path), "-o", "x.duckdb", "--parquet", "dir"])
    assert "not allowed with" in capsys.readouterr().err


def test_a_column_the_files_lack_reads_as_null(fleet):
    """A dataset written before a column existed still opens; the column is NULL."""
    from_json, _, dataset = fleet
    for file in (dataset / "spans").rglob("*.parquet"):
        pq.write_table(pq.read_table(file).drop_columns(["tokens_hit"]), file)
    store = open_store([str(dataset)])
    assert store.query("SELECT count(*), count(tokens_hit) FROM spans")[1] == [
        (from_json.query("SELECT count(*) FROM spans")[1][0][0], 0)
    ]


def test_each_day_and_replica_is_written_apart_a_replica_unnamed_too(tmp_path: Path):
    """Pages of two days, and of a process that declared no replica id, each in their own
    partition (written one at a time: kvaudit.read.parquet), every file sorted by key."""
    emitter = setup_emitter("r1", f"file:{tmp_path}/r1.jsonl", engine="vllm", kv=KV, export_delay_s=0.01)
    for n, at_ns in enumerate((1_796_083_200 * 10**9 + 5, 1_796_083_200 * 10**9 + DAY_NS + 5)):
        with emitter.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id=f"q{n}", at_ns=at_ns) as op:
            for index in (1, 0):
                op.add_page(PageDescriptor(key=f"k{n}{index}", token_start=index * 32, token_end=index * 32 + 32))
    emitter.shutdown()
    line = (tmp_path / "r1.jsonl").read_text().splitlines()[0]
    line = line.replace('"service.instance.id"', '"not.the.replica"')
    # Spans of their own, not r1's read again (kvaudit.read.span_identity): the span ids reversed.
    line = re.sub(r'"spanId":"(\w+)"', lambda match: f'"spanId":"{match[1][::-1]}"', line)
    (tmp_path / "unnamed.jsonl").write_text(line + "\n")
    dataset = tmp_path / "dataset"
    assert (
        main(["ingest", str(tmp_path / "r1.jsonl"), str(tmp_path / "unnamed.jsonl"), "--parquet", str(dataset), "-q"])
        == 0
    )
    folders = sorted(str(f.parent.relative_to(dataset / "pages")) for f in (dataset / "pages").rglob("*.parquet"))
    unnamed = "replica=__HIVE_DEFAULT_PARTITION__"
    assert folders == [
        f"day={day}/{replica}" for day in ("2026-12-01", "2026-12-02") for replica in (unnamed, "replica=r1")
    ]
    for file in (dataset / "pages").rglob("*.parquet"):
        keys = pq.read_table(file, columns=["key"]).column("key").to_pylist()
        assert keys == sorted(keys, key=lambda key: (key is None, key or ""))  # no key last
    from_json, from_parquet = (
        open_store([str(tmp_path / "r1.jsonl"), str(tmp_path / "unnamed.jsonl")]),
        open_store([str(dataset)]),
    )
    assert rows(from_parquet, "SELECT replica, key FROM pages") == rows(from_json, "SELECT replica, key FROM pages")
