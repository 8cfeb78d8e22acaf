"""A corpus of hostile trace input for the reader: each case a file of good lines around a
bad one (or a bad file), with the exact error it must give.

Good lines come from the real emitter and file exporter; bad ones are good lines edited
the way a broken or hostile writer would write them: values OTLP allows that kvaudit
cannot store (unsigned 64-bit times), integers out of range or not integers, values
nested past the depth limit, lines past the length limit, bytes that are not JSON.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvaudit.contract import Hook, Op, Outcome
from kvaudit.emit.setup import setup_emitter

from .pages import KV, full_page

LINES = 4  # good lines (one span of one page each) in every case's file
LATEST_TIME = "2262-04-11T23:47:16.854775807Z"


@functools.cache
def _good_lines(count: int) -> tuple[bytes, ...]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "good.jsonl"
        emitter = setup_emitter("r1", f"file:{path}", engine="vllm", kv=KV, export_delay_s=0.01)
        for n in range(count):
            with emitter.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id=f"q{n}") as op:
                op.add_page(full_page(f"{n:064x}", n))
                op.end(Outcome.HIT)
            emitter.flush()  # one line per span
        emitter.shutdown()
        return tuple(path.read_bytes().splitlines(keepends=True))


def good_lines(count: int = LINES) -> list[bytes]:
    """Lines of OTLP JSON as kvaudit writes them: one store span of one page each (request q<n>)."""
    return list(_good_lines(count))


def with_trace_id(line: bytes, tag: str) -> bytes:
    """The line's spans under a trace id of their own (made of `tag`): other spans than the
    line's, where a span read twice is read once (kvaudit.read.span_identity)."""
    trace_id = hashlib.md5(tag.encode()).hexdigest().encode()
    return re.sub(rb'"traceId":"[0-9a-fA-F]+"', b'"traceId":"' + trace_id + b'"', line)


def copies(lines: list[bytes], count: int) -> bytes:
    """`count` copies of the lines, each copy's spans their own (see `with_trace_id`)."""
    return b"".join(with_trace_id(line, str(copy)) for copy in range(count) for line in lines)


