"""Emission cost on the serving thread, against the OpenTelemetry SDK's own calls, and export throughput.

- per descriptor: `add_page` against the SDK's `span.add_event` with the same
  attributes (precomputed, so the SDK is charged for nothing but its own call);
- per span: `operation()` + `end()` against a bare SDK span with the same attributes;
- against the modelled transfer time of the 27B page a descriptor describes;
- export: descriptors per second encoded and written as OTLP JSON lines, by the
  exporter alone and end to end through the emitter's background thread; the cost of
  encoding an OTLP/HTTP request, kvaudit's encoder against the official exporter's;
- cold: a span of 32 descriptors (a request's blocks) emitted right after a 32 MiB copy,
  as a hook runs between an engine's transfers, against the same span in a hot loop; and
  what it adds to the time of the engine's own Python after the copy (a stand-in for it
  timed with the span before it and without);
- the serving thread's waits for the GIL while the exporter thread works: a loop that
  emits at a replica's trace volume and waits with the GIL released between (as on a GPU
  or in a torch operation), its time getting the GIL back with the exporter giving way
  (`kvaudit.emit.give_way`) and not, and sending OTLP/HTTP with kvaudit's encoding and
  with the official exporter's, against the same loop emitting nothing.

Sizes: KVAUDIT_BENCH_SPANS (spans per run, default 2000), 128 pages per span.
"""

from __future__ import annotations

import hashlib
import statistics
import tempfile
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from bench.common import KV, PAGE_BYTES, Receiver, best_of, env_int, machine, page, report, sized
from kvaudit.contract import EVENT_PAGE, Hook, Op, Outcome, SpanAttr
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.file_exporter import OTLPJsonFileExporter
from kvaudit.emit.give_way import GiveWay
from kvaudit.emit.otlp_http_exporter import OTLPHttpExporter
from kvaudit.emit.setup import replica_resource, setup_emitter
from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.otlp.encode_protobuf import spans_to_request
from kvaudit.simulator.model import CostModel
from tests.support.servers import free_port

PAGES_PER_SPAN = 128
REPEATS = sized(3, 1)


class _Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _kvaudit(spans: int, pages_per_span: int) -> float:
    # Room for every repeat: the exporter thread, which makes the spans, need not keep up with this loop.
    emitter = Emitter(replica_resource("r1", kv=KV), SpanBatcher(_Keep(), max_queue=REPEATS * spans + 1))
    pages = [page(i) for i in range(pages_per_span)]

    def run() -> None:
        for n in range(spans):
            op = emitter.operation(Op.FETCH, hook=Hook.SIMULATOR, request_id=f"q{n}", tokens_requested=32768)
            for p in pages:
                op.add_page(p)
            op.end(Outcome.HIT, tokens_hit=pages_per_span * 256)
        emitter._batcher.exporter.spans.clear()  # type: ignore[attr-defined]

    seconds = best_of(REPEATS, run)
    emitter.shutdown()
    return seconds


def _sdk(spans: int, pages_per_span: int) -> float:
    limits = SpanLimits(max_events=65536, max_span_attributes=256, max_event_attributes=256)
    tracer = TracerProvider(span_limits=limits).get_tracer("bench")
    events = [page(i).to_attributes() for i in range(pages_per_span)]

    def run() -> None:
        for n in range(spans):
            span = tracer.start_span(
                Op.FETCH.span_name,
                attributes={
                    SpanAttr.OP: Op.FETCH.value,  # the SDK baseline's own copy of the span's attributes
                    SpanAttr.HOOK: Hook.SIMULATOR.value,
                    SpanAttr.REQUEST_ID: f"q{n}",
                    SpanAttr.TOKENS_REQUESTED: 32768,
                },
            )
            for attributes in events:
                span.add_event(EVENT_PAGE, attributes)
            span.set_attributes({SpanAttr.OUTCOME: Outcome.HIT.value, SpanAttr.TOKENS_HIT: pages_per_span * 256})
            span.end()

    return best_of(REPEATS, run)


def _built(spans: int, pages_per_span: int) -> list[ReadableSpan]:
    """`spans` spans of `pages_per_span` descriptors each, as the exporter thread hands them over."""
    keep = _Keep()
    emitter = Emitter(replica_resource("r1", kv=KV), SpanBatcher(keep, max_queue=spans + 1))
    pages = [page(i) for i in range(pages_per_span)]
    for n in range(spans):
        with emitter.operation(Op.FETCH, hook=Hook.SIMULATOR, request_id=f"q{n}") as op:
            for p in pages:
                op.add_page(p)
    emitter.shutdown()
    return keep.spans


