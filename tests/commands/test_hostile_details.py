"""Hostile input, the smaller cases: NaN and Inf carried, C1 and bidi escaped in JSON output,
`collect` stopped by a signal says so, the shutdown timeout bounded, each rule's memory bounded,
Ctrl-C during a DuckDB query ends the command.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, TracesData

from kvaudit.backends import duckdb_backend
from kvaudit.backends.base import RULE_MEMORY_BYTES
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.cli import main
from kvaudit.emit.setup import MAX_SHUTDOWN_TIMEOUT_S, shutdown_timeout_from_env
from kvaudit.otlp.encode import proto_to_line
from kvaudit.read.store import TraceStore

from ..support.hostile import good_lines
from ..support.servers import free_port, wait_listening
from ..support.signals import interruptible

UNSAFE = "\u009b31m\u202eevil"  # a C1 CSI and a RIGHT-TO-LEFT OVERRIDE


def test_nan_and_inf_are_carried_as_otlp_json_writes_them(tmp_path: Path):
    span = Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="s", start_time_unix_nano=1, end_time_unix_nano=2)
    for key, value in (("nan", math.nan), ("inf", math.inf), ("minus_inf", -math.inf)):
        span.attributes.append(KeyValue(key=key, value=AnyValue(double_value=value)))
    line = proto_to_line(TracesData(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])]))
    assert b'"doubleValue":"NaN"' in line and b'"doubleValue":"Infinity"' in line
    assert b'"doubleValue":"-Infinity"' in line and b"null" not in line
    (tmp_path / "t.jsonl").write_bytes(line + b"\n")
    store = TraceStore([tmp_path])
    store.refresh()
    _, [(attributes,)] = store.query("SELECT attributes FROM spans")
    assert dict(attributes) == {"nan": "NaN", "inf": "+Inf", "minus_inf": "-Inf"}  # as the Collector renders them


def _trace_with_replica(directory: Path, replica: str) -> None:
    lines = []
    for line in good_lines():
        data = json.loads(line)
        for kv in data["resourceSpans"][0]["resource"]["attributes"]:
            if kv["key"] == "service.instance.id":
                kv["value"] = {"stringValue": replica}
        lines.append(json.dumps(data).encode() + b"\n")
    (directory / "t.jsonl").write_bytes(b"".join(lines))


@pytest.mark.parametrize("command", ["sql", "tui"])
def test_c1_and_bidi_characters_are_escaped_in_json_output(
    trace_dir: Path, command: str, capsys: pytest.CaptureFixture[str]
):
    _trace_with_replica(trace_dir, f"r{UNSAFE}")
    if command == "sql":
        argv = ["sql", "--format", "json", str(trace_dir), "SELECT DISTINCT replica FROM spans"]
    else:
        argv = ["tui", str(trace_dir), "--snapshot"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "\u009b" not in out and "\u202e" not in out
    assert "\\u009b31m\\u202eevil" in out  # the same value, escaped the JSON way
    assert f"r{UNSAFE}" in json.dumps([json.loads(line) for line in out.splitlines()], ensure_ascii=False)


@pytest.mark.parametrize(("sent", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_collect_stopped_by_a_signal_exits_as_shells_report_it(tmp_path: Path, sent: signal.Signals, status: int):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "kvaudit", "collect", f"127.0.0.1:{port}", "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        wait_listening(process, port, "kvaudit collect")
    finally:
        process.send_signal(sent)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == status, stderr
    assert "kvaudit collect: 0 requests" in stdout  # its summary, as on any stop


def test_the_shutdown_timeout_is_capped(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KVAUDIT_SHUTDOWN_TIMEOUT", "99999999999999999999s")
    assert shutdown_timeout_from_env() == MAX_SHUTDOWN_TIMEOUT_S == 300


def test_each_rule_runs_under_its_memory_and_spill_limits(trace_dir: Path):
    (trace_dir / "t.jsonl").write_bytes(b"".join(good_lines()))
    store = TraceStore([trace_dir])
    store.refresh()
    backend = DuckDBBackend(store)
    setting = "SELECT current_setting('memory_limit') AS m, current_setting('max_temp_directory_size') AS t"
    before = backend.query(setting)[1]
    inside = backend.sandboxed(setting, timeout_s=10, max_rows=10).to_pylist()
    assert inside == [{"m": "2.0 GiB", "t": "4.0 GiB"}] and RULE_MEMORY_BYTES == 2 << 30
    assert backend.query(setting)[1] == before  # the rest of kvaudit has its own back


def test_a_rule_spills_beyond_what_a_live_stores_rows_spilled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A store in memory (a live one where its directory takes no file) spills its rows past its
    budget to the directory rules spill to: a rule's spill limit below them would fail every
    rule."""
    monkeypatch.setattr(duckdb_backend, "RULE_SPILL_BYTES", 1 << 20)
    spill = tmp_path / "spill"
    spill.mkdir()
    store = TraceStore(database=":memory:", memory_limit=32 << 20, spill=_Directory(str(spill)))
    store.con.execute("CREATE TABLE filler AS SELECT range AS i, md5(range::VARCHAR) AS s FROM range(3000000)")
    backend = DuckDBBackend(store)
    [(spilled,)] = backend.query("SELECT sum(size) FROM duckdb_temporary_files()")[1]
    assert spilled > 1 << 20
    assert backend.sandboxed("SELECT count(*) AS n FROM pages", timeout_s=10, max_rows=10).to_pylist() == [{"n": 0}]
    backend.close()


class _Directory:
    """A directory of the test's as the store's spill directory (`close()` cleans it up)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def cleanup(self) -> None:
        pass


_QUERY_INTERRUPTED = r"""
import os, signal, sys, threading
from kvaudit.cli import main

main_thread = threading.main_thread().ident

QUERY = "SELECT count(*) FROM range(1000000000000) a, range(1000) b"

def in_duckdb():
    # The main thread in TraceStore.query for this query: its frame waits on DuckDB's execute.
    frame = sys._current_frames().get(main_thread)
    code = frame.f_code if frame is not None else None
    return code is not None and code.co_name == "query" and frame.f_locals.get("query") == QUERY

def interrupt():
    while not in_duckdb():
        threading.Event().wait(0.01)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt, daemon=True).start()
sys.exit(main(["sql", sys.argv[1], QUERY]))
"""


def test_ctrl_c_during_a_duckdb_query_ends_the_command_with_130(trace_dir: Path):
    (trace_dir / "t.jsonl").write_bytes(b"".join(good_lines()))
    done = subprocess.run(
        [sys.executable, "-c", _QUERY_INTERRUPTED, str(trace_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=interruptible,
    )
    assert done.returncode == 130, done.stderr
    assert "internal error" not in done.stderr


def test_interruptible_restores_sigint_in_a_child_of_a_process_that_ignores_it():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background shell leaves it
    try:
        probe = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, preexec_fn=interruptible
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert done.stdout.strip() == "True"
