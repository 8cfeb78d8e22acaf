"""One row per span identity: a span read again (an OTLP retry after a receiver restart, a
file collected twice) is read once (kvaudit.read.span_identity)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvaudit.cli import main
from kvaudit.read import span_identity
from kvaudit.read.open import open_ingested, open_store
from kvaudit.read.store import TraceStore

from ..support.hostile import good_lines

LINES = 4


def _counts(store: TraceStore) -> tuple[int, int, int]:
    _, [row] = store.query(
        "SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM pages),"
        " (SELECT count(DISTINCT (trace_id, span_id)) FROM spans)"
    )
    return row


def test_a_batch_sent_again_is_read_once(tmp_path: Path) -> None:
    lines = good_lines(LINES)
    # The receiver wrote batch 2, was killed before its response, and the exporter sent it again.
    (tmp_path / "r1.jsonl").write_bytes(b"".join([*lines[:3], lines[1], lines[3]]))
    store = TraceStore([tmp_path])
    added = store.refresh()
    assert (added.spans.num_rows, added.pages.num_rows) == (LINES, LINES)
    assert _counts(store) == (LINES, LINES, LINES)
    assert store.identities.repeats == 1
    # The first copy is the one kept.
    _, lines_kept = store.query("SELECT line FROM pages ORDER BY line")
    assert [line for (line,) in lines_kept] == [1, 2, 3, 5]


def test_a_file_collected_twice_adds_nothing(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "r1.jsonl").write_bytes(b"".join(good_lines(LINES)))
    store = TraceStore([tmp_path])
    store.refresh(final=False)
    shutil.copy(tmp_path / "a" / "r1.jsonl", tmp_path / "r1-copy.jsonl")
    again = store.refresh(final=False)
    assert (again.spans.num_rows, again.pages.num_rows) == (0, 0)
    assert _counts(store) == (LINES, LINES, LINES)


def test_a_repeat_past_what_is_remembered_is_kept_once_by_the_views(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows held as Arrow remember a bounded set of identities; a store in a database forgets none."""
    monkeypatch.setattr(span_identity, "REMEMBERED", 2)
    (tmp_path / "r1.jsonl").write_bytes(b"".join(good_lines(LINES)))
    (tmp_path / "r1-copy.jsonl").write_bytes(b"".join(good_lines(LINES)))
    for database in (None, ":memory:", str(tmp_path / "traces.duckdb")):
        store = TraceStore([tmp_path / "r1.jsonl", tmp_path / "r1-copy.jsonl"], database)
        store.refresh()
        assert store.identities.forgot == (database is None)
        assert store.identities.repeats == (0 if database is None else LINES)  # dropped as read
        assert _counts(store) == (LINES, LINES, LINES)
        _, files = store.query("SELECT DISTINCT file FROM pages")
        assert len(files) == 1  # the pages of one copy of each span: here, of the first file by name
        _, [(view,)] = store.query("SELECT sql FROM duckdb_views() WHERE view_name = 'pages'")
        assert ("QUALIFY" in view) == (database is None)
        store.close()
    # More spans than are remembered, none twice: rows read once and queried after need no window.
    store = TraceStore([tmp_path / "r1.jsonl"])
    store.refresh()
    assert store.identities.forgot
    _, [(view,)] = store.query("SELECT sql FROM duckdb_views() WHERE view_name = 'pages'")
    assert "QUALIFY" not in view


def test_ingest_takes_the_database_spans_as_read(tmp_path: Path) -> None:
    traces, database = tmp_path / "traces", str(tmp_path / "traces.duckdb")
    traces.mkdir()
    (traces / "r1.jsonl").write_bytes(b"".join(good_lines(LINES)))
    TraceStore([traces], database).refresh(final=False)
    for again in ("r1-collected-again.jsonl", "r1-collected-a-third-time.jsonl"):
        shutil.copy(traces / "r1.jsonl", traces / again)
        store = TraceStore([traces], database)
        added = store.refresh(final=False)
        assert (added.spans.num_rows, added.pages.num_rows) == (0, 0)
        _, [(spans, pages)] = store.query("SELECT (SELECT count(*) FROM kv_spans), (SELECT count(*) FROM kv_pages)")
        assert (spans, pages) == (LINES, LINES)
        store.close()
    assert "QUALIFY" not in _pages_view(database)  # every identity is kept: nothing to look for


def test_a_database_written_before_its_identities_were_kept(tmp_path: Path) -> None:
    """Its identities come from its spans when it is first opened; a span it holds twice (an
    older kvaudit let it in) is then kept once by its views, for good."""
    (tmp_path / "r1.jsonl").write_bytes(b"".join(good_lines(LINES)))
    database = str(tmp_path / "traces.duckdb")
    store = TraceStore([tmp_path / "r1.jsonl"], database)
    store.refresh()
    store.con.execute("INSERT INTO kv_spans SELECT * FROM kv_spans WHERE line = 1")  # the older kvaudit's repeat
    store.con.execute("INSERT INTO kv_pages SELECT * REPLACE (line + 100 AS line) FROM kv_pages WHERE line = 1")
    store.con.execute(f"DROP TABLE {span_identity.StoredIdentities.TABLE}")
    store.close()
    for _ in range(2):  # found when first opened; its views say so after
        store = TraceStore([tmp_path / "r1.jsonl"], database)
        assert _counts(store) == (LINES, LINES, LINES)
        store.close()
    assert "QUALIFY" in _pages_view(database)


def _pages_view(database: str) -> str:
    store = open_ingested(database)
    _, [(view,)] = store.query("SELECT sql FROM duckdb_views() WHERE view_name = 'pages'")
    store.close()
    return view


def test_spans_without_ids_are_all_kept(tmp_path: Path) -> None:
    line = good_lines(1)[0]
    no_ids = line.replace(b'"spanId":', b'"spanIdWas":')
    assert no_ids != line
    (tmp_path / "r1.jsonl").write_bytes(no_ids * 3)
    (tmp_path / "r1-copy.jsonl").write_bytes(no_ids * 3)
    for forgot in (False, True):  # dropped as read; kept by the views (see the test above)
        store = TraceStore([tmp_path])
        store.identities.forgot = forgot
        store.refresh()
        _, [(spans, pages)] = store.query("SELECT (SELECT count(*) FROM spans), (SELECT count(*) FROM pages)")
        assert (spans, pages) == (6, 6)


def test_a_parquet_ingest_adds_no_span_of_the_dataset_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    traces, dataset = tmp_path / "traces", tmp_path / "dataset"
    traces.mkdir()
    (traces / "r1.jsonl").write_bytes(b"".join(good_lines(LINES)))
    assert main(["ingest", str(traces), "--parquet", str(dataset), "-q"]) == 0
    shutil.copy(traces / "r1.jsonl", traces / "r1-collected-again.jsonl")
    assert main(["ingest", str(traces), "--parquet", str(dataset), "-q"]) == 0
    store = open_store([str(dataset)])
    assert _counts(store) == (LINES, LINES, LINES)
    _, [(view,)] = store.query("SELECT sql FROM duckdb_views() WHERE view_name = 'pages'")
    assert "QUALIFY" not in view  # every span was remembered: nothing to keep once at query time
    # More spans than are remembered: the views keep one row per span.
    monkeypatch.setattr(span_identity, "REMEMBERED", 2)
    shutil.copy(traces / "r1.jsonl", traces / "r1-collected-a-third-time.jsonl")
    assert main(["ingest", str(traces), "--parquet", str(dataset), "-q"]) == 0
    assert _counts(open_store([str(dataset)])) == (LINES, LINES, LINES)
