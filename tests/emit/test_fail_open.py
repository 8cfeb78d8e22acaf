"""Emission fails open from the first call to the last: setup, a vanished file, dead or hanging endpoints, shutdown.

Nothing here may raise into the caller or hold it; every loss is counted, reaches
KVA007 where a trace can still be written, and stderr where it cannot.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from kvaudit.analyse.audit import run_audit
from kvaudit.contract import Hook, Op, Outcome, TelemetryAttr
from kvaudit.emit.emitter import DEFAULT_SHUTDOWN_TIMEOUT_S, Emitter
from kvaudit.emit.file_exporter import OTLPJsonFileExporter
from kvaudit.emit.setup import (
    ENV_SHUTDOWN_TIMEOUT,
    exporter_for,
    replica_resource,
    setup_emitter,
    shutdown_timeout_from_env,
)
from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.read.store import TraceStore

from ..support.pages import full_page
from ..support.servers import free_port
from ..support.waiting import wait_until


def _emit(emitter: Emitter, count: int, pages: int = 2) -> None:
    for n in range(count):
        with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id=f"q{n}") as op:
            for i in range(pages):
                op.add_page(full_page(f"{n:032x}{i:032x}", i, used=True))
            op.end(Outcome.HIT, tokens_hit=32 * pages)


def _read(directory: Path) -> TraceStore:
    store = TraceStore([directory])
    store.refresh()
    return store


def _kva007_dropped(store: TraceStore) -> list[str]:
    return [f.message for f in run_audit(store) if f.code == "KVA007"]


@pytest.fixture
def hanging_endpoint() -> Iterator[str]:
    """An OTLP/HTTP endpoint that accepts connections and never answers (a wedged collector)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for sock in held:
        sock.close()
    listener.close()


# --- setup ------------------------------------------------------------------------------


def test_setup_to_an_unwritable_directory_does_not_raise_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
):
    # A file where the directory should be: opening fails as a read-only directory does
    # (a read-only mode would not stop the root user these tests may run as).
    blocked = tmp_path / "traces"
    blocked.write_text("not a directory")
    with caplog.at_level(logging.WARNING):
        emitter = setup_emitter("r1", f"file:{blocked}/{{replica}}.jsonl", export_delay_s=0.05)
        _emit(emitter, 10)
        assert emitter.flush(10)
    stats = emitter.stats
    assert stats.failed_exports >= 1 and stats.dropped_spans >= 10 and stats.exported_spans == 0
    assert len([r for r in caplog.records if "exporting spans failed" in r.message]) == 1  # logged once
    blocked.unlink()
    blocked.mkdir()  # the directory becomes writable: the next export opens the file
    _emit(emitter, 5)
    emitter.shutdown()
    store = _read(blocked)
    _, [(fetches,)] = store.query("SELECT count(*) FROM spans WHERE op = 'fetch'")
    assert fetches == 5
    assert any(f"{emitter.stats.dropped_spans} dropped spans" in m for m in _kva007_dropped(store))
    assert f"{emitter.stats.dropped_spans} spans dropped" in capfd.readouterr().err


def test_setup_with_an_unknown_destination_turns_emission_off_and_counts(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
):
    with caplog.at_level(logging.ERROR):
        emitter = setup_emitter("r1", "kafka:topic", export_delay_s=0.05)
    assert "no trace destination" in caplog.text
    _emit(emitter, 7)
    emitter.shutdown(5)
    assert emitter.stats.dropped_spans >= 7
    assert "spans dropped" in capfd.readouterr().err


# --- the trace file vanishing ---------------------------------------------------------------


def test_a_trace_file_deleted_under_the_emitter_is_reopened_and_the_loss_counted(
    trace_dir: Path, capfd: pytest.CaptureFixture[str]
):
    path = trace_dir / "r1.jsonl"
    emitter = Emitter(
        replica_resource("r1"), SpanBatcher(exporter_for(f"file:{path}", "r1"), delay_s=0.05), telemetry_interval_s=0
    )
    _emit(emitter, 100)
    assert emitter.flush(10)
    written = emitter.stats.exported_spans
    path.unlink()
    _emit(emitter, 50)
    emitter.shutdown(10)
    stats = emitter.stats
    assert stats.lost_spans == written  # what the deleted file held
    assert stats.exported_spans == 50 + 1  # the 50 after and the telemetry span reporting the loss
    store = _read(trace_dir)
    _, [(fetches,)] = store.query("SELECT count(*) FROM spans WHERE op = 'fetch'")
    assert fetches == 50
    assert any(f"{stats.dropped_spans} dropped spans" in m for m in _kva007_dropped(store))
    assert f"{written} of them in a deleted trace file" in capfd.readouterr().err


def test_a_trace_file_renamed_away_is_not_a_loss(trace_dir: Path):
    path = trace_dir / "r1.jsonl"
    exporter = OTLPJsonFileExporter(path)
    emitter = Emitter(replica_resource("r1"), SpanBatcher(exporter, delay_s=0.05))
    _emit(emitter, 10)
    assert emitter.flush(10)
    path.rename(trace_dir / "r1-20260101T000000.jsonl")  # rotated the way the Collector's file exporter does
    _emit(emitter, 10)
    emitter.shutdown(10)
    assert emitter.stats.lost_spans == 0 and emitter.stats.dropped_spans == 0
    _, [(fetches,)] = _read(trace_dir).query("SELECT count(*) FROM spans WHERE op = 'fetch'")
    assert fetches == 20


