"""The exporter thread gives way to serving threads between spans (kvaudit.emit.give_way).

How long serving waits with and without is measured in bench/bench_emission.py, not here.
"""

from __future__ import annotations

import threading

from opentelemetry.sdk.trace.export import SpanExportResult

from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
from kvaudit.emit import give_way
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.file_exporter import OTLPJsonFileExporter
from kvaudit.emit.give_way import GiveWay
from kvaudit.emit.setup import replica_resource
from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.otlp.encode import line_to_traces_data, spans_to_line

from ..support.capture import Capture, FakeTime


def test_it_sleeps_only_once_a_slice_has_run_then_starts_another():
    fake = FakeTime()
    turns = GiveWay(0.001, 0.00005, clock=fake.clock, sleep=fake.sleep)
    fake.now += 0.0004
    turns()
    assert fake.sleeps == []
    fake.now += 0.0007  # 1.1 ms since the slice began
    turns()
    assert fake.sleeps == [0.00005] and turns.pauses == 1
    fake.now += 0.0009
    turns()
    assert len(fake.sleeps) == 1  # the new slice began after the pause
    fake.now += 0.01  # the thread waited: no GIL held meanwhile
    turns.resume()
    turns()
    assert len(fake.sleeps) == 1


def test_a_thread_gives_way_only_where_it_was_installed():
    mine = GiveWay()
    seen: list[GiveWay | None] = []

    def other() -> None:
        seen.append(give_way.current())

    give_way.install(mine)
    try:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert give_way.current() is mine and seen == [None]
    finally:
        give_way.install(None)
    assert give_way.current() is None


def _emit(emitter: Emitter, spans: int, pages: int) -> None:
    for n in range(spans):
        with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id=f"q{n}") as op:
            for i in range(pages):
                op.add_page(PageDescriptor(key=f"{n}-{i}"))
            op.end(Outcome.HIT)


def test_the_exporter_thread_gives_way_between_spans_and_its_exporter_finds_it():
    fake = FakeTime()
    turns = GiveWay(0.0, 0.0, clock=fake.clock, sleep=fake.sleep)  # a pause at every chance
    found: list[GiveWay | None] = []

    class Finds(Capture):
        def export(self, spans):
            found.append(give_way.current())
            return super().export(spans)

    capture = Finds()
    emitter = Emitter(
        replica_resource("r1"), SpanBatcher(capture, delay_s=60, give_way=turns), telemetry_interval_s=3600
    )
    _emit(emitter, spans=5, pages=3)
    emitter.flush()
    assert found and all(turns_seen is turns for turns_seen in found)
    # At least once per span taken (and built), and once per batch exported.
    assert turns.pauses >= 5 + len(found)
    assert len(capture.spans) == 5
    emitter.shutdown()
    # Nothing on this thread was made to give way.
    assert give_way.current() is None


def test_a_line_encoded_span_by_span_calls_back_after_each_and_reads_back_the_same():
    capture = Capture()
    emitter = Emitter(replica_resource("r1"), SpanBatcher(capture, delay_s=60), telemetry_interval_s=3600)
    _emit(emitter, spans=4, pages=2)
    emitter.flush()
    calls: list[int] = []
    with_calls = spans_to_line(capture.spans, lambda: calls.append(1))
    assert len(calls) == len(capture.spans)
    assert line_to_traces_data(with_calls) == line_to_traces_data(spans_to_line(capture.spans))
    emitter.shutdown()


def test_the_file_exporter_gives_way_as_it_encodes_on_a_thread_that_does(tmp_path):
    capture = Capture()
    emitter = Emitter(replica_resource("r1"), SpanBatcher(capture, delay_s=60), telemetry_interval_s=3600)
    _emit(emitter, spans=3, pages=2)
    emitter.flush()
    fake = FakeTime()
    turns = GiveWay(0.0, 0.0, clock=fake.clock, sleep=fake.sleep)
    exporter = OTLPJsonFileExporter(tmp_path / "r1.jsonl")
    give_way.install(turns)
    try:
        assert exporter.export(capture.spans) is SpanExportResult.SUCCESS
    finally:
        give_way.install(None)
    assert turns.pauses == len(capture.spans)
    assert exporter.export(capture.spans) is SpanExportResult.SUCCESS  # a thread that does not: no pause
    assert turns.pauses == len(capture.spans)
    exporter.shutdown()
    emitter.shutdown()
    lines = (tmp_path / "r1.jsonl").read_bytes().splitlines()
    assert len(lines) == 2 and line_to_traces_data(lines[0]) == line_to_traces_data(lines[1])
