"""Stores of bounded memory: one kept in a database file (`--store`) reads only what is new,
commits as it goes, and is held by one process at a time; a live command's spills to a
temporary directory of its own (kvaudit.read.store_file; docs/design.md section 3.9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import duckdb
import pytest

from kvaudit.cli import main
from kvaudit.commands.arguments import open_backend
from kvaudit.read.store import TraceStore
from kvaudit.simulator.engine import GIB, SimConfig, simulate

from ..support.hostile import good_lines, with_trace_id
from ..support.live_reads import append

PAGES = "SELECT count(*) FROM pages"


def _sql(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["sql", "--format", "csv", *args]) == 0
    return capsys.readouterr().out.splitlines()[-1]


def test_the_next_command_reads_only_the_lines_appended_since(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    traces, store = tmp_path / "traces", str(tmp_path / "store.duckdb")
    traces.mkdir()
    lines = good_lines(12)
    append(traces / "r1.jsonl", lines[:8])
    assert _sql(capsys, "--store", store, str(traces), PAGES) == "8"
    kept = TraceStore([traces], store)
    assert kept.pending_bytes() == 0  # where it stopped is kept with the rows
    kept.close()
    assert _sql(capsys, "--store", store, str(traces), PAGES) == "8"  # nothing read twice
    append(traces / "r1.jsonl", lines[8:])
    kept = TraceStore([traces], store)
    assert kept.pending_bytes() == sum(map(len, lines[8:]))
    kept.close()
    assert _sql(capsys, "--store", store, str(traces), PAGES) == "12"
    assert _sql(capsys, str(traces), PAGES) == "12"  # the files themselves, read whole


def test_explain_through_a_store_answers_as_over_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    fleet = SimConfig(replicas=2, pool_bytes=8 * GIB, local_bytes=4 * GIB, router="random", rate=1.0, duration_s=20)
    traces = simulate(fleet, tmp_path / "sim").files[0].parent
    store = str(tmp_path / "store.duckdb")
    request = _sql(capsys, str(traces), "SELECT request_id FROM spans WHERE op = 'fetch' ORDER BY start_ns LIMIT 1")
    answers = []
    for args in ([str(traces)], ["--store", store, str(traces)], ["--store", store, str(traces)]):
        assert main(["explain", *args, request, "--format", "json"]) == 0
        answers.append([json.loads(line) for line in capsys.readouterr().out.splitlines()])
    assert answers[0] and answers[0] == answers[1] == answers[2]


_KILLED_MID_REFRESH = """
    import os, signal, sys
    import kvaudit.read.store as store_module
    store_module.COMMIT_ROWS = 1  # a commit before every part after the first
    store = store_module.TraceStore([sys.argv[1]], sys.argv[2])
    parts = []

    def killed_at_the_third(tables):
        parts.append(tables)
        if len(parts) == 3:  # its rows are inserted, not committed: lost with the process
            os.kill(os.getpid(), signal.SIGKILL)

    store.refresh(final=False, added=killed_at_the_third)
