"""`kvaudit collect` as an operator runs it (its own process, fsync on): throughput, and peak memory under gzip bodies.

- throughput: spans/s acknowledged from 32 clients, pre-serialised protobuf over
  keep-alive connections and the official OTLP/HTTP exporter encoding in the client,
  beside the same lines written straight to a file with fsync (the disk's ceiling);
- decoding: peak bytes held per body byte while one body is parsed and encoded as a
  JSON line (protobuf and JSON bodies, each in a fresh process), beside the figure
  the memory budget assumes;
- memory: the receiver's peak RSS above its idle size while 8 clients send large gzip
  bodies at once, each retried after Retry-After on 503 until accepted, with the
  default memory budget and with none, beside the budget itself.

Sizes: KVAUDIT_BENCH_RECEIVE_SECONDS (per throughput run, default 10),
KVAUDIT_BENCH_GZIP_MIB (each gzip body inflated, default 31), KVAUDIT_BENCH_GZIP_ROUNDS
(bodies per client, default 2).
"""

from __future__ import annotations

import gzip
import http.client
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench.common import KV, Receiver, env_int, machine, page, report, sized
from kvaudit.contract import Hook, Op, Outcome
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.line_file import LineFile
from kvaudit.emit.setup import replica_resource
from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.otlp.encode import proto_to_line
from kvaudit.receive.memory_budget import DECODE_BYTES_PER_BODY_BYTE
from kvaudit.receive.otlp_http import ReceiverLimits
from tests.support.servers import free_port

CLIENTS = 32
SPANS_PER_REQUEST = 128
PAGES_PER_SPAN = 4
GZIP_CLIENTS = 8
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def _spans(replica: str, count: int, pages: int) -> list[ReadableSpan]:
    keep = InMemorySpanExporter()
    emitter = Emitter(replica_resource(replica, kv=KV), SpanBatcher(keep, max_queue=count + 8))
    descriptors = [page(i) for i in range(pages)]
    for n in range(count):
        with emitter.operation(Op.FETCH, hook=Hook.SIMULATOR, request_id=f"q{n}") as op:
            for descriptor in descriptors:
                op.add_page(descriptor)
            op.end(Outcome.HIT)
    emitter.flush()
    return [span for span in keep.get_finished_spans() if span.name != "kvaudit.telemetry"]


def _run_clients(count: int, seconds: float, send: Callable[[int], int]) -> float:
    """Spans/s acknowledged by `count` threads, each calling `send(client)` (spans acknowledged) until time is up."""
    done = [0] * count
    stop = time.monotonic() + seconds

    def client(index: int) -> None:
        while time.monotonic() < stop:
            done[index] += send(index)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(count)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.monotonic() - started)


def _throughput(tmp: Path, seconds: float) -> tuple[float, float, float]:
    spans = _spans("r1", SPANS_PER_REQUEST, PAGES_PER_SPAN)
    body = encode_spans(spans).SerializeToString()
    receiver = Receiver(tmp / "pre", free_port())
    connections = [http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=60) for _ in range(CLIENTS)]

    def pre_serialised(index: int) -> int:
        connection = connections[index]
        connection.request("POST", "/v1/traces", body=body, headers=PROTOBUF)
        response = connection.getresponse()
        response.read()
        return SPANS_PER_REQUEST if response.status == 200 else 0

    pre = _run_clients(CLIENTS, seconds, pre_serialised)
    receiver.stop()
    receiver = Receiver(tmp / "official", free_port())
    exporters = [OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver.port}/v1/traces") for _ in range(CLIENTS)]

    def official(index: int) -> int:
        return SPANS_PER_REQUEST if exporters[index].export(spans) is SpanExportResult.SUCCESS else 0

    with_exporter = _run_clients(CLIENTS, seconds, official)
    receiver.stop()
    line = proto_to_line(encode_spans(spans))
    files = [LineFile(tmp / "direct" / f"{i}.jsonl", fsync=True) for i in range(CLIENTS)]
    direct = _run_clients(CLIENTS, seconds, lambda index: files[index].write(line) or SPANS_PER_REQUEST)
    return pre, with_exporter, direct


# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child started by a large
# parent would report the parent's size.
_DECODE = """
import resource, sys
from kvaudit.otlp.encode import resource_spans_to_line
from kvaudit.receive.memory_budget import MemoryBudget
from kvaudit.receive.request_body import decode_body

body = open(sys.argv[1], "rb").read()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
def peak():
    status = open("/proc/self/status").read()
    return int(status.split("VmHWM:")[1].split()[0]) * 1024
base = rss()
request = decode_body(body, sys.argv[2], "", len(body), MemoryBudget(0).reservation())
line = resource_spans_to_line(request.resource_spans)
print((peak() - base) / len(body))
"""


