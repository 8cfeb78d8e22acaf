"""Hostile input never fails a read: every line kvaudit cannot type is a named `file:line:
reason` row of `read_errors`, every other line is kept, and every command that reads
traces works on a directory holding such lines (the regressions of issue 17).

The corpus is `tests/support/hostile.py`; hypothesis adds random byte-level corruption of good
files and random valid-OTLP-but-hostile values.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.cli import main
from kvaudit.commands.metrics_server import serve
from kvaudit.read import files, reader
from kvaudit.read.store import TraceStore

from ..support import hostile
from ..support.exporter import caught_up
from ..support.hostile import CASES, LINES, good_lines


def _read(paths: list[Path], scan: bool | None = None, monkeypatch: pytest.MonkeyPatch | None = None) -> TraceStore:
    if scan is not None and monkeypatch is not None:
        monkeypatch.setattr(reader, "SCAN_MIN_BYTES", 0 if scan else 1 << 62)
    store = TraceStore(paths)
    store.refresh()
    return store


@pytest.mark.parametrize("scan", [True, False], ids=["scanner", "msgspec"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_each_hostile_line_is_named_and_the_good_ones_kept(
    case: hostile.Case, scan: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path = case.write(tmp_path)
    store = _read([path], scan, monkeypatch)
    assert store.query("SELECT file, line, reason FROM read_errors")[1] == [(str(path), *case.error)]
    good = [line for line in range(1, LINES + 1) if line != case.error[0]] if case.good_pages else []
    assert store.query("SELECT line FROM pages ORDER BY line")[1] == [(line,) for line in good]


def test_a_line_past_the_length_limit_is_named_and_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    lines = good_lines()
    limit = max(map(len, lines)) + 10
    monkeypatch.setattr(files, "MAX_LINE_BYTES", limit)
    monkeypatch.setattr(files, "CHUNK_BYTES", 3 * limit)  # lines past the limit within a chunk, and across chunk ends
    monkeypatch.setattr(files, "SMALL_BYTES", 0)
    huge = b'{"resourceSpans":[' + b" " * (4 * limit) + b"]}\n"
    path = tmp_path / "huge.jsonl"
    path.write_bytes(lines[0] + huge + lines[1] + huge[: limit + 5] + b"\n" + lines[2] + huge[:-1])
    store = _read([path])
    too_long = "line of {} bytes is longer than the {}-byte limit (KVAUDIT_MAX_LINE_BYTES): not read"
    assert store.query("SELECT line, reason FROM read_errors ORDER BY line")[1] == [
        (2, too_long.format(len(huge) - 1, limit)),
        (4, too_long.format(limit + 5, limit)),
        (6, too_long.format(len(huge) - 1, limit)),
    ]
    assert store.query("SELECT line FROM pages ORDER BY line")[1] == [(1,), (3,), (5,)]


def test_a_file_that_cannot_be_read_is_named_and_the_others_are_read(tmp_path: Path):
    good = tmp_path / "good.jsonl"
    good.write_bytes(b"".join(good_lines()))
    vanished = tmp_path / "vanished.jsonl"  # listed, then removed before it was read
    (tmp_path / "a-directory.jsonl").mkdir()
    store = TraceStore([good])
    tables = reader.read_files([str(vanished), str(good), str(tmp_path / "a-directory.jsonl")], store.cursors)
    assert tables.errors.to_pylist() == [
        {"file": str(vanished), "line": 0, "reason": "cannot read the file: No such file or directory"},
        {
            "file": str(tmp_path / "a-directory.jsonl"),
            "line": 0,
            "reason": "cannot read the file: a directory, not a trace file",
        },
    ]
    assert tables.pages.num_rows == LINES
    again = reader.read_files([str(vanished), str(good)], store.cursors)  # a live store: named once
    assert again.errors.num_rows == 0 and again.pages.num_rows == 0


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root's setpriv")
def test_a_file_without_read_permission_is_named(tmp_path: Path):
    """Root reads every file: the read runs without root's permission to override file modes."""
    (tmp_path / "good.jsonl").write_bytes(b"".join(good_lines()))
    (tmp_path / "secret.jsonl").write_bytes(b"".join(good_lines()))
    (tmp_path / "secret.jsonl").chmod(0o200)
    query = "SELECT (SELECT count(*) FROM pages), (SELECT min(file || ':' || line || ': ' || reason) FROM read_errors)"
    caps = "-dac_override,-dac_read_search"
    sql = [str(tmp_path), query, "--format", "csv"]
    done = subprocess.run(
        ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", sys.executable, "-m", "kvaudit", "sql", *sql],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"{LINES},{tmp_path}/secret.jsonl:0: cannot read the file: Permission denied"
    assert "Traceback" not in done.stderr


# --- every command that reads traces, on a directory of the whole corpus ----------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("hostile") / "traces"
    hostile.write_corpus(directory)
    return directory


COMMANDS = {
    "sql": (["sql", "{dir}", "SELECT count(*) AS pages FROM pages", "--format", "csv"], 0),
    "audit": (["audit", "{dir}", "--format", "json"], 1),  # the read errors are KVA007 warnings
    "alerts eval": (["alerts", "eval", "{dir}", "--format", "json"], 1),  # the read errors fire an alert
    "alerts watch": (["alerts", "watch", "{dir}", "--once", "--state", "{tmp}/s.json", "--notify", "file:{tmp}/n"], 0),
    "tui --snapshot": (["tui", "{dir}", "--snapshot", "--window", "all"], 0),
    "ingest": (["ingest", "{dir}", "-o", "{tmp}/t.duckdb", "-q"], 0),
}


# The issue's own reproduction: one span with an unsigned 64-bit start time, one line whose
# `intValue` is "sixteen", in a directory of good lines; and the whole corpus.
ISSUE_CASES = [case for case in CASES if case.name in ("start-time-unsigned", "span-int-word")]


@pytest.fixture(scope="module")
def two_bad_lines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("issue17") / "traces"
    directory.mkdir()
    for case in ISSUE_CASES:
        case.write(directory)
    return directory


@pytest.mark.parametrize("traces", ["two_bad_lines", "corpus"])
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_names_each_hostile_line_and_reads_the_rest(
    command: str, traces: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
):
    directory: Path = request.getfixturevalue(traces)
    cases = ISSUE_CASES if traces == "two_bad_lines" else CASES
    argv, status = COMMANDS[command]
    assert main([arg.format(dir=directory, tmp=tmp_path) for arg in argv]) == status
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    named = {f"{directory / (case.name + '.jsonl')}:{case.error[0]}: {case.error[1]}" for case in cases}
    if command in ("audit", "tui --snapshot"):  # named as KVA007 findings, with their file and line
        findings = (
            [json.loads(line) for line in out.splitlines()] if command == "audit" else json.loads(out)["findings"]
        )
        prefix = "unreadable trace line: "
        shown = {
            f"{f['file']}:{f['line']}: {f['message'].removeprefix(prefix)}" for f in findings if f["code"] == "KVA007"
        }
        assert shown == named
    else:
        assert {line.removeprefix("kvaudit: ") for line in err.splitlines()} >= named
    if command == "sql":
        assert out.split() == ["pages", str(sum(case.good_pages for case in cases))]
    if command == "tui --snapshot":
        assert json.loads(out)["read_errors"] == len(cases)


def test_metrics_are_scraped_from_hostile_traces_as_they_grow(corpus: Path, tmp_path: Path):
    """`kvaudit exporter` reads what is new as it arrives (`refresh(final=False)`)."""
    directory = Path(shutil.copytree(corpus, tmp_path / "traces"))
    server, port = serve(
        DuckDBBackend(TraceStore([directory], ":memory:")), "127.0.0.1", 0, analyse_every_s=0, settle_s=0
    )
    try:
        caught_up(server)
        first = _scrape(port)
        (directory / "more").mkdir()
        hostile.CASES[0].write(directory / "more")  # a new file with the unsigned start time
        caught_up(server)
        second = _scrape(port)
    finally:
        server.shutdown()
    assert first["kvaudit_trace_read_errors"] == len(CASES)
    assert second["kvaudit_trace_read_errors"] == len(CASES) + 1


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as reply:
        text = reply.read().decode()
    return {
        line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("kvaudit_trace_read")
    }


def test_alerts_watch_keeps_running_on_hostile_traces(corpus: Path, tmp_path: Path):
    """A running `alerts watch` names the hostile lines that arrive and evaluates on."""
    directory = Path(shutil.copytree(corpus, tmp_path / "traces"))
    argv = [sys.executable, "-m", "kvaudit", "alerts", "watch", str(directory), "--interval", "1s"]
    argv += ["--state", str(tmp_path / "state.json"), "--notify", f"file:{tmp_path / 'notified.jsonl'}"]
    watch = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in watch.stderr or ()], daemon=True).start()
    try:
        _wait_for(watch, lines, "firing")  # evaluated once
        (directory / "more").mkdir()
        hostile.CASES[0].write(directory / "more")
        named = _wait_for(watch, lines, "more/start-time-unsigned.jsonl:2: bad value: startTimeUnixNano")
        assert watch.poll() is None, named
    finally:
        watch.terminate()
        watch.wait(timeout=30)
    assert not any("Traceback" in line for line in list(lines.queue))