def _otlp_encoding(spans: int) -> tuple[float, float]:
    """µs per descriptor encoding OTLP/HTTP requests of 1,024 descriptors (the batcher's
    bound): kvaudit's encoder (what `otlp:` sends) and the official OTLP exporter's."""
    built = _built(spans, COLD_PAGES)
    batches = [built[i : i + 1024 // COLD_PAGES] for i in range(0, len(built), 1024 // COLD_PAGES)]

    def cost(encode: Callable[[Sequence[ReadableSpan]], bytes]) -> float:
        def run() -> None:
            for batch in batches:
                encode(batch)

        return 1e6 * best_of(REPEATS, run) / (spans * COLD_PAGES)

    return cost(spans_to_request), cost(lambda batch: encode_spans(batch).SerializePartialToString())


def _export(spans: int) -> tuple[float, float]:
    """Descriptors per second: the file exporter alone, and emitter + background thread + file."""
    built = _built(spans, PAGES_PER_SPAN)
    pages = [page(i) for i in range(PAGES_PER_SPAN)]
    descriptors = spans * PAGES_PER_SPAN
    with tempfile.TemporaryDirectory() as tmp:
        exporter = OTLPJsonFileExporter(Path(tmp) / "alone.jsonl")
        batch = 64  # spans per line: what the batcher hands over under load, give or take

        def alone() -> None:
            for i in range(0, len(built), batch):
                exporter.export(built[i : i + batch])

        exporter_s = best_of(1, alone)
        exporter.shutdown()
        through = setup_emitter("r1", f"file:{tmp}/through.jsonl", kv=KV, max_queue_spans=spans + 1)

        def end_to_end() -> None:
            for n in range(spans):
                with through.operation(Op.FETCH, hook=Hook.SIMULATOR, request_id=f"q{n}") as op:
                    for p in pages:
                        op.add_page(p)
            through.flush(timeout_s=600)

        total_s = best_of(1, end_to_end)
        through.shutdown()
    return descriptors / exporter_s, descriptors / total_s


COLD_PAGES = 32
COLD_COPY_BYTES = 32 * 2**20  # beyond this machine's caches
ENGINE_OBJECTS = 40  # what `_engine_python` makes, standing in for the engine's own Python after a copy


@dataclass
class _EngineObject:
    index: int
    name: str
    tokens: tuple[int, int]


def _engine_python(objects: int) -> int:
    """A stand-in for the Python an engine runs between its copies (LMCache's bookkeeping
    of a store: objects made, kept in an ordered map, a key hashed each), for `_cold` to time
    after a copy with and without a hook's span before it."""
    kept: OrderedDict[str, _EngineObject] = OrderedDict()
    for index in range(objects):
        made = _EngineObject(index, str(index), (index, index + 1))
        kept[made.name] = made
        kept.move_to_end(made.name)
        hashlib.blake2b(made.name.encode(), digest_size=8).digest()
    return len(kept)


def _cold(spans: int) -> tuple[float, float, float]:
    """µs of serving-thread CPU per span of COLD_PAGES descriptors: in a hot loop, and each
    right after a copy that evicts the caches (the hook's code and data then come from memory);
    and what such a span adds to the copy's Python: `_engine_python` timed with the span before
    it and without, alternately after each copy (medians of each). The interpreter's own code
    and data that the span brings back into the caches, the engine's Python would have brought
    back itself: the span's own cold time overstates what it adds by that."""
    emitter = Emitter(replica_resource("r1", kv=KV), SpanBatcher(_Keep(), max_queue=(2 * REPEATS + 3) * spans))
    pages = [page(i) for i in range(COLD_PAGES)]
    source, target = bytearray(COLD_COPY_BYTES), bytearray(COLD_COPY_BYTES)

    def span(n: int) -> None:
        op = emitter.operation(Op.STORE, hook=Hook.SIMULATOR, request_id=f"q{n}", tokens_requested=8192)
        for p in pages:
            op.add_page(p)
        op.end(tokens_stored=8192)

    def per_span(evict: bool) -> float:
        cpu = 0.0
        for n in range(spans):
            if evict:
                target[:] = source
            started = time.thread_time()
            span(n)
            cpu += time.thread_time() - started
        emitter._batcher.exporter.spans.clear()  # type: ignore[attr-defined]
        return 1e6 * cpu / spans

    def copy_then_engine(n: int, with_span: bool) -> float:
        target[:] = source
        started = time.thread_time()
        if with_span:
            span(n)
        _engine_python(ENGINE_OBJECTS)
        return time.thread_time() - started

    per_span(False)  # warm-up
    hot = min(per_span(False) for _ in range(REPEATS))
    cold = min(per_span(True) for _ in range(REPEATS))
    with_span: list[float] = []
    without: list[float] = []
    for n in range(2 * spans):  # which comes first alternates too
        for spanned in (n % 2 == 0, n % 2 == 1):
            (with_span if spanned else without).append(copy_then_engine(n, spanned))
    emitter.shutdown()
    return hot, cold, 1e6 * (statistics.median(with_span) - statistics.median(without))


# A replica's trace volume (docs/design.md section 5: about 1,300 descriptors a second),
# as requests of a 10 ms engine step: one span naming 13 pages and two with none; each
# step waits with the GIL released STEP_WAITS times (GPU kernels, torch operations), with a
# little Python after each.
STEP_WAITS, WAIT_S = 20, 0.0005
STEP_PAGES = 13
Waits = tuple[float, float, float, int]


def _serving_waits(seconds: float, exporter: SpanExporter, emit: bool, give_way: bool) -> Waits:
    """Of a serving-like loop: µs a step spends getting the GIL back after its waits (beyond
    the waits themselves), the 99.9th percentile and the longest of those, and the steps run."""
    # Without giving way: the worker never pauses, and batches are as long as they were.
    batcher = (
        SpanBatcher(exporter)
        if give_way
        else SpanBatcher(exporter, max_batch_events=16384, give_way=GiveWay(slice_s=float("inf")))
    )
    emitter = Emitter(replica_resource("r1", kv=KV), batcher)
    pages = [page(i) for i in range(STEP_PAGES)]
    lates: list[float] = []
    steps = 0
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        if emit:
            for n in range(3):
                op = emitter.operation(Op.FETCH, hook=Hook.SIMULATOR, request_id=f"q{steps}", tokens_requested=1024)
                for p in pages if n == 0 else ():
                    op.add_page(p)
                op.end(Outcome.HIT, tokens_hit=1024)
        for _ in range(STEP_WAITS):
            started = time.perf_counter()
            time.sleep(WAIT_S)
            lates.append(time.perf_counter() - started - WAIT_S)
            sum(range(50))
        steps += 1
    emitter.shutdown()
    lates.sort()
    return 1e6 * sum(lates) / steps, 1e6 * lates[int(0.999 * (len(lates) - 1))], 1e6 * lates[-1], steps


def _gil_waits(seconds: float) -> dict[str, Waits]:
    """`_serving_waits` of the loops, alternating twice; each one's least disturbed run.

    The exporter writes a trace file (`file`), giving way and not; or sends OTLP/HTTP to
    `kvaudit collect` in a process of its own, as `otlp:` does (`otlp`: kvaudit's encoding,
    giving way) and as the official exporter does alone (`official`).
    """
    runs: dict[str, list[Waits]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        receiver = Receiver(Path(tmp) / "received", free_port(), "--no-fsync")
        endpoint = f"http://127.0.0.1:{receiver.port}/v1/traces"
        try:
            for _ in range(sized(2, 1)):
                runs["none"].append(_serving_waits(seconds, _Keep(), emit=False, give_way=True))
                for give_way in (False, True):
                    on = "on" if give_way else "off"
                    file = OTLPJsonFileExporter(Path(tmp) / f"waits-{on}.jsonl")
                    runs[f"file {on}"].append(_serving_waits(seconds, file, emit=True, give_way=give_way))
                ours, official = OTLPHttpExporter(endpoint=endpoint), OTLPSpanExporter(endpoint=endpoint)
                runs["otlp on"].append(_serving_waits(seconds, ours, emit=True, give_way=True))
                runs["otlp official"].append(_serving_waits(seconds, official, emit=True, give_way=True))
        finally:
            receiver.stop()
    return {name: min(results) for name, results in runs.items()}


def main() -> None:
    print(machine())
    spans = env_int("KVAUDIT_BENCH_SPANS", 2000, 10)
    ours_pages, ours_bare = _kvaudit(spans, PAGES_PER_SPAN), _kvaudit(spans, 0)
    sdk_pages, sdk_bare = _sdk(spans, PAGES_PER_SPAN), _sdk(spans, 0)
    per_page_us = 1e6 * (ours_pages - ours_bare) / (spans * PAGES_PER_SPAN)
    sdk_page_us = 1e6 * (sdk_pages - sdk_bare) / (spans * PAGES_PER_SPAN)
    per_span_us, sdk_span_us = 1e6 * ours_bare / spans, 1e6 * sdk_bare / spans
    transfer_us = 1e6 * CostModel().transfer_s(PAGE_BYTES)
    alone, end_to_end = _export(max(spans // 4, 10))
    hot_us, cold_us, adds_us = _cold(max(spans // 10, 10))
    ours_otlp_us, official_otlp_us = _otlp_encoding(max(spans // 4, 32))
    waits = _gil_waits(env_int("KVAUDIT_BENCH_WAIT_SECONDS", 10, 1))
    print(
        f"{spans} spans of {PAGES_PER_SPAN} page descriptors, best of {REPEATS}; 27B page: {PAGE_BYTES / 2**20:.0f} MiB"
    )
    report(
        [
            (
                "µs per page descriptor",
                f"{per_page_us:.2f}",
                f"{sdk_page_us:.2f} (SDK add_event)",
                f"{sdk_page_us / per_page_us:.1f}× cheaper",
                "≤ 5 µs",
            ),
            (
                "µs per span",
                f"{per_span_us:.2f}",
                f"{sdk_span_us:.2f} (SDK bare span)",
                f"{sdk_span_us / per_span_us:.1f}× cheaper",
                "≤ 30 µs",
            ),
            (
                "share of a 27B page's transfer",
                f"{per_page_us / transfer_us:.5%}",
                f"{transfer_us:.0f} µs at 25 GB/s",
                "",
                "< 1%",
            ),
            (
                f"µs per span of {COLD_PAGES}, after a {COLD_COPY_BYTES // 2**20} MiB copy (CPU)",
                f"{cold_us:.1f}",
                f"{hot_us:.1f} (hot loop)",
                f"{cold_us / hot_us:.1f}× the hot loop",
                "",
            ),
            (
                "µs such a span adds to the engine's Python after the copy (CPU)",
                f"{adds_us:.1f}",
                f"{cold_us:.1f} (its own time, above)",
                f"{adds_us / cold_us:.0%} of its own time",
                "",
            ),
            (
                "µs per descriptor encoding an OTLP/HTTP request",
                f"{ours_otlp_us:.2f}",
                f"{official_otlp_us:.2f} (official encoder)",
                f"{official_otlp_us / ours_otlp_us:.1f}× cheaper",
                "",
            ),
            ("export, descriptors/s (exporter alone)", f"{alone:,.0f}", "", "", ""),
            ("export, descriptors/s (emitter + thread + file)", f"{end_to_end:,.0f}", "", "", ""),
        ]
    )
    none = waits["none"]
    print(
        f"The serving thread's waits for the GIL, {STEP_WAITS} waits of {WAIT_S * 1e6:.0f} µs a 10 ms step, "
        f"{STEP_PAGES} descriptors a step (about {none[3]} steps a run), least disturbed of two runs; "
        f"emitting nothing: 99.9th percentile {none[1]:.0f} µs, longest {none[2]:.0f} µs:"
    )
    rows = []
    for export, other, against in (("file", "off", "not"), ("otlp", "official", "the official exporter")):
        on, off = waits[f"{export} on"], waits[f"{export} {other}"]
        rows += [
            (
                f"{export}: µs a step getting the GIL back, beyond emitting nothing",
                f"{on[0] - none[0]:.0f} (giving way)",
                f"{off[0] - none[0]:.0f} ({against})",
                "",
                "",
            ),
            (
                f"{export}: 99.9th percentile wait, µs",
                f"{on[1]:.0f}",
                f"{off[1]:.0f}",
                f"{off[1] / on[1]:.1f}× less",
                "",
            ),
            (f"{export}: longest wait, µs", f"{on[2]:.0f}", f"{off[2]:.0f}", f"{off[2] / on[2]:.1f}× less", ""),
        ]
    report(rows)