def _edited(line: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    data = json.loads(line)
    edit(data)
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


def _span(data: dict[str, Any]) -> dict[str, Any]:
    return data["resourceSpans"][0]["scopeSpans"][0]["spans"][0]


def _set_attribute(attributes: list[dict[str, Any]], key: str, value: dict[str, Any]) -> None:
    for attribute in attributes:
        if attribute["key"] == key:
            attribute["value"] = value
            return
    attributes.append({"key": key, "value": value})


def _nested(depth: int) -> bytes:
    """An AnyValue whose arrays nest `depth` deep (written as text: json.dumps recurses)."""
    return b'{"arrayValue":{"values":[' * depth + b'{"stringValue":"x"}' + b"]}}" * depth


def _with_value(key: str, raw: bytes) -> Callable[[bytes], bytes]:
    def edit(line: bytes) -> bytes:
        marked = _edited(line, lambda d: _span(d)["attributes"].append({"key": key, "value": "MARK"}))
        return marked.replace(b'"MARK"', raw)

    return edit


@dataclass
class Case:
    """A file of the corpus: `bad` replaces good line `at` (1-based) with what `bad` makes
    of it (None: the whole file is `content`); `error` is the exact (line, reason) expected."""

    name: str
    error: tuple[int, str]
    bad: Callable[[bytes], bytes] | None = None
    at: int = 2
    content: bytes = b""

    def write(self, directory: Path) -> Path:
        path = directory / f"{self.name}.jsonl"
        if self.bad is None:
            path.write_bytes(self.content)
            return path
        lines = [with_trace_id(line, self.name) for line in good_lines()]
        lines[self.at - 1] = self.bad(lines[self.at - 1])
        path.write_bytes(b"".join(lines))
        return path

    @property
    def good_pages(self) -> int:
        """Pages the file's good lines hold (each good line one)."""
        return 0 if self.bad is None else LINES - 1


def _start_time(line: bytes) -> bytes:
    return _edited(line, lambda d: _span(d).update(startTimeUnixNano=str(2**64 - 1)))


def _end_time_number(line: bytes) -> bytes:
    return _edited(line, lambda d: _span(d).update(endTimeUnixNano=2**64 - 1))


def _page_time(line: bytes) -> bytes:
    return _edited(line, lambda d: _span(d)["events"][0].update(timeUnixNano=str(2**63)))


def _span_int(value: Any) -> Callable[[bytes], bytes]:
    return lambda line: _edited(
        line, lambda d: _set_attribute(_span(d)["attributes"], "kvaudit.tokens.requested", {"intValue": value})
    )


def _page_int(value: Any) -> Callable[[bytes], bytes]:
    return lambda line: _edited(
        line, lambda d: _set_attribute(_span(d)["events"][0]["attributes"], "kvaudit.page.bytes", {"intValue": value})
    )


def _resource_int(value: Any) -> Callable[[bytes], bytes]:
    def edit(data: dict[str, Any]) -> None:
        _set_attribute(data["resourceSpans"][0]["resource"]["attributes"], "process.pid", {"intValue": value})

    return lambda line: _edited(line, edit)


def _shape_item(line: bytes) -> bytes:
    def edit(data: dict[str, Any]) -> None:
        shape = {"arrayValue": {"values": [{"intValue": "2"}, {"intValue": "-99999999999999999999"}]}}
        _set_attribute(_span(data)["events"][0]["attributes"], "kvaudit.page.shape", shape)

    return _edited(line, edit)


def _dropped(line: bytes) -> bytes:
    return _edited(line, lambda d: _span(d).update(droppedEventsCount=2**64))


NESTING = "nested too deeply (an attribute value may nest 32 arrays or maps)"


def _too_late(name: str, value: int) -> str:
    return (
        f"bad value: {name} {value} is after {LATEST_TIME}, the latest time kvaudit reads (signed 64-bit nanoseconds)"
    )


CASES = [
    Case("start-time-unsigned", (2, _too_late("startTimeUnixNano", 2**64 - 1)), _start_time),
    Case("end-time-unsigned-number", (2, _too_late("endTimeUnixNano", 2**64 - 1)), _end_time_number),
    Case("page-time-unsigned", (3, _too_late("timeUnixNano", 2**63)), _page_time, at=3),
    Case(
        "span-int-out-of-range",
        (2, "bad value: kvaudit.tokens.requested 99999999999999999999 is out of the signed 64-bit range"),
        _span_int("99999999999999999999"),
    ),
    Case(
        "span-int-number-out-of-range",
        (2, "bad value: kvaudit.tokens.requested 18446744073709551615 is out of the signed 64-bit range"),
        _span_int(2**64 - 1),
    ),
    Case("span-int-word", (2, "bad value: kvaudit.tokens.requested 'sixteen' is not an integer"), _span_int("sixteen")),
    Case("span-int-hex", (4, "bad value: kvaudit.tokens.requested '0x10' is not an integer"), _span_int("0x10"), at=4),
    Case("page-int-word", (2, "bad value: kvaudit.page.bytes 'sixteen' is not an integer"), _page_int("sixteen")),
    Case(
        "page-int-out-of-range",
        (1, "bad value: kvaudit.page.bytes 99999999999999999999 is out of the signed 64-bit range"),
        _page_int("99999999999999999999"),
        at=1,
    ),
    Case(
        "page-shape-item-out-of-range",
        (2, "bad value: kvaudit.page.shape -99999999999999999999 is out of the signed 64-bit range"),
        _shape_item,
    ),
    Case("resource-int-word", (2, "bad value: process.pid 'sixteen' is not an integer"), _resource_int("sixteen")),
    Case(
        "dropped-count-out-of-range",
        (2, "bad value: droppedEventsCount 18446744073709551616 is out of the signed 64-bit range"),
        _dropped,
    ),
    Case("nested-1000-deep", (2, NESTING), _with_value("deep", _nested(1000))),
    Case("nested-33-deep", (3, NESTING), _with_value("deep", _nested(33)), at=3),
    Case("binary-garbage", (0, "not OTLP JSON: binary data (byte 0x00 at offset 0)"), content=bytes(range(256)) * 8),
    Case(
        "protobuf",
        (0, "not OTLP JSON: length-prefixed OTLP protobuf (the Collector's `format: proto`)"),
        content=b"\x00\x00\x00\x10\x0a\x0e\x0a\x0c\x12\x0a\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09",
    ),
]


def write_corpus(directory: Path) -> list[Case]:
    """Every case as a file in `directory`; returns the cases."""
    directory.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        case.write(directory)
    return CASES


# --- tiny files that inflate: memory must follow the limits, not what a file inflates to --------

GiB = 1 << 30


def _zstd_of(repeated: bytes, total: int) -> bytes:
    """One zstd frame of `repeated` over and over, `total` bytes inflated, made a MiB at a time."""
    from kvaudit.read.sources import zstd

    compressor = zstd.ZstdCompressor()
    block = repeated * ((1 << 20) // len(repeated))
    parts = [compressor.compress(block[: min(len(block), total - made)]) for made in range(0, total, len(block))]
    return b"".join(parts) + compressor.flush(zstd.ZstdCompressor.FLUSH_FRAME)


def zstd_frame_bomb(path: Path, inflated: int = GiB) -> Path:
    """The Collector's length-prefixed zstd framing, one frame of a single line of `inflated` bytes (about 33 KB)."""
    frame = _zstd_of(b"x", inflated)
    path.write_bytes(len(frame).to_bytes(4, "big") + frame)
    return path


def zstd_of_newlines(path: Path, inflated: int = GiB) -> Path:
    """A `.zst` of `inflated` bytes of newlines (about 33 KB)."""
    path.write_bytes(_zstd_of(b"\n", inflated))
    return path


def newlines(path: Path, size: int = 10_000_000) -> Path:
    """`size` bytes of nothing but newlines."""
    path.write_bytes(b"\n" * size)
    return path


def many_attributes(path: Path, count: int = 1_000_000) -> Path:
    """A good line whose span carries `count` attributes (about 47 MB for a million), between good lines."""
    attributes = b",".join(b'{"key":"k%d","value":{"intValue":"%d"}}' % (n, n) for n in range(count))
    lines = good_lines()
    lines[1] = _with_value("k", b'{"intValue":"0"}},' + attributes[: -len(b"}")])(lines[1])
    path.write_bytes(b"".join(lines))
    return path