"""


def test_a_refresh_killed_midway_keeps_what_it_committed_and_reads_the_rest_once(tmp_path: Path):
    traces, store = tmp_path / "traces", str(tmp_path / "store.duckdb")
    traces.mkdir()
    lines = good_lines(24)
    for replica in range(4):  # files over a MiB each: a part of the read each
        spans = (with_trace_id(line, f"{replica}-{copy}") for copy in range(60 + replica) for line in lines)
        (traces / f"r{replica}.jsonl").write_bytes(b"".join(spans))
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(_KILLED_MID_REFRESH), str(traces), store])
    assert child.returncode == -9
    kept = TraceStore([traces], store)
    [(pages,)] = kept.query(PAGES)[1]
    assert 0 < pages < 24 * (60 + 61 + 62 + 63)  # the parts committed before the kill
    kept.refresh(final=False)
    [(total, distinct)] = kept.query("SELECT count(*), count(DISTINCT (trace_id, request_id)) FROM pages")[1]
    assert total == distinct == 24 * (60 + 61 + 62 + 63)
    kept.close()


def test_a_store_held_by_another_process_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    traces, store = tmp_path / "traces", tmp_path / "store.duckdb"
    traces.mkdir()
    append(traces / "r1.jsonl", good_lines(2))
    duckdb.connect(str(store)).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, sys; c = duckdb.connect({str(store)!r}); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert main(["sql", "--store", str(store), str(traces), PAGES]) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert str(store) in line and f"PID {holder.pid}" in line
    finally:
        holder.communicate("")


def test_a_live_commands_spill_directory_is_its_own_and_removed_when_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # as TMPDIR sets it
    (tmp_path / "tmp").mkdir()
    append(tmp_path / "r1.jsonl", good_lines(3))
    backend = open_backend(None, [str(tmp_path / "r1.jsonl")], live=True)
    backend.refresh(final=False)
    assert backend.query(PAGES)[1] == [(3,)]
    [directory] = (tmp_path / "tmp").iterdir()
    assert (directory / "live.duckdb").is_file()  # the rows in a file: DuckDB compresses those, not memory's
    assert backend.query("SELECT current_setting('temp_directory')")[1] == [(str(directory),)]
    assert backend.query("SELECT current_setting('memory_limit')")[1] == [("1.0 GiB",)]
    for connection in (backend, backend.cursor()):  # the TUI's rules run on a cursor of its own
        connection.sandboxed("SELECT count(*) FROM pages", timeout_s=10, max_rows=1)  # under a rule's limits
        assert backend.query("SELECT current_setting('memory_limit')")[1] == [("1.0 GiB",)]  # the budget back
    backend.close()
    assert not directory.exists()


def test_store_names_and_inputs_it_does_not_take(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    append(tmp_path / "r1.jsonl", good_lines(1))
    assert main(["sql", "--store", str(tmp_path / "s.db"), str(tmp_path), PAGES]) == 2
    assert "--store" in capsys.readouterr().err
    assert main(["sql", "--store", str(tmp_path / "s.duckdb"), str(tmp_path / "x.duckdb"), PAGES]) == 2
    assert "give trace files" in capsys.readouterr().err


def test_a_kept_store_never_reads_a_line_its_writer_has_not_finished(tmp_path: Path):
    traces, store = tmp_path / "traces", str(tmp_path / "store.duckdb")
    traces.mkdir()
    line = good_lines(1)[0]
    append(traces / "r1.jsonl", [line[:100]])  # a writer in the middle of its line
    kept = TraceStore([traces], store)
    kept.refresh(final=True)  # as a one-shot read asks (`tui --snapshot`)
    assert kept.query("SELECT (SELECT count(*) FROM pages), (SELECT count(*) FROM read_errors)")[1] == [(0, 0)]
    kept.close()
    append(traces / "r1.jsonl", [line[100:]])
    kept = TraceStore([traces], store)
    kept.refresh(final=True)
    assert kept.query("SELECT (SELECT count(*) FROM pages), (SELECT count(*) FROM read_errors)")[1] == [(1, 0)]
    kept.close()


def _live_store_process(tmp: Path) -> subprocess.Popen[str]:
    """A process holding a live command's store in `tmp` (as TMPDIR sets it), once it says so."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from kvaudit.read.store_file import open_bounded_store;"
            " store = open_bounded_store([], None); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_the_directory_of_a_live_command_killed_outright_is_removed_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    killed, living = _live_store_process(tmp), _live_store_process(tmp)
    try:
        directories = {path.name for path in tmp.iterdir()}
        assert len(directories) == 2
        killed.kill()  # SIGKILL: nothing of the process runs to remove its directory
        killed.wait()
        assert {path.name for path in tmp.iterdir()} == directories
        (tmp / "kvaudit-store-not-ours").mkdir()  # no owner file: not known to be left, so kept
        append(tmp_path / "r1.jsonl", good_lines(1))
        backend = open_backend(None, [str(tmp_path / "r1.jsonl")], live=True)
        try:
            left = {path.name for path in tmp.iterdir()}
            assert len(left & directories) == 1 and "kvaudit-store-not-ours" in left
            assert len(left) == 3  # the living one's, the one without an owner, and the new one
        finally:
            backend.close()
    finally:
        living.communicate("")
