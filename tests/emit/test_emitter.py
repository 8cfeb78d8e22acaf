"""Emission through the real SDK pieces and file exporter, read back through DuckDB."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from kvaudit.contract import Hook, Op, Outcome, PageAttr, PageDescriptor, SpanAttr, TelemetryAttr
from kvaudit.emit import emitter as emitter_module
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.line_file import LineFile
from kvaudit.emit.setup import exporter_for, replica_resource, setup_emitter
from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.otlp.encode import line_to_traces_data, spans_to_line
from kvaudit.read.store import TraceStore

from ..support.capture import Capture
from ..support.pages import KV, full_page


class Broken(SpanExporter):
    def export(self, spans):
        raise RuntimeError("collector on fire")

    def shutdown(self) -> None:
        pass


def _emit_two_replicas(trace_dir: Path) -> dict[str, list[PageDescriptor]]:
    sent: dict[str, list[PageDescriptor]] = {"store": [], "fetch": []}
    r1 = setup_emitter("r1", f"file:{trace_dir}/{{replica}}.jsonl", engine="vllm", engine_version="0.32.0", kv=KV)
    r2 = setup_emitter("r2", f"file:{trace_dir}/r2.jsonl", engine="vllm", kv=KV)
    with r1.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id="req-1", backend="vllm.example_connector") as op:
        for i in range(3):
            page = full_page(f"{i:064x}", i)
            sent["store"].append(page)
            op.add_page(page)
        op.end(Outcome.HIT, tokens_stored=96)
    with r2.operation(
        Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id="req-2", backend="vllm.example_connector", tokens_requested=100
    ) as op:
        for i in range(3):
            page = full_page(f"{i:064x}", i, used=True)
            sent["fetch"].append(page)
            op.add_page(page)
        # A bare raw-pointer page: only what it carried.
        bare = PageDescriptor(key="ff" * 32, used=True, transfer="raw_ptr", address=0x7F00DEAD0000)
        sent["fetch"].append(bare)
        op.add_page(bare)
        op.end(Outcome.PARTIAL, tokens_hit=96)
    r1.shutdown()
    r2.shutdown()
    return sent


def test_round_trip_every_field_equal(trace_dir: Path):
    sent = _emit_two_replicas(trace_dir)
    store = TraceStore([trace_dir])
    store.refresh()
    columns, rows = store.query("SELECT * FROM pages ORDER BY op DESC, token_start NULLS LAST")
    got = [dict(zip(columns, row)) for row in rows]
    expected = sent["store"] + sent["fetch"]
    assert len(got) == len(expected)
    for row, page in zip(got, expected):
        back = PageDescriptor.from_attributes(
            {attr: row[field] for field, attr in _page_attr_names().items() if row[field] is not None}
        )
        assert back == page
    store_row = got[0]
    assert (store_row["replica"], store_row["op"], store_row["request_id"]) == ("r1", "store", "req-1")
    _, spans = store.query(
        "SELECT replica, op, tokens_requested, tokens_hit, pages, bytes, outcome FROM spans "
        "WHERE op IS NOT NULL ORDER BY replica"
    )
    assert spans == [
        ("r1", "store", None, None, 3, 3 * 16384, "hit"),
        ("r2", "fetch", 100, 96, 4, 3 * 16384, "partial"),
    ]
    _, replicas = store.query(
        "SELECT replica, engine, engine_version, model, layout, head_size FROM replicas ORDER BY 1"
    )
    assert replicas == [
        ("r1", "vllm", "0.32.0", "tiny-llama", "NB_NH_BS_2HS", 32),
        ("r2", "vllm", None, "tiny-llama", "NB_NH_BS_2HS", 32),
    ]
    _, [(dtype, shape, transfer)] = store.query(f"SELECT dtype, shape, transfer FROM pages WHERE key = '{'ff' * 32}'")
    assert (dtype, shape, transfer) == (None, None, "raw_ptr")


def _page_attr_names() -> dict[str, str]:
    return {field: getattr(PageAttr, field.upper()) for field in PageDescriptor.__struct_fields__}


def test_every_line_is_otlp_traces_data_with_hex_ids(trace_dir: Path):
    _emit_two_replicas(trace_dir)
    lines = [line for path in sorted(trace_dir.iterdir()) for line in path.read_bytes().splitlines()]
    assert lines
    for line in lines:
        data = line_to_traces_data(line)
        raw = json.loads(line)
        span = raw["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        assert len(span["traceId"]) == 32 and int(span["traceId"], 16)
        assert len(span["spanId"]) == 16 and int(span["spanId"], 16)
        assert isinstance(span["startTimeUnixNano"], str) and isinstance(span["kind"], int)
        assert data.resource_spans[0].scope_spans[0].spans[0].trace_id.hex() == span["traceId"]


def test_lines_equal_the_official_otlp_encoder():
    capture = Capture()
    emitter = Emitter(replica_resource("r1", engine="vllm", kv=KV), SpanBatcher(capture))
    with emitter.operation(Op.FETCH, hook=Hook.LMCACHE_ENGINE, request_id="q", tokens_requested=64) as op:
        op.add_page(full_page("aa", used=False))
        op.add_page(PageDescriptor(key="bb", shape=(), used=True))
        op.end(Outcome.REJECTED, tokens_hit=0)
    emitter.operation(Op.STORE, hook=Hook.LMCACHE_ENGINE).end()
    emitter.flush()
    ours = line_to_traces_data(spans_to_line(capture.spans))
    official = TracesData(resource_spans=encode_spans(capture.spans).resource_spans)
    assert ours == official


@pytest.mark.parametrize("kept", [8192, 3])  # 3: dropped whole at nearly every span
def test_attributes_encoded_once_are_told_apart_by_type_and_still_equal_the_official_encoder(
    monkeypatch: pytest.MonkeyPatch, kept: int
):
    from kvaudit.otlp import encode, encode_protobuf

    caches = (encode._KEY_VALUES, encode_protobuf._KEY_VALUES)
    for cache in caches:
        monkeypatch.setattr(cache, "_kept", {})
        monkeypatch.setattr(cache, "most", kept)
    capture = Capture()
    emitter = Emitter(replica_resource("r1"), SpanBatcher(capture))
    # Equal as Python values and as keys of a dict, not as attributes: an int, a bool, a float.
    # Lists and mappings cannot be kept, nor long strings and tuples (a key is a page's own).
    for value in (1, True, 1.0, 1, [1, 2], (1, 2), "1", True, "k" * 64, "k" * 64, tuple(range(64)), ([1],)):
        emitter.operation(Op.STORE, hook=Hook.LMCACHE_ENGINE, attributes={"kvaudit.x": value}).end()
    emitter.flush()
    official = encode_spans(capture.spans)
    assert line_to_traces_data(spans_to_line(capture.spans)) == TracesData(resource_spans=official.resource_spans)
    assert encode_protobuf.spans_to_request(capture.spans) == official.SerializeToString()
    for cache in caches:
        values = [value for name, _, value in cache._kept if name == "kvaudit.x"]
        assert all(not isinstance(value, str | tuple) or len(value) <= 48 for value in values)
        assert values or kept == 3


def test_exceptions_inside_emission_never_reach_the_caller(caplog: pytest.LogCaptureFixture):
    capture = Capture()
    emitter = Emitter(replica_resource("r1"), SpanBatcher(capture))
    with caplog.at_level(logging.WARNING):
        op = emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR)
        op.add_page("not a descriptor")  # type: ignore[arg-type]
        op.end(Outcome.HIT)
        emitter.flush()  # summing bytes over a bad page fails inside, where the exporter builds the span
    assert (emitter.stats.errors, emitter.stats.dropped_spans) == (1, 1)
    assert [span.name for span in capture.spans] == [TelemetryAttr.SPAN_NAME]  # the loss, reported
    assert "emission failed" in caplog.text


def test_the_callers_own_exception_propagates_and_is_recorded():
    capture = Capture()
    emitter = Emitter(replica_resource("r1"), SpanBatcher(capture))
    with pytest.raises(KeyError), emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR):
        raise KeyError("engine failure")
    emitter.flush()
    assert capture.spans[0].attributes[SpanAttr.OUTCOME] == "error"
    assert emitter.stats.errors == 0


@pytest.mark.parametrize("current", ["copied", "opentelemetry's own"])
def test_an_operation_is_the_child_of_the_span_current_when_it_started(current: str, monkeypatch: pytest.MonkeyPatch):
    if current != "copied":
        # A runtime context other than OpenTelemetry's default: its own `get_current`.
        monkeypatch.setattr(emitter_module, "_current_context", otel_context.get_current)
    capture = Capture()
    emitter = Emitter(replica_resource("r1"), SpanBatcher(capture))
    outer = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags.SAMPLED)
    with trace.use_span(NonRecordingSpan(outer)):
        inside = emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR)
    # Ended (and built) after the context was left: the parent is the one it started in.
    inside.end(Outcome.HIT)
    emitter.operation(Op.LOOKUP, hook=Hook.VLLM_CONNECTOR).end(Outcome.MISS)
    emitter.flush()
    child, root = capture.spans
    assert child.parent == outer and child.context.trace_id == outer.trace_id
    assert root.parent is None and root.context.trace_id not in (0, outer.trace_id)


def test_two_threads_find_the_parent_in_a_copied_context_at_once(monkeypatch: pytest.MonkeyPatch):
    # The operation's exporter thread (`build`) and a child's (`context`) may look for its parent
    # at the same time: a copied context entered by two threads at once would raise.
    emitter = Emitter(replica_resource("r1"), SpanBatcher(Capture()))
    outer = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags.SAMPLED)
    with trace.use_span(NonRecordingSpan(outer)):
        operation = emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR)
    inside, release = threading.Event(), threading.Event()
    original = otel_context.get_current

    def slow_current() -> Any:
        inside.set()
        release.wait(5)
        return original()

    monkeypatch.setattr(emitter_module.otel_context, "get_current", slow_current)
    found: list[Any] = []

    def look() -> None:
        try:
            found.append(operation.parent_context)
        except Exception as exc:
            found.append(exc)

    first = threading.Thread(target=look)
    first.start()
    assert inside.wait(5)
    second = threading.Thread(target=look)
    second.start()
    time.sleep(0.1)  # the second thread reaches the copied context while the first is in it
    release.set()
    first.join(5)
    second.join(5)
    emitter.shutdown()
    assert found == [outer, outer]


def test_an_open_operation_is_a_parent_and_its_context_is_its_spans():
    capture = Capture()
    emitter = Emitter(replica_resource("r1"), SpanBatcher(capture))
    above = emitter.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR)
    below = emitter.operation(Op.STORE, hook=Hook.LMCACHE_BACKEND, parent=above)
    invalid = emitter.operation(Op.STORE, hook=Hook.LMCACHE_BACKEND, parent=trace.INVALID_SPAN_CONTEXT)
    for op in (below, invalid, above):
        op.end(Outcome.HIT)
    emitter.flush()
    child, orphan, parent = capture.spans
    assert child.parent == parent.context == above.context
    assert child.context.trace_id == parent.context.trace_id and child.context == below.context
    # An invalid parent is none: a trace of its own, not trace id 0.
    assert orphan.parent is None and orphan.context.is_valid


def test_an_operation_recorded_in_one_call_is_the_span_the_three_calls_make():
    capture = Capture()
    emitter = Emitter(replica_resource("r1"), SpanBatcher(capture))
    page = full_page("ab" * 32, 0)
    above = emitter.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR)
    given = {"request_id": "q1", "backend": "lmcache.remote", "tokens_requested": 512, "parent": above}
    op = emitter.operation(Op.FETCH, hook=Hook.LMCACHE_ENGINE, **given)
    op.add_pages(lambda: [page])
    op.end(Outcome.PARTIAL, tokens_hit=256, tokens_local=16)
    started = op._start
    amounts = (256, None, 16, None, None)
    emitter.record(
        Op.FETCH,
        Hook.LMCACHE_ENGINE,
        "q1",
        "lmcache.remote",
        512,
        above,
        started,
        Outcome.PARTIAL,
        amounts,
        lambda: [page],
    )
    # `end` takes the description too: two calls.
    two = emitter.operation(Op.FETCH, hook=Hook.LMCACHE_ENGINE, **given)
    two.end(Outcome.PARTIAL, tokens_hit=256, tokens_local=16, describe=lambda: [page])
    above.end(Outcome.HIT)
    emitter.flush()
    three, one, ended, parent = capture.spans
    assert ended.attributes == three.attributes and len(ended.events) == 1
    assert one.name == three.name and one.attributes == three.attributes
    assert one.attributes[SpanAttr.PAGES] == 1 and one.attributes[SpanAttr.TOKENS_LOCAL] == 16
    assert one.parent == three.parent == parent.context
    assert one.context.trace_id == parent.context.trace_id and one.context.span_id != three.context.span_id
    assert [event.attributes for event in one.events] == [event.attributes for event in three.events]
    assert one.start_time == started <= one.end_time


def test_a_recorded_operation_without_a_parent_is_the_current_spans_child_and_fails_open(
    monkeypatch: pytest.MonkeyPatch,
):
    capture = Capture()
    emitter = Emitter(replica_resource("r1"), SpanBatcher(capture))
    outer = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags.SAMPLED)
    with trace.use_span(NonRecordingSpan(outer)):
        emitter.record(Op.LOOKUP, Hook.VLLM_CONNECTOR, None, None, None, None, 1, Outcome.MISS, (0,) * 5)
    emitter.record(Op.LOOKUP, Hook.VLLM_CONNECTOR, None, None, None, None, 1, Outcome.MISS, (0,) * 5)

    def broken() -> list[PageDescriptor]:
        raise RuntimeError("describe failed")

    # A description that fails is counted, and the span goes without its pages.
    emitter.record(Op.STORE, Hook.LMCACHE_BACKEND, None, None, None, None, 1, Outcome.HIT, (None,) * 5, broken)
    emitter.flush()
    child, root, bare = capture.spans[:3]
    assert child.parent == outer and child.context.trace_id == outer.trace_id
    assert root.parent is None and root.context.is_valid
    assert bare.attributes[SpanAttr.PAGES] == 0 and not bare.events
    # One that cannot even be queued is counted too, never raised.
    monkeypatch.setattr(emitter._batcher, "submit", lambda span, reserved=False: 1 / 0)
    emitter.record(Op.STORE, Hook.LMCACHE_BACKEND, None, None, None, None, 1, Outcome.HIT, (None,) * 5)
    assert emitter.stats.errors == 2


def test_a_failing_exporter_is_counted_and_reported_as_telemetry(trace_dir: Path, capsys: pytest.CaptureFixture[str]):
    broken = Emitter(replica_resource("r1"), SpanBatcher(Broken()))
    with broken.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR) as op:
        op.end(Outcome.MISS)
    assert broken.flush(5)
    stats = broken.stats
    assert stats.failed_exports >= 1 and stats.dropped_spans >= 1
    # The telemetry span reporting the loss could not go either: its counts went to stderr.
    assert "the kvaudit.telemetry span carrying these counts could not be exported" in capsys.readouterr().err
    broken.shutdown()


def test_full_queue_drops_are_counted_and_travel_in_the_trace(trace_dir: Path):
    exporter = exporter_for(f"file:{trace_dir}/r1.jsonl", "r1")
    batcher = SpanBatcher(exporter, max_queue=5, delay_s=60)
    emitter = Emitter(replica_resource("r1"), batcher, telemetry_interval_s=0)
    for _ in range(20):
        emitter.operation(Op.LOOKUP, hook=Hook.VLLM_CONNECTOR).end(Outcome.MISS)
    emitter.shutdown()
    assert emitter.stats.dropped_spans > 0
    store = TraceStore([trace_dir])
    store.refresh()
    _, [(dropped,)] = store.query(
        f"SELECT max(telemetry_dropped_spans) FROM spans WHERE name = '{TelemetryAttr.SPAN_NAME}'"
    )
    assert dropped == emitter.stats.dropped_spans


def test_too_many_pages_are_dropped_visibly():
    capture = Capture()
    emitter = Emitter(replica_resource("r1"), SpanBatcher(capture), max_pages_per_span=2)
    with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR) as op:
        for i in range(5):
            op.add_page(PageDescriptor(key=str(i)))
        op.end(Outcome.HIT)
    emitter.flush()
    span = capture.spans[0]
    assert len(span.events) == 2 and span.dropped_events == 3


def test_batches_are_bounded_by_page_events_so_a_request_fits_a_receivers_body_limit():
    sizes: list[int] = []

    class Batches(Capture):
        def export(self, spans):
            sizes.append(len(spans))
            return super().export(spans)

    capture = Batches()
    batcher = SpanBatcher(capture, max_batch_events=10, delay_s=60)
    emitter = Emitter(replica_resource("r1"), batcher, telemetry_interval_s=3600)
    for pages in (4, 4, 4, 12, 1):  # 12 is more than a batch may hold: it goes alone
        with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR) as op:
            for i in range(pages):
                op.add_page(PageDescriptor(key=str(i)))
            op.end(Outcome.HIT)
    emitter.flush()
    fetches = [span for span in capture.spans if span.name != TelemetryAttr.SPAN_NAME]
    assert [len(span.events) for span in fetches] == [4, 4, 4, 12, 1]
    assert sizes[:3] == [2, 1, 1]  # 4+4; 4 (+12 would pass 10); 12 alone


def test_a_file_is_never_shared_between_two_writers(tmp_path: Path):
    first = LineFile(tmp_path / "r1.jsonl")
    second = LineFile(tmp_path / "r1.jsonl")  # another open description: must not append to the same file
    assert first.path != second.path and str(os.getpid()) in second.path.name
    first.close()
    second.close()


def test_rotation_and_crash_tolerance(tmp_path: Path):
    path = tmp_path / "r1.jsonl"
    path.write_bytes(b'{"resourceSpans":[]}\n{"resourceSp')  # a writer killed mid-line
    writer = LineFile(path, max_bytes=64)
    writer.write(b'{"resourceSpans":[]}\n')
    assert path.read_bytes().endswith(b'{"resourceSp\n{"resourceSpans":[]}\n')
    for _ in range(5):
        writer.write(b'{"resourceSpans":[]}\n')
    writer.close()
    files = sorted(tmp_path.iterdir())
    assert len(files) > 1
    assert all(f.read_bytes().endswith(b"\n") for f in files)


def test_export_spec_errors():
    with pytest.raises(ValueError, match="expected file:PATH or otlp:URL"):
        exporter_for("kafka:topic", "r1")
    with pytest.raises(ValueError, match="replica id"):
        setup_emitter("", "file:/tmp/x.jsonl")
