"""A disk filling up under kvaudit's writers, run as its own process by tests/receive/test_disk_full.py.

    python tests/support/disk_full_scenario.py DIR (tmpfs|rlimit) (receiver|emitter)

`tmpfs`: DIR is a small tmpfs (the test mounts it in a user and mount namespace); a
filler file takes part of it, and deleting the filler is space returning. `rlimit`: a
file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored so writes fail with EFBIG) is the full
disk, and raising it is space returning. Prints one JSON object of what it saw.
"""

from __future__ import annotations

import http.client
import json
import resource
import signal
import sys
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvaudit.analyse.audit import run_audit
from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import exporter_for, replica_resource
from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.read.store import TraceStore
from kvaudit.receive.otlp_http import CollectorServer
from kvaudit.receive.trace_sink import TraceSink

FILE_SIZE_LIMIT = 256 * 1024


def _operation(emitter: Emitter, n: int) -> None:
    with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id=f"q{n}") as op:
        for i in range(8):
            op.add_page(PageDescriptor(key=f"{n:032x}{i:032x}", token_start=32 * i, token_end=32 * (i + 1), used=True))
        op.end(Outcome.HIT, tokens_hit=256)


def _spans(replica: str, first: int, count: int) -> list[ReadableSpan]:
    keep = InMemorySpanExporter()
    emitter = Emitter(replica_resource(replica), SpanBatcher(keep, max_queue=count + 8))
    for n in range(first, first + count):
        _operation(emitter, n)
    emitter.flush()
    return [span for span in keep.get_finished_spans() if span.name != "kvaudit.telemetry"]


class Disk:
    def __init__(self, directory: Path, mode: str) -> None:
        self.mode = mode
        self.filler = directory / "filler"
        if mode == "tmpfs":
            self.filler.write_bytes(b"\x00" * (1024 * 1024))
        else:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, resource.RLIM_INFINITY))

    def free(self) -> None:
        if self.mode == "tmpfs":
            self.filler.unlink()
        else:
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def _read(directory: Path) -> dict[str, object]:
    """Spans readable (fetches, and all), unreadable lines, and KVA007's findings."""
    store = TraceStore([directory])
    store.refresh()
    _, [(fetches, spans)] = store.query("SELECT count(*) FILTER (WHERE op = 'fetch'), count(*) FROM spans")
    _, errors = store.query("SELECT file || ':' || line || ': ' || reason FROM read_errors")
    kva007 = [finding.message for finding in run_audit(store) if finding.code == "KVA007"]
    return {"fetches": fetches, "spans": spans, "errors": [error for (error,) in errors], "kva007": kva007}


def receiver(directory: Path, disk: Disk) -> dict[str, object]:
    traces = directory / "traces"
    server = CollectorServer(("127.0.0.1", 0), TraceSink(traces, fsync=True, max_bytes=0)).start()
    acknowledged = 0
    full_status: tuple[int, str | None] | None = None
    n = 0
    while full_status is None and n < 100_000:
        spans = _spans("r1", n, 10)
        n += 10
        exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", timeout=1)
        if exporter.export(spans) is SpanExportResult.SUCCESS:
            acknowledged += len(spans)
        else:
            # What the receiver answered, seen raw.
            conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
            conn.request(
                "POST",
                "/v1/traces",
                body=encode_spans(spans).SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"},
            )
            response = conn.getresponse()
            full_status = (response.status, response.getheader("Retry-After"))
            response.read()
            conn.close()
        exporter.shutdown()
    on_disk_full = _read(traces)
    disk.free()
    spans = _spans("r1", n, 10)
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", timeout=5)
    after_free = exporter.export(spans) is SpanExportResult.SUCCESS
    acknowledged += len(spans) if after_free else 0
    exporter.shutdown()
    server.stop()
    return {
        "acknowledged": acknowledged,
        "full_status": full_status,
        "when_full": on_disk_full,
        "accepted_after_free": after_free,
        "at_end": _read(traces),
        "write_failures": server.sink.stats.write_failures,
    }


def emitter(directory: Path, disk: Disk) -> dict[str, object]:
    traces = directory / "traces"
    exporter = exporter_for(f"file:{traces}/r1.jsonl", "r1")
    exporter._file._max_bytes = 0  # type: ignore[attr-defined]  # no rotation: the file itself must fill
    emitter = Emitter(replica_resource("r1"), SpanBatcher(exporter, delay_s=0.05), telemetry_interval_s=0)
    n = 0
    while not emitter.stats.failed_exports and n < 100_000:
        for _ in range(20):
            _operation(emitter, n)
            n += 1
        emitter.flush(10)
    for _ in range(40):  # more while full: every one of them lost, and counted
        _operation(emitter, n)
        n += 1
    emitter.flush(10)
    disk.free()
    for _ in range(20):
        _operation(emitter, n)
        n += 1
    emitter.shutdown(10)
    stats = emitter.stats
    return {
        "operations": n,
        "exported": stats.exported_spans,
        "dropped": stats.dropped_spans,
        "failed_exports": stats.failed_exports,
        "at_end": _read(traces),
    }


if __name__ == "__main__":
    where, mode, writer = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    disk = Disk(where, mode)
    result = (receiver if writer == "receiver" else emitter)(where, disk)
    print(json.dumps(result))
