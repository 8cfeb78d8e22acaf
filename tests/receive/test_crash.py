"""`kvaudit collect` killed with SIGKILL under load from 40 official OTLP exporters: every acknowledged span is on disk.

The receiver runs as the command an operator starts (fsync on, a bearer token file);
the clients are OpenTelemetry's own OTLP/HTTP exporters in threads, retrying as they
do. A span counts as acknowledged when its exporter's `export` returned SUCCESS.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvaudit.contract import Hook, Op, Outcome
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import replica_resource
from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.read.store import TraceStore

from ..support.pages import full_page
from ..support.servers import free_port, wait_listening
from ..support.waiting import wait_until

CLIENTS = 40
BATCHES = 25
SPANS_PER_BATCH = 5


def _batches(client: int) -> list[list[ReadableSpan]]:
    keep = InMemorySpanExporter()
    emitter = Emitter(replica_resource(f"r{client % 8}"), SpanBatcher(keep, max_queue=BATCHES * SPANS_PER_BATCH + 8))
    for batch in range(BATCHES):
        for i in range(SPANS_PER_BATCH):
            with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id=f"c{client}-{batch}-{i}") as op:
                op.add_page(full_page(f"{client:016x}{batch:016x}{i:032x}", used=True))
                op.end(Outcome.HIT, tokens_hit=32)
    emitter.flush()
    spans = [span for span in keep.get_finished_spans() if span.name != "kvaudit.telemetry"]
    return [spans[b * SPANS_PER_BATCH : (b + 1) * SPANS_PER_BATCH] for b in range(BATCHES)]


def _start(port: int, out: Path, token_file: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "kvaudit", "collect", "--out", str(out), f"127.0.0.1:{port}"]
    receiver = subprocess.Popen(
        [*command, "--bearer-token-file", str(token_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_listening(receiver, port, "kvaudit collect")
    return receiver


def test_every_acknowledged_span_is_on_disk_across_a_kill_9(tmp_path: Path):
    out = tmp_path / "traces"
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    port = free_port()
    work = [_batches(client) for client in range(CLIENTS)]
    acknowledged: set[str] = set()
    lock = threading.Lock()

    def client(batches: list[list[ReadableSpan]]) -> None:
        exporter = OTLPSpanExporter(
            endpoint=f"http://127.0.0.1:{port}/v1/traces", headers={"Authorization": "Bearer s3cret"}, timeout=30
        )
        for batch in batches:
            if exporter.export(batch) is SpanExportResult.SUCCESS:
                with lock:
                    acknowledged.update(str(span.attributes["kvaudit.request.id"]) for span in batch)
        exporter.shutdown()

    receiver = _start(port, out, token_file)
    threads = [threading.Thread(target=client, args=(batches,)) for batches in work]
    try:
        for thread in threads:
            thread.start()
        headway = CLIENTS * BATCHES * SPANS_PER_BATCH // 3
        wait_until(lambda: len(acknowledged) >= headway, what="the clients made headway")
        os.kill(receiver.pid, signal.SIGKILL)
        receiver.wait()
        acknowledged_before_kill = len(acknowledged)
        receiver = _start(port, out, token_file)  # the exporters' retries reach the new one
        for thread in threads:
            thread.join()
    finally:
        receiver.send_signal(signal.SIGTERM)
        receiver.wait(timeout=60)
    assert acknowledged_before_kill > 0 and len(acknowledged) > acknowledged_before_kill
    store = TraceStore([out])
    store.refresh()
    _, rows = store.query("SELECT DISTINCT request_id FROM spans WHERE op = 'fetch'")
    on_disk = {request_id for (request_id,) in rows}
    assert acknowledged <= on_disk, f"{len(acknowledged - on_disk)} acknowledged spans missing"
    _, errors = store.query("SELECT file, line, reason FROM read_errors")
    assert len(errors) <= 1  # at most the line being written at the kill, named
