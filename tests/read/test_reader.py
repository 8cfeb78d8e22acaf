"""Reading trace files: malformed input is reported line by line, good lines are kept."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kvaudit.cli import main
from kvaudit.contract import Hook, Op, Outcome
from kvaudit.emit.setup import setup_emitter
from kvaudit.read import files, reader
from kvaudit.read.files import expand_paths
from kvaudit.read.open import open_store
from kvaudit.read.store import TraceStore

from ..support.hostile import with_trace_id
from ..support.pages import KV, full_page


def _good_file(path: Path, replica: str = "r1", spans: int = 3) -> list[bytes]:
    emitter = setup_emitter(replica, f"file:{path}", engine="vllm", kv=KV, export_delay_s=0.01)
    for n in range(spans):
        with emitter.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id=f"q{n}") as op:
            op.add_page(full_page(f"{n:064x}", n))
            op.end(Outcome.HIT)
        emitter.flush()  # one line per span, so lines can be broken one at a time
    emitter.shutdown()
    return path.read_bytes().splitlines(keepends=True)


def test_every_bad_line_is_named_and_good_lines_are_kept(tmp_path: Path):
    lines = _good_file(tmp_path / "good.jsonl")
    assert len(lines) == 3
    bad = tmp_path / "bad.jsonl"
    wrong_schema = json.loads(lines[0])
    for kv in wrong_schema["resourceSpans"][0]["resource"]["attributes"]:
        if kv["key"] == "kvaudit.schema":
            kv["value"] = {"intValue": "99"}
    bad.write_bytes(
        lines[0]
        + b"this is not json\n"
        + b'{"resourceSpans": "nope"}\n'
        + json.dumps(wrong_schema).encode()
        + b"\n"
        + lines[1]
        + b"\n"
        + lines[2][: len(lines[2]) // 2]  # a writer killed mid-line
    )
    store = TraceStore([bad])
    store.refresh()
    _, errors = store.query("SELECT line, reason FROM read_errors ORDER BY line")
    assert [line for line, _ in errors] == [2, 3, 4, 7]
    assert "invalid JSON" in errors[0][1]
    assert "not OTLP trace data" in errors[1][1]
    assert "unknown kvaudit schema version 99" in errors[2][1]
    assert "truncated last line" in errors[3][1]
    _, pages = store.query("SELECT line, request_id FROM pages ORDER BY line")
    assert pages == [(1, "q0"), (5, "q1")]


def test_base64_ids_and_numeric_int64s_are_accepted(tmp_path: Path):
    [line, *_] = _good_file(tmp_path / "good.jsonl", spans=1)
    data = json.loads(line)
    span = data["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    hex_trace = span["traceId"]
    span["traceId"] = base64.b64encode(bytes.fromhex(hex_trace)).decode()
    span["spanId"] = base64.b64encode(bytes.fromhex(span["spanId"])).decode()
    span["startTimeUnixNano"] = int(span["startTimeUnixNano"])
    for event in span["events"]:
        for kv in event["attributes"]:
            if "intValue" in kv["value"]:
                kv["value"]["intValue"] = int(kv["value"]["intValue"])
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps(data) + "\n")
    store = TraceStore([other])
    store.refresh()
    _, [(trace_id, token_end, shape)] = store.query("SELECT trace_id, token_end, shape FROM pages")
    assert trace_id == hex_trace and token_end == 32 and shape == [2, 2, 32, 64]


def test_incremental_refresh_reads_only_appended_complete_lines(tmp_path: Path):
    lines = _good_file(tmp_path / "src.jsonl")
    growing = tmp_path / "growing.jsonl"
    growing.write_bytes(lines[0] + lines[1][:100])
    store = TraceStore([tmp_path / "growing*.jsonl"])
    assert store.refresh(final=False).pages.num_rows == 1
    with growing.open("ab") as f:
        f.write(lines[1][100:] + lines[2])
    added = store.refresh(final=False)
    assert added.pages.num_rows == 2 and added.errors.num_rows == 0
    _, rows = store.query("SELECT line FROM pages ORDER BY line")
    assert rows == [(1,), (2,), (3,)]
    (tmp_path / "growing-2.jsonl").write_bytes(with_trace_id(lines[0], "another span"))
    assert store.refresh(final=False).pages.num_rows == 1


# Rows held as Arrow (the default), and inserted into DuckDB's tables (a live store).
DATABASES = pytest.mark.parametrize("database", [None, ":memory:"], ids=["arrow", "duckdb"])


@DATABASES
def test_a_cursor_in_another_thread_sees_what_each_refresh_adds(tmp_path: Path, database: str | None):
    lines = _good_file(tmp_path / "src.jsonl")
    growing = tmp_path / "growing.jsonl"
    growing.write_bytes(lines[0])
    store = TraceStore([growing], database)
    cursor = store.cursor()  # the TUI audits through one, in its worker thread
    pending = store.con.execute("SELECT * FROM pages")  # a result left unread: the next refresh ends it
    pending.fetchone()
    with ThreadPoolExecutor(1) as worker:
        for n, line in enumerate(lines, start=1):
            if n > 1:
                with growing.open("ab") as f:
                    f.write(line)
            store.refresh()
            assert worker.submit(cursor.query, "SELECT count(*) FROM pages").result()[1] == [(n,)]
            assert store.query("SELECT count(*) FROM pages")[1] == [(n,)]
    cursor.close()
    store.close()


@DATABASES
def test_a_read_that_fails_keeps_what_it_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database: str | None):
    _good_file(tmp_path / "a.jsonl")
    _good_file(tmp_path / "b.jsonl", replica="r2")
    monkeypatch.setattr(files, "SMALL_BYTES", 0)  # a task per file
    store = TraceStore([tmp_path], database)
    real_read = reader.read_task

    def failing(pieces: list[files.Piece], *args: object) -> object:
        if pieces[0].path.endswith("b.jsonl"):
            raise RuntimeError("a fault in the reader")
        return real_read(pieces, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(reader, "read_task", failing)
    with pytest.raises(RuntimeError):
        store.refresh()
    assert store.query("SELECT DISTINCT replica FROM pages")[1] == [("r1",)]  # committed, not rolled back
    monkeypatch.setattr(reader, "read_task", real_read)
    store.refresh()  # b.jsonl from its start, a.jsonl not again
    assert store.query("SELECT replica, count(*) FROM pages GROUP BY ALL ORDER BY 1")[1] == [("r1", 3), ("r2", 3)]


def test_paths_that_match_nothing_are_named(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        expand_paths([tmp_path / "nothing-here"])
    assert expand_paths([tmp_path / "*.jsonl"]) == []


def test_cli_sql_formats_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    _good_file(tmp_path / "t.jsonl")
    assert main(["sql", str(tmp_path), "SELECT request_id, bytes FROM pages ORDER BY 1", "--format", "json"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in out] == [{"request_id": f"q{n}", "bytes": 16384} for n in range(3)]
    assert main(["sql", str(tmp_path), "SELECT count(*) AS n FROM spans", "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == ["n", "3"]
    assert main(["sql", str(tmp_path / "missing"), "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing: no such file or directory" in err
    assert main(["sql", str(tmp_path), "SELECT nope FROM pages"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope" in err


def test_ingest_then_query_the_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    _good_file(tmp_path / "t.jsonl")
    db = tmp_path / "out.duckdb"
    assert main(["ingest", str(tmp_path / "t.jsonl"), "-o", str(db), "-q"]) == 0
    assert "3 page descriptors" in capsys.readouterr().out
    store = open_store([str(db)])
    _, [(n,)] = store.query("SELECT count(*) FROM pages")
    assert n == 3
    assert main(["sql", str(db), "SELECT count(*) FROM replicas", "--format", "csv"]) == 0
    assert capsys.readouterr().out.split()[-1] == "1"
    not_a_db = tmp_path / "x.duckdb"
    not_a_db.write_text("hello")
    assert main(["sql", str(not_a_db), "SELECT 1"]) == 2
    assert "x.duckdb" in capsys.readouterr().err


def test_every_command_has_help_with_an_example(capsys: pytest.CaptureFixture[str]):
    from kvaudit.commands import SUMMARIES

    for name in SUMMARIES:
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        assert exit_info.value.code == 0
        assert "Example:" in capsys.readouterr().out