def _wait_for(process: subprocess.Popen[str], lines: queue.Queue[str], text: str, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            assert process.poll() is None, f"exited with {process.returncode}"
            continue
        assert "Traceback" not in line
        if text in line:
            return line
    raise AssertionError(f"no line with {text!r} within {timeout_s} s")


# --- fuzzing -----------------------------------------------------------------------------

BYTES = st.sampled_from(list(b'"{}[],:\\ 0-.e\t\x00\x01\n\xc3\xe9\xff'))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_random_corruption_never_fails_a_read_and_keeps_every_good_line(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
):
    lines = good_lines()
    text = bytearray(b"".join(lines))
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(text)))
        kind = data.draw(st.sampled_from(["delete", "insert", "replace"]))
        byte = bytes([data.draw(BYTES)])
        text[at : at + (kind != "insert")] = b"" if kind == "delete" else byte
    path = tmp_path_factory.mktemp("corrupt") / "traces.jsonl"
    path.write_bytes(bytes(text))
    tables = reader.read_files([str(path)])
    read = {row["line"] for row in tables.spans.to_pylist()}
    named = {row["line"] for row in tables.errors.to_pylist()}
    assert not read & named
    for number, line in enumerate(bytes(text).split(b"\n"), start=1):
        if line + b"\n" in lines:  # a good line, untouched: read whole
            assert number in read


