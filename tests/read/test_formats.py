"""Every form of OTLP JSON trace file a writer makes is read in place (issue 18, item 6):
gzip and zstd (the Collector's `compression`, and its older length-prefixed zstd frames),
pretty-printed documents, JSON with spaces after its separators, many small files; a file
kvaudit cannot read is named, never skipped (docs/design.md section 3.1).

Each form is read with the page scanner and with msgspec's full decode alone, and must
give the rows the same lines give as compact OTLP JSON lines.
"""

from __future__ import annotations

import bz2
import gzip
import json
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pytest

from kvaudit.cli import main
from kvaudit.otlp.schema import DECODER
from kvaudit.read import files, reader, scan_json, sources
from kvaudit.read.files import expand_paths
from kvaudit.read.store import TraceStore

from ..support.hostile import _span, good_lines

LINES = 6


@pytest.fixture(params=[True, False], ids=["scanner", "msgspec"])
def scan(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(reader, "SCAN_MIN_BYTES", 0 if request.param else 1 << 62)
    return request.param


def _zstd(text: bytes) -> bytes:
    """A zstd stream, as the Collector's `compression: zstd` writes it."""
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as stream:
        stream.write(text)
    return sink.getvalue().to_pybytes()


def _zstd_frames(lines: list[bytes]) -> bytes:
    """The Collector's file exporter before its native compression: per export, a 4-byte
    big-endian length and a zstd frame of its JSON (no newline)."""
    frames = [pa.compress(line.rstrip(b"\n"), codec="zstd", asbytes=True) for line in lines]
    return b"".join(len(frame).to_bytes(4, "big") + frame for frame in frames)


def _documents(lines: list[bytes], indent: int = 2) -> bytes:
    """Each line as a pretty-printed document, as `json.dump(..., indent=2)` and saved request bodies are."""
    return b"".join(json.dumps(json.loads(line), indent=indent).encode() + b"\n" for line in lines)


def _spaced(lines: list[bytes]) -> bytes:
    """Each line as `json.dumps` writes it by default: a space after every separator."""
    return b"".join(json.dumps(json.loads(line)).encode() + b"\n" for line in lines)


def _rows(tables: Any) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of spans, pages and errors, sorted, each file named by its name alone."""
    out = {}
    for name in ("spans", "pages", "errors"):
        table = getattr(tables, name)
        rows = [{**row, "file": Path(row["file"]).name} for row in table.to_pylist()]
        out[name] = sorted(tuple(sorted(row.items())) for row in rows)
    return out


def _read(paths: list[Path | str]) -> dict[str, list[tuple[Any, ...]]]:
    return _rows(reader.read_files(expand_paths(paths)))


def _renamed(rows: dict[str, list[tuple[Any, ...]]], name: str) -> dict[str, list[tuple[Any, ...]]]:
    """The same rows, read from a file of another name."""
    return {
        key: sorted(tuple((k, name if k == "file" else v) for k, v in row) for row in table)
        for key, table in rows.items()
    }


FORMS = {
    # mtime=0: a header stamped with the time would change the file's first bytes between
    # two writes of the same start a second apart (a real writer appends; these rewrite).
    "gzip": lambda lines: gzip.compress(b"".join(lines), mtime=0),
    "gzip, a member per export": lambda lines: b"".join(gzip.compress(line, mtime=0) for line in lines),
    "zstd": lambda lines: _zstd(b"".join(lines)),
    "zstd frames": _zstd_frames,
    "spaced": _spaced,
}


@pytest.mark.parametrize("form", FORMS)
def test_each_form_reads_as_the_same_lines_compact(form: str, scan: bool, tmp_path: Path):
    lines = good_lines(LINES)
    compact = tmp_path / "compact.jsonl"
    compact.write_bytes(b"".join(lines))
    other = tmp_path / "other.jsonl"
    other.write_bytes(FORMS[form](lines))
    expected = _renamed(_read([compact]), "other.jsonl")
    assert len(expected["pages"]) == LINES and not expected["errors"]
    assert _read([other]) == expected


@pytest.mark.parametrize("indent", [2, 4])
def test_pretty_printed_documents_are_read_one_each(indent: int, scan: bool, tmp_path: Path):
    """One object over many lines (opentelemetry-proto's examples/trace.json), and several
    of them one after another, plain and gzip'd: rows numbered by each document's first line."""
    lines = good_lines(3)
    text = _documents(lines, indent)
    (tmp_path / "one.json").write_bytes(_documents(lines[:1], indent))
    (tmp_path / "three.json").write_bytes(text)
    (tmp_path / "three.json.gz").write_bytes(gzip.compress(text))
    rows = _read([tmp_path])
    assert rows["errors"] == []
    sizes = [_documents([line], indent).count(b"\n") for line in lines]  # lines per document
    firsts = [1 + sum(sizes[:k]) for k in range(3)]
    found = sorted((dict(row)["file"], dict(row)["line"]) for row in rows["pages"])
    three = [(name, line) for name in ("three.json", "three.json.gz") for line in firsts]
    assert found == sorted([("one.json", 1), *three])


def test_directories_and_globs_take_compressed_files_and_name_what_they_cannot_read(tmp_path: Path):
    lines = good_lines(LINES)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b"".join(lines[:2])))
    (tmp_path / "b.json.zst").write_bytes(_zstd(b"".join(lines[2:4])))
    (tmp_path / "c.zst").write_bytes(_zstd_frames(lines[4:5]))
    (tmp_path / "d.json").write_bytes(_documents(lines[5:6]))
    (tmp_path / "e.json.bz2").write_bytes(bz2.compress(b"".join(lines)))  # a compression kvaudit does not read
    (tmp_path / "notes.txt").write_bytes(b"not a trace file")  # not a trace file's name: not taken
    store = TraceStore([tmp_path])
    store.refresh()
    assert store.query("SELECT count(*) FROM pages")[1] == [(LINES,)]
    [(file, line, reason)] = store.query("SELECT * FROM read_errors")[1]
    assert (file, line) == (str(tmp_path / "e.json.bz2"), 0) and reason.startswith("not OTLP JSON: binary data")
    globbed = TraceStore([tmp_path / "*.gz", tmp_path / "*.zst"])
    globbed.refresh()
    assert globbed.query("SELECT DISTINCT file FROM pages ORDER BY 1")[1] == [
        (str(tmp_path / name),) for name in ("a.jsonl.gz", "b.json.zst", "c.zst")
    ]


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_a_truncated_compressed_file_keeps_its_whole_lines_and_is_named(compression: str, tmp_path: Path):
    """The whole lines decompressed before the cut are read: for zstd, those of its whole
    blocks (up to 128 KiB of text each), so the file spans a few."""
    lines = good_lines(64)
    whole = gzip.compress(b"".join(lines)) if compression == "gzip" else _zstd(b"".join(lines))
    path = tmp_path / f"cut.json.{'gz' if compression == 'gzip' else 'zst'}"
    path.write_bytes(whole[: len(whole) * 3 // 4])
    tables = reader.read_files([str(path)])
    errors = [(row["line"], row["reason"]) for row in tables.errors.to_pylist()]
    assert errors[-1][0] == 0 and errors[-1][1].startswith(f"{compression}: ")
    assert "truncated" in errors[-1][1]
    read = sorted(row["line"] for row in tables.pages.to_pylist())
    assert read == list(range(1, len(read) + 1)) and read  # every line before the cut
    assert all(number > read[-1] for number, _ in errors[:-1])  # at most the line cut short besides


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_a_corrupt_compressed_file_keeps_what_came_before_and_is_named(compression: str, tmp_path: Path):
    lines = good_lines(LINES)
    first = gzip.compress(b"".join(lines[:3])) if compression == "gzip" else _zstd(b"".join(lines[:3]))
    path = tmp_path / "corrupt.json.gz"
    path.write_bytes(first + first[:10] + bytes(range(256)) * 4)  # a second member or frame, then garbage
    tables = reader.read_files([str(path)])
    [error] = tables.errors.to_pylist()
    # The garbage reads as a corrupt frame, or as one cut short where its block header (made
    # of the emitter's random trace ids) announces more bytes than follow: either is named.
    named = {f" corrupt {compression} data", f" {compression} data ends mid-frame (truncated?)"}
    assert error["line"] == 0 and error["reason"].split(":")[0] == compression
    assert error["reason"].split(":")[1] in named
    assert sorted(row["line"] for row in tables.pages.to_pylist()) == [1, 2, 3]


@pytest.mark.parametrize("form", ["gzip, a member per export", "zstd frames"])
def test_a_growing_compressed_file_is_read_on_from_where_it_was(form: str, tmp_path: Path):
    """A live store reads what was added to a compressed file once, never its start again."""
    lines = good_lines(LINES)
    path = tmp_path / "traces.json.gz"
    path.write_bytes(FORMS[form](lines[:2]))
    store = TraceStore([tmp_path], ":memory:")
    counts = []
    for upto in (2, 4, 4, 6):
        path.write_bytes(FORMS[form](lines[:upto]))  # what the writer appended, the file's start unchanged
        store.refresh(final=False)
        counts.append(store.query("SELECT count(*), count(DISTINCT line) FROM pages")[1][0])
    assert counts == [(2, 2), (4, 4), (4, 4), (6, 6)]
    assert store.query("SELECT count(*) FROM read_errors")[1] == [(0,)]


def test_a_zstd_frame_still_open_is_read_as_far_as_it_is_written(tmp_path: Path):
    """The Collector's native zstd (no rotation) keeps a frame open between its flushes: the
    whole lines in its finished blocks are read now, the rest once it is written."""
    lines = good_lines(LINES)
    writer = sources.zstd.ZstdCompressor()
    path = tmp_path / "traces.json.zst"

    def write(text: bytes, end: int) -> None:
        with path.open("ab") as f:
            f.write(writer.compress(text) + writer.flush(end))

    write(b"".join(lines[:2]), writer.FLUSH_FRAME)
    write(b"".join(lines[2:3]) + lines[3][:100], writer.FLUSH_BLOCK)  # a frame open, a line half written
    store = TraceStore([path], ":memory:")
    store.refresh(final=False)
    assert store.query("SELECT count(*), max(line) FROM pages")[1] == [(3, 3)]
    write(lines[3][100:] + b"".join(lines[4:]), writer.FLUSH_FRAME)
    store.refresh(final=False)
    assert store.query("SELECT count(*), count(DISTINCT line) FROM pages")[1] == [(LINES, LINES)]
    assert store.query("SELECT count(*) FROM read_errors")[1] == [(0,)]


def test_spaced_lines_take_the_scanners_fast_path():
    """Lines written with spaces after separators are made compact first, so the page
    scanner reads them itself instead of handing them to msgspec (3x slower)."""
    [line] = good_lines(1)
    spaced = _spaced([line]).rstrip(b"\n")
    buf = np.frombuffer(bytearray(spaced + bytes(scan_json.PAD)), dtype=np.uint8)
    starts, ends = np.array([0], dtype=np.int64), np.array([len(spaced)], dtype=np.int64)
    assert scan_json.spaced(buf, starts, ends).tolist() == [True]
    ends = scan_json.compact(buf, starts, ends)
    made = bytes(buf[: ends[0]])
    assert made == line.rstrip(b"\n")  # what the emitter wrote, byte for byte
    scanned = reader.page_scanner().scan(buf, starts, ends)
    assert scanned.spans.tolist() == [1] and scanned.strict.all()


def test_a_spaced_bad_line_is_named_as_it_was_written(scan: bool, tmp_path: Path):
    """msgspec words the error of a spaced line from its bytes as written, not as made compact."""
    lines = good_lines(3)
    bad = _spaced(lines[1:2]).replace(
        b'"kvaudit.page.bytes", "value": {"intValue": ', b'"kvaudit.page.bytes", "value": {,"intValue": '
    )
    path = tmp_path / "spaced.jsonl"
    path.write_bytes(_spaced(lines[:1]) + bad + _spaced(lines[2:]))
    tables = reader.read_files([str(path)])
    with pytest.raises(msgspec.DecodeError) as written:
        DECODER.decode(bad.rstrip(b"\n"))
    assert [(row["line"], row["reason"]) for row in tables.errors.to_pylist()] == [
        (2, f"invalid JSON: {written.value}")
    ]
    assert sorted(row["line"] for row in tables.pages.to_pylist()) == [1, 3]


def test_many_small_files_read_as_one_file_of_the_same_lines(
    scan: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Small files are decoded several to a task (with a large one between them, in file
    order): the same rows, each numbered by its own file's lines, as a file at a time."""
    lines = good_lines(24)
    small = tmp_path / "small"
    small.mkdir()
    for n in range(12):
        (small / f"r{n:02d}.jsonl").write_bytes(b"".join(lines[2 * n : 2 * n + 2]))
    (small / "r05-big.jsonl").write_bytes(b"".join(lines))
    monkeypatch.setattr(files, "BATCH_BYTES", 3 * len(b"".join(lines[:2])))  # a few files per task
    monkeypatch.setattr(files, "SMALL_BYTES", len(b"".join(lines)) - 1)  # the big one is not small
    batched = reader.read_files(expand_paths([small]))
    monkeypatch.setattr(files, "SMALL_BYTES", 0)  # every file a task of its own
    one_by_one = reader.read_files(expand_paths([small]))
    assert _rows(batched) == _rows(one_by_one)
    assert batched.pages.column("file").to_pylist() == one_by_one.pages.column("file").to_pylist()  # file order
    assert len(_rows(batched)["pages"]) == 2 * len(lines)
    assert {(Path(row["file"]).name, row["line"], row["request_id"]) for row in batched.pages.to_pylist()} >= {
        ("r03.jsonl", 2, "q7"),
        ("r05-big.jsonl", 24, "q23"),
    }


def test_a_repeated_attribute_key_takes_its_last_value(scan: bool, tmp_path: Path):
    """As the OpenTelemetry SDK does when an attribute is set again (docs/design.md section 3.1)."""
    lines = good_lines(2)
    data = json.loads(lines[1])
    span = _span(data)
    span["events"][0]["attributes"].append({"key": "kvaudit.page.bytes", "value": {"intValue": "777"}})
    span["attributes"].append({"key": "kvaudit.tokens.requested", "value": {"intValue": "555"}})
    span["attributes"] += [{"key": "x.extra", "value": {"stringValue": v}} for v in ("first", "last")]
    resource = data["resourceSpans"][0]["resource"]["attributes"]
    resource.append({"key": "service.instance.id", "value": {"stringValue": "r9"}})
    path = tmp_path / "repeated.jsonl"
    path.write_bytes(lines[0] + json.dumps(data, separators=(",", ":")).encode() + b"\n")
    store = TraceStore([path])
    store.refresh()
    assert store.query("SELECT line, bytes, replica FROM pages ORDER BY line")[1][1] == (2, 777, "r9")
    assert store.query("SELECT tokens_requested, attributes['x.extra'] FROM spans WHERE line = 2")[1] == [(555, "last")]
    assert store.query("SELECT count(*) FROM read_errors")[1] == [(0,)]


def test_sql_reads_a_compressed_file_named_explicitly(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """Given by name, a compressed file is read whatever its name says (here: nothing)."""
    path = tmp_path / "export"
    path.write_bytes(_zstd(b"".join(good_lines(LINES))))
    assert main(["sql", str(path), "SELECT count(*) AS pages FROM pages", "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert out.split() == ["pages", str(LINES)] and err == ""