# --- endpoints that refuse or hang ------------------------------------------------------------


def test_shutdown_is_bounded_against_a_hanging_endpoint_and_counts_what_it_could_not_send(
    hanging_endpoint: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
):
    monkeypatch.setenv(ENV_SHUTDOWN_TIMEOUT, "1s")
    emitter = setup_emitter("r1", f"otlp:{hanging_endpoint}", export_delay_s=0.05)
    _emit(emitter, 465)
    started = time.monotonic()
    emitter.shutdown()  # what the vLLM hook's atexit calls
    took = time.monotonic() - started
    assert took < 5, f"shutdown took {took:.1f} s against a configured 1 s"  # was 30 s
    stats = emitter.stats
    assert stats.exported_spans == 0 and stats.dropped_spans >= 465  # every queued span counted
    assert "(at shutdown)" in capfd.readouterr().err


def test_a_bad_shutdown_timeout_setting_is_warned_and_the_default_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setenv(ENV_SHUTDOWN_TIMEOUT, "forever")
    with caplog.at_level(logging.WARNING):
        assert shutdown_timeout_from_env() == DEFAULT_SHUTDOWN_TIMEOUT_S
    assert f"{ENV_SHUTDOWN_TIMEOUT}='forever' ignored" in caplog.text
    monkeypatch.setenv(ENV_SHUTDOWN_TIMEOUT, "250ms")
    assert shutdown_timeout_from_env() == 0.25


def test_a_refused_endpoint_is_counted_and_never_raised(capfd: pytest.CaptureFixture[str]):
    emitter = setup_emitter("r1", f"otlp:http://127.0.0.1:{free_port()}", export_delay_s=0.05)
    _emit(emitter, 20)
    emitter.shutdown(1)  # the exporter is still retrying (its own timeout is 10 s): given up, and counted
    assert emitter.stats.exported_spans == 0 and emitter.stats.dropped_spans >= 20
    assert "spans dropped" in capfd.readouterr().err


def test_the_caller_is_never_held_by_a_hanging_endpoint(hanging_endpoint: str):
    exporter = OTLPSpanExporter(endpoint=f"{hanging_endpoint}/v1/traces", timeout=30)
    emitter = Emitter(replica_resource("r1"), SpanBatcher(exporter, max_queue=1000, delay_s=0.01))
    _emit(emitter, 20_000, pages=1)  # the worker is stuck in its first POST all along
    assert emitter.stats.dropped_spans >= 19_000 - 512
    emitter.shutdown(0.5)


class _Stalled(OTLPJsonFileExporter):
    """The real file exporter behind a gate: stands in for a disk that stalls, which a test cannot make."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.gate.wait(30)
        return super().export(spans)


def test_drops_while_the_destination_stalls_reach_kva007(trace_dir: Path):
    exporter = _Stalled(trace_dir / "r1.jsonl")
    emitter = Emitter(
        replica_resource("r1"), SpanBatcher(exporter, max_queue=100, delay_s=0.01), telemetry_interval_s=0
    )
    _emit(emitter, 1000, pages=1)  # returns at once: the queue drops what does not fit
    exporter.gate.set()
    emitter.shutdown(10)
    dropped = emitter.stats.dropped_spans
    assert dropped >= 800
    store = _read(trace_dir)
    _, [(reported,)] = store.query(
        f"SELECT max(telemetry_dropped_spans) FROM spans WHERE name = '{TelemetryAttr.SPAN_NAME}'"
    )
    assert reported == dropped
    assert any(f"{dropped} dropped spans" in m for m in _kva007_dropped(store))


# --- kill -9 --------------------------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import sys
    from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
    from kvaudit.emit import setup_emitter

    emitter = setup_emitter("r1", "file:" + sys.argv[1], export_delay_s=0.001)
    n = 0
    while True:
        with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id=f"q{n}") as op:
            for i in range(64):
                op.add_page(PageDescriptor(key=f"{n:032x}{i:032x}", token_start=i, token_end=i + 1, used=True))
            op.end(Outcome.HIT)
        n += 1
        if n == 200:
            emitter.flush()
            print("ready", flush=True)
    """
)


def test_kill_9_of_a_file_writer_leaves_at_most_one_torn_line_named(trace_dir: Path):
    path = trace_dir / "r1.jsonl"
    for _ in range(2):  # killed twice: the second writer ends the first one's fragment before appending
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        size = path.stat().st_size
        # Kill it while it is writing: looked at without a pause, to catch it in the middle.
        wait_until(lambda size=size: path.stat().st_size != size, what="the writer wrote", interval=0)
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    store = _read(trace_dir)
    _, errors = store.query("SELECT file, line, reason FROM read_errors")
    assert len(errors) <= 2  # one torn line per kill at most, each named by file and line
    assert all(file.endswith("r1.jsonl") and line > 0 for file, line, _ in errors)
    _, [(fetches,)] = store.query("SELECT count(*) FROM spans WHERE op = 'fetch'")
    assert fetches >= 400