_HOSTILE_INT = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(2**63, 2**66),
    st.integers(-(2**66), -(2**63) - 1),
    st.sampled_from(["sixteen", "0x10", "1e3", "", "-", " 7", "٣", "+5", "1_0"]),
)


@settings(max_examples=200, deadline=None)
@given(
    start=st.one_of(st.integers(0, 2**63 - 1), st.integers(2**63, 2**64 - 1)),
    tokens=_HOSTILE_INT,
    page_bytes=_HOSTILE_INT,
    depth=st.integers(0, 40),
    as_text=st.booleans(),
)
def test_hostile_values_are_named_by_the_field_they_are_in(
    start: int,
    tokens: int | str,
    page_bytes: int | str,
    depth: int,
    as_text: bool,
    tmp_path_factory: pytest.TempPathFactory,
):
    def edit(data: dict[str, Any]) -> None:
        span = data["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        span["startTimeUnixNano"] = str(start) if as_text else start
        span["attributes"].append({"key": "kvaudit.tokens.requested", "value": {"intValue": _as(tokens, as_text)}})
        page = span["events"][0]["attributes"]
        page.append({"key": "kvaudit.page.bytes", "value": {"intValue": _as(page_bytes, as_text)}})
        span["attributes"].append({"key": "extra", "value": "NESTED"})

    lines = good_lines()
    data = json.loads(lines[1])
    edit(data)
    bad = json.dumps(data, separators=(",", ":")).encode().replace(b'"NESTED"', hostile._nested(depth))
    path = tmp_path_factory.mktemp("values") / "traces.jsonl"
    path.write_bytes(lines[0] + bad + b"\n" + lines[2])
    tables = reader.read_files([str(path)])
    wrong = {
        "startTimeUnixNano": start > 2**63 - 1,
        "kvaudit.tokens.requested": not _fits(tokens),
        "kvaudit.page.bytes": not _fits(page_bytes),
        "nested too deeply": depth > 32,
    }
    errors = tables.errors.to_pylist()
    assert sorted(row["line"] for row in tables.spans.to_pylist()) == ([1, 3] if any(wrong.values()) else [1, 2, 3])
    if any(wrong.values()):
        [error] = errors
        assert error["line"] == 2
        assert any(name in error["reason"] for name, bad_value in wrong.items() if bad_value), error
    else:
        assert errors == []


def _as(value: int | str, as_text: bool) -> int | str:
    return str(value) if as_text and isinstance(value, int) else value


def _fits(value: int | str) -> bool:
    """Whether `value` is an OTLP int64: a number or decimal digits, in the signed 64-bit range."""
    if isinstance(value, str):
        if not re.fullmatch(r"-?[0-9]+", value):
            return False
        value = int(value)
    return -(2**63) <= value < 2**63
