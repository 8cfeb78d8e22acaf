"""The page scanner (the reader's fast path) reads exactly what msgspec's full decode reads.

Random OTLP JSON lines, in every form a writer may use (member order, spacing, escapes,
non-ASCII text, numbers or strings for int64s, nulls, missing and repeated attributes,
unknown value kinds, non-page events, what msgspec rejects), are read twice: with the
scanner (lines it gives up on get msgspec's full decode) and with msgspec's full decode
alone. The tables must be equal.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvaudit.contract import EVENT_PAGE, PAGE_COLUMNS, Hook, Op, Res
from kvaudit.emit.setup import setup_emitter
from kvaudit.otlp.limits import MAX_ATTRIBUTES
from kvaudit.read import page_scan, reader, scan_json
from kvaudit.read.reader import read_range
from kvaudit.read.store import TraceStore

from ..support.pages import KV, full_page

# Lines are drawn plain (what writers write: the scanner's own ground) or odd (anything valid).
PLAIN_TEXT = st.text(alphabet=st.sampled_from(list("ab/_:. 0")), max_size=6)
ODD_TEXT = st.text(alphabet=st.sampled_from(list('ab/_:"\\é\u2028\U0001f600\n')), max_size=6)
INT64 = st.integers(-(2**63), 2**63 - 1)


def _int_value(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(INT64)
    return draw(st.sampled_from([{"intValue": str(n)}, {"intValue": n}, {"intValue": None}, {}]))


@st.composite
def _value(draw: st.DrawFn, kind: str, plain: bool) -> dict[str, Any] | None:
    """An AnyValue for a column of `kind`, or of another kind, or nothing (None: no `value`)."""
    choice = draw(st.integers(0, 30 if plain else 9))
    if choice == 0:
        return None
    if choice == 1 and not plain:
        return draw(
            st.sampled_from(
                [
                    {"doubleValue": 1.5},
                    {"doubleValue": "NaN"},
                    {"bytesValue": "AAE="},
                    {"kvlistValue": {"values": [{"key": "a", "value": {"intValue": "1"}}]}},
                    {"arrayValue": {"values": [{"stringValue": "a"}]}},
                    {"stringValue": None, "boolValue": None},
                    {"other": [1, {"x": "}"}]},
                ]
            )
        )
    if kind == "str":
        return {"stringValue": draw(PLAIN_TEXT if plain else ODD_TEXT)}
    if kind == "int":
        return _int_value(draw)
    if kind == "bool":
        return {"boolValue": draw(st.sampled_from([True, False, None]))}
    items = [_int_value(draw) for _ in range(draw(st.integers(0, 4)))]
    return draw(st.sampled_from([{"arrayValue": {"values": items}}, {"arrayValue": {}}, {"arrayValue": None}]))


@st.composite
def _attributes(draw: st.DrawFn, plain: bool) -> list[dict[str, Any]]:
    attributes = []
    for name, kind in PAGE_COLUMNS.values():
        for _ in range(draw(st.sampled_from([0, 1, 1, 1, 1, 1, 1, 2]))):  # absent, once, repeated
            value = draw(_value(kind, plain))
            attribute: dict[str, Any] = {"key": name} if value is None else {"key": name, "value": value}
            if draw(st.integers(0, 9)) == 0:
                attribute = dict(reversed(attribute.items()))
            attributes.append(attribute)
    attributes.append({"key": "kvaudit.page.extra", "value": {"stringValue": draw(PLAIN_TEXT)}})
    draw(st.randoms()).shuffle(attributes)
    return attributes


@st.composite
def _event(draw: st.DrawFn, plain: bool) -> dict[str, Any]:
    time = draw(st.integers(0, 2**63 - 1))
    event = {
        "timeUnixNano": draw(st.sampled_from([str(time), time])),
        "name": draw(
            st.sampled_from([EVENT_PAGE, EVENT_PAGE, "exception", *([] if plain else ["kvaudit.pag\\u0065"])])
        ),
        "attributes": draw(_attributes(plain)),
        "droppedAttributesCount": draw(st.integers(0, 3)),
    }
    if not plain and draw(st.integers(0, 5)) == 0:  # what msgspec rejects: the line is an error
        event.update(
            draw(
                st.sampled_from(
                    [
                        {"timeUnixNano": None},
                        {"timeUnixNano": 1.5},
                        {"attributes": {}},
                        {"attributes": [{"value": {}}]},
                        {"name": 5},
                        {"droppedAttributesCount": "1"},
                        {"attributes": [{"key": "kvaudit.page.used", "value": {"boolValue": 1}}]},
                        {"attributes": [{"key": "kvaudit.page.rank", "value": {"intValue": 2.5}}]},
                        {"attributes": [{"key": "kvaudit.page.key", "value": {"stringValue": 7}}]},
                        {"attributes": [{"key": "kvaudit.page.key", "value": None}]},
                    ]
                )
            )
        )
    items = list(event.items())
    draw(st.randoms()).shuffle(items)
    return dict(items)


def _resource() -> dict[str, Any]:
    attributes = [
        {"key": Res.REPLICA, "value": {"stringValue": "r1"}},
        {"key": Res.KV_MODEL, "value": {"stringValue": KV.model}},
    ]
    return {"attributes": attributes}


@st.composite
def _line(draw: st.DrawFn) -> str:
    plain = draw(st.integers(0, 3)) > 0
    spans = [
        {
            "traceId": f"{n:032x}",
            "spanId": f"{n + 1:016x}",
            "name": "kvaudit.fetch",
            "startTimeUnixNano": "1",
            "endTimeUnixNano": 2,
            "events": draw(st.lists(_event(plain), max_size=3)),
        }
        for n in range(draw(st.integers(0, 3)))
    ]
    data = {"resourceSpans": [{"resource": _resource(), "scopeSpans": [{"scope": {"name": "k"}, "spans": spans}]}]}
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\t", " :\r ")]))
    text = json.dumps(data, separators=separators, ensure_ascii=draw(st.booleans()))
    # The escaped event name must reach the file as an escape, not as what it stands for.
    return text.replace("kvaudit.pag\\\\u0065", "kvaudit.pag\\u0065")


def _read(path: Path, scan: bool = True) -> dict[str, list[dict[str, Any]]]:
    tables, _, _ = read_range(str(path), 0, path.stat().st_size, True, scan)
    return {name: getattr(tables, name).to_pylist() for name in ("resources", "spans", "pages", "errors")}


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(_line(), min_size=1, max_size=4))
def test_the_scanner_reads_what_the_general_decoder_reads(lines: list[str], tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("scan") / "traces.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert _read(path, scan=True) == _read(path, scan=False)


# What breaks JSON where it is written: brackets, quotes, separators, escapes, bad numbers,
# control characters, non-ASCII text, a line break (a line cut in two).
BREAKERS = st.sampled_from(list('"{}[],:\\ 0-.e\t\x01\né'))


@settings(max_examples=400, deadline=None)
@given(line=_line(), data=st.data())
def test_a_broken_line_reads_as_the_general_decoder_reads_it(
    line: str, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
):
    """Lines the scanner reads strictly reach msgspec without their events: the scanner
    must then reject every malformed byte there, as msgspec would."""
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(line)))
        kind = data.draw(st.sampled_from(["delete", "insert", "replace"]))
        line = line[:at] + ("" if kind == "delete" else data.draw(BREAKERS)) + line[at + (kind != "insert") :]
    path = tmp_path_factory.mktemp("broken") / "traces.jsonl"
    path.write_text(line + data.draw(st.sampled_from(["\n", ""])), encoding="utf-8")  # "": a truncated last line
    assert _read(path, scan=True) == _read(path, scan=False)


def test_a_page_event_past_the_attribute_limit_is_named_scanned_or_not(trace_dir: Path):
    path = trace_dir / "r1.jsonl"
    emitter = setup_emitter("r1", f"file:{path}", engine="vllm", kv=KV)
    with emitter.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id="q") as op:
        op.add_page(full_page("0" * 64, 0))
    emitter.shutdown()
    data = json.loads(path.read_bytes().splitlines()[0])
    event = data["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["events"][0]
    event["attributes"] += [{"key": f"x{n}", "value": {"intValue": "1"}} for n in range(MAX_ATTRIBUTES)]
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    read = _read(path, scan=True)
    assert read == _read(path, scan=False)
    assert read["pages"] == [] and "attributes of one event, more than the 1024" in read["errors"][0]["reason"]


def test_what_kvaudit_writes_never_needs_the_general_decoder(trace_dir: Path):

    path = trace_dir / "r1.jsonl"
    emitter = setup_emitter("r1", f"file:{path}", engine="vllm", kv=KV)
    with emitter.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id="q") as op:
        for n in range(4):
            op.add_page(full_page(f"{n:064x}", n, used=bool(n % 2)))
    emitter.shutdown()
    data = path.read_bytes()
    buf = np.frombuffer(bytearray(data + bytes(scan_json.PAD)), dtype=np.uint8)  # writable, as the reader passes it
    scanned = reader.page_scanner().scan(buf, [0], [len(data) - 1])
    assert scanned.spans.tolist() == [1] and scanned.strict.all() and len(scanned.line) == 4
    assert scanned.columns[list(PAGE_COLUMNS).index("shape")].to_pylist()[0] == [2, 2, 32, 64]


def test_lines_the_scanner_gives_up_on_keep_their_place(tmp_path: Path):
    rng = random.Random(7)
    page = {"timeUnixNano": "5", "name": EVENT_PAGE, "attributes": [{"key": "kvaudit.page.key", "value": {}}]}
    lines = []
    for n in range(6):
        key = "k\\u00e9" if n % 2 else "k"  # an escape: the general decoder's line
        event = json.loads(json.dumps(page))
        event["attributes"][0]["value"] = {"stringValue": f"{key}{n}"}
        span = {"traceId": f"{n:032x}", "spanId": f"{n + 1:016x}", "events": [event] * rng.randint(1, 3)}
        line = json.dumps({"resourceSpans": [{"resource": _resource(), "scopeSpans": [{"spans": [span]}]}]})
        lines.append(line.replace("\\\\u00e9", "\\u00e9"))
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    pages = _read(path)["pages"]
    assert [row["line"] for row in pages] == sorted(row["line"] for row in pages)
    assert {row["key"] for row in pages} == {f"k{n}" if n % 2 == 0 else f"k\u00e9{n}" for n in range(6)}


def test_the_store_reads_the_same_pages_either_way(trace_dir: Path, monkeypatch: pytest.MonkeyPatch):
    for replica in ("r1", "r2"):
        emitter = setup_emitter(replica, f"file:{trace_dir / replica}.jsonl", engine="vllm", kv=KV)
        for n in range(3):
            with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id=f"{replica}-{n}") as op:
                for index in range(5):
                    op.add_page(full_page(f"{n:032x}{index:032x}", index, used=index % 2 == 0))
            emitter.flush()
        emitter.shutdown()
    query = "SELECT * FROM pages ORDER BY replica, line, time_ns, key"
    results = []
    for scan_min_bytes in (0, 1 << 62):
        monkeypatch.setattr(reader, "SCAN_MIN_BYTES", scan_min_bytes)
        store = TraceStore([trace_dir])
        store.refresh()
        results.append(store.query(query))
        store.close()
    assert results[0] == results[1] and len(results[0][1]) == 30


def test_a_scan_leaves_what_an_earlier_scan_returned_alone(trace_dir: Path):
    """Scans reuse their arrays (page_scan._Scratch): nothing returned may share them."""
    scanner = reader.page_scanner.__wrapped__()  # its own: its arrays serve only these scans
    scans, expected = [], []
    for replica in ("r1", "r2"):  # the second buffer is the smaller: it gets the first one's arrays
        path = trace_dir / f"{replica}.jsonl"
        emitter = setup_emitter(replica, f"file:{path}", engine="vllm", kv=KV)
        with emitter.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id=replica) as op:
            for n in range(5 if replica == "r1" else 3):
                op.add_page(full_page(f"{replica}{n:062x}", 10 * n + len(replica), used=bool(n % 2)))
        emitter.shutdown()
        data = path.read_bytes()
        scanned = scanner.scan(np.frombuffer(bytearray(data + bytes(scan_json.PAD)), np.uint8), [0], [len(data) - 1])
        scans.append(scanned)
        expected.append(_scanned(scanned))
    assert expected[0] != expected[1]
    assert [_scanned(scanned) for scanned in scans] == expected


def _scanned(scanned: page_scan.PageColumns) -> list[Any]:
    arrays = (scanned.line, scanned.span, scanned.time_ns, scanned.spans, scanned.strict, scanned.cuts)
    return [column.to_pylist() for column in scanned.columns] + [array.tolist() for array in arrays]