def _decode_bytes_per_body_byte(tmp: Path, body_mib: int) -> tuple[float, float]:
    """Peak bytes per body byte of decoding one body, protobuf then JSON, each in a fresh process."""
    spans = _spans("r1", 1, 128)
    request = encode_spans(spans * max(1, body_mib * 2**20 // len(encode_spans(spans).SerializeToString())))
    figures = []
    for name, body, content_type in (
        ("body.pb", request.SerializeToString(), "application/x-protobuf"),
        ("body.json", proto_to_line(request), "application/json"),
    ):
        (tmp / name).write_bytes(body)
        done = subprocess.run(
            [sys.executable, "-c", _DECODE, str(tmp / name), content_type], capture_output=True, text=True, check=True
        )
        figures.append(float(done.stdout))
    return figures[0], figures[1]


def _gzip_peak(tmp: Path, body_mib: int, rounds: int, memory_limit_mib: int) -> tuple[float, float, int]:
    """Peak RSS (MiB) of a receiver taking GZIP_CLIENTS × `rounds` gzip bodies at once, its idle RSS, and its 503s."""
    spans = _spans("r1", 1, 128)
    one = len(encode_spans(spans).SerializeToString())
    payload = encode_spans(spans * max(1, body_mib * 2**20 // one)).SerializeToString()
    body = gzip.compress(payload)
    receiver = Receiver(
        tmp / f"gzip-{memory_limit_mib}", free_port(), "--memory-limit-mib", str(memory_limit_mib), "--no-fsync"
    )
    idle = receiver.peak_rss_mib()
    refused = [0]

    def client(_: int) -> int:
        for _ in range(rounds):
            while True:
                connection = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=300)
                connection.request("POST", "/v1/traces", body=body, headers={**PROTOBUF, "Content-Encoding": "gzip"})
                response = connection.getresponse()
                response.read()
                connection.close()
                if response.status != 503:
                    break
                refused[0] += 1
                time.sleep(float(response.getheader("Retry-After", "1")))
        return 0

    threads = [threading.Thread(target=client, args=(i,)) for i in range(GZIP_CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    peak = receiver.peak_rss_mib()
    receiver.stop()
    print(f"gzip body: {len(body) / 2**20:.2f} MiB inflating to {len(payload) / 2**20:.1f} MiB")
    return peak, idle, refused[0]


def main() -> None:
    print(machine())
    seconds = float(env_int("KVAUDIT_BENCH_RECEIVE_SECONDS", 10, 1))
    body_mib = env_int("KVAUDIT_BENCH_GZIP_MIB", 31, 1)
    rounds = env_int("KVAUDIT_BENCH_GZIP_ROUNDS", 2, 1)
    budget_mib = ReceiverLimits().memory_limit >> 20
    with tempfile.TemporaryDirectory() as tmp:
        pre, official, direct = _throughput(Path(tmp), seconds)
        per_byte_pb, per_byte_json = _decode_bytes_per_body_byte(Path(tmp), sized(16, 1))
        peak, idle, refused = _gzip_peak(Path(tmp), body_mib, rounds, budget_mib)
        unbounded, _, _ = _gzip_peak(Path(tmp), body_mib, rounds, 0)
    print(
        f"{CLIENTS} clients, {SPANS_PER_REQUEST} spans of {PAGES_PER_SPAN} page descriptors per request, fsync on; "
        f"{GZIP_CLIENTS} clients × {rounds} gzip bodies; the budget counts 1 + {DECODE_BYTES_PER_BODY_BYTE} "
        "bytes per inflated byte"
    )
    report(
        [
            (
                "spans/s, pre-serialised protobuf",
                f"{pre:,.0f}",
                f"{direct:,.0f} (lines straight to files, fsync)",
                f"{pre / direct:.2f}",
                "",
            ),
            ("spans/s, official OTLP exporters", f"{official:,.0f}", f"{pre:,.0f} (pre-serialised)", "", ""),
            (
                "decoding, peak bytes per body byte (protobuf, JSON)",
                f"{per_byte_pb:.1f}, {per_byte_json:.1f}",
                f"{DECODE_BYTES_PER_BODY_BYTE} (what the budget reserves)",
                "",
                f"≤ {DECODE_BYTES_PER_BODY_BYTE}",
            ),
            (
                f"peak RSS above idle ({idle:,.0f}) MiB, 8 gzip bodies at once",
                f"{peak - idle:,.0f} ({refused} × 503)",
                f"{unbounded - idle:,.0f} (no budget)",
                f"{(unbounded - idle) / (peak - idle):.1f}× less",
                f"≤ {budget_mib} (the budget)",
            ),
        ]
    )
