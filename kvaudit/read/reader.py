"""Read OTLP JSON trace files into columns: spans, page descriptors, resources, errors.

Verbose JSON is the bottleneck of the analysis side (docs/design.md section 5), so each
file is decoded once, in pieces (`files.plan`) that threads decode in parallel (msgspec
for spans, the compiled page scanner for page events, without the GIL), and handed to
DuckDB as Arrow tables. Bad lines never stop a read, nor do bad files: each becomes a
`file:line: reason` row in `read_errors` (line 0 for a file as a whole).
"""

from __future__ import annotations

import functools
import gc
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvaudit.contract import PAGE_COLUMNS, Kind
from kvaudit.otlp.schema import DECODER, HEAD_DECODER
from kvaudit.read import files, scan_json, scan_otlp, scanner_cache, sources
from kvaudit.read.buffer_pool import BufferPool
from kvaudit.read.columns import (
    ERRORS_SCHEMA,
    PAGES_SCHEMA,
    RESOURCES_SCHEMA,
    SPANS_SCHEMA,
    UNTYPABLE,
    Tables,
    table_of,
)
from kvaudit.read.decode import PAGE_COLUMNS_FROM_SPAN, DecodedLine, RangeRows, read_line, untypable
from kvaudit.read.files import CHUNK_BYTES, Cursors, Piece, pending_bytes, plan, too_long, unreadable
from kvaudit.read.page_scan import PageColumns, PageScanner

_SCAN_KIND: Final = {
    Kind.STR: scan_otlp.STR,
    Kind.INT: scan_otlp.INT,
    Kind.BOOL: scan_otlp.BOOL,
    Kind.INTS: scan_otlp.INTS,
}
# A range is a chunk and the rest of the line it ends in. Idle, these buffers hold at
# most 2 * CHUNK_BYTES per CPU.
_BUFFER_BYTES: Final = 2 * CHUNK_BYTES  # larger buffers, for a range with a huge line, are not kept
_BUFFERS: Final = BufferPool(keep=os.cpu_count() or 1, max_bytes=_BUFFER_BYTES)
# Loading the page scanner's machine code from numba's disk cache takes a noticeable pause
# once a process; below this size msgspec's full decode has finished a read before it.
SCAN_MIN_BYTES: Final = 4 * 1024 * 1024


@dataclass
class _Unit:
    """A line (or pretty-printed document) of a task's buffer: data[first:last]."""

    piece: int  # which of the task's pieces it is in
    number: int  # its line number in that piece, from 1
    first: int
    last: int
    cut: bool  # the unterminated end of its file


@dataclass
class PieceRead:
    """What a task made of one of its pieces: where it stopped and the lines it consumed."""

    stop: int
    lines: int
    error: str | None = None  # it could not be read (an I/O error, reported once per file)


def read_range(path: str, start: int, end: int, final: bool, scan: bool = True) -> tuple[Tables, int, int]:
    """Decode the lines in bytes [start, end) of `path`, numbering them from 1.

    `start` must be a line start. The range ends at its last newline, unless `final`
    is set and `end` is the end of the file: then an unterminated last line is read
    too (and reported as truncated if it does not decode).

    With `scan`, msgspec decodes spans with their events left as raw JSON, the page
    scanner (kvaudit.read.page_scan) reads page events into columns, and lines it gives up
    on get msgspec's full decode; without it, every line gets the full decode.

    Returns:
        The tables, the offset just past the last line consumed, the lines consumed.
    """
    tables, [read] = read_task([Piece(path, None, start, end, 0)], final, scan)
    return tables, read.stop, read.lines


def read_task(pieces: Sequence[Piece], final: bool, scan: bool = True) -> tuple[Tables, list[PieceRead]]:
    """Decode the pieces (their lines numbered from their `base_line`, or from 1 where it is
    None) into one set of tables; see `read_range` for `final` and `scan`."""
    size = sum(piece.end - piece.start for piece in pieces if piece.error is None)
    rows = RangeRows()
    units: list[_Unit] = []
    reads: list[PieceRead] = []
    with _BUFFERS.buffer(size + scan_json.PAD) as data:
        at = 0
        for k, piece in enumerate(pieces):
            base = piece.base_line or 0
            if piece.error is not None:
                rows.errors.append((len(units), piece.path, base + 1 if piece.lines else 0, piece.error))
                reads.append(PieceRead(piece.end, piece.lines))
                continue
            try:
                got = _fill(data, at, piece)
            except OSError as exc:
                reads.append(PieceRead(piece.start, 0, unreadable(exc)))
                continue
            stop, lines = _units(data, at, at + got, k, piece.document, final, units, rows, piece.path, base)
            reads.append(PieceRead(piece.start + stop - at, lines))
            at += got
        data[at : at + scan_json.PAD] = bytes(scan_json.PAD)
        return _read_units(pieces, data, units, rows, scan), reads


def _fill(data: bytearray, at: int, piece: Piece) -> int:
    """Put the piece's bytes at data[at:]; returns how many (fewer if its file is shorter now)."""
    if piece.text is not None:
        data[at : at + len(piece.text)] = piece.text
        return len(piece.text)
    size, got = piece.end - piece.start, 0
    with open(piece.path, "rb", buffering=0) as f:
        f.seek(piece.start)
        while got < size and (n := f.readinto(memoryview(data)[at + got : at + size])):
            got += n
    return got


def _units(
    data: bytearray,
    first: int,
    end: int,
    piece: int,
    document: bool,
    final: bool,
    units: list[_Unit],
    rows: RangeRows,
    path: str,
    base: int,
) -> tuple[int, int]:
    """The lines (or documents) of data[first:end] into `units`, the blank ones left out and
    those longer than files.MAX_LINE_BYTES reported; returns where they stop and the lines they span.

    They stop at the last line end, unless `final`: then an unterminated last line is one too.
    """
    bounds: list[tuple[int, int, int]] = []  # (first, last, number)
    if document:
        stop, lines = first, 0
        for match in sources.DOCUMENT_END.finditer(data, first, end):
            start = _text_start(data, stop, match.end())
            bounds.append((start, match.end(), lines + data.count(b"\n", stop, start) + 1))
            lines += data.count(b"\n", stop, match.end() + 1)
            stop = match.end() + 1
    else:
        stop, lines = first, 0
        while (nl := data.find(b"\n", stop, end)) >= 0:
            if data[stop] in b" \t\r\n":
                # Blank lines are counted in bulk and left out: no object per empty line.
                past = _past_blank_lines(data, stop, end)
                if past > stop:
                    lines += data.count(b"\n", stop, past)
                    stop = past
                    continue
            lines += 1
            bounds.append((stop, nl, lines))
            stop = nl + 1
    cut = final and stop < end
    if cut:
        start = _text_start(data, stop, end)
        bounds.append((start, end, lines + data.count(b"\n", stop, start) + 1))
        lines += data.count(b"\n", stop, end) + 1
        stop = end
    view = memoryview(data)
    for k, (start, last, number) in enumerate(bounds):
        if last - start > files.MAX_LINE_BYTES:
            rows.errors.append((len(units), path, base + number, too_long(last - start, document)))
        elif not _blank(view[start:last]):
            units.append(_Unit(piece, number, start, last, cut and k == len(bounds) - 1))
    return stop, lines


def _past_blank_lines(data: bytearray, start: int, end: int) -> int:
    """Just past the blank lines at data[start:end] (`start` when there are none), a window at a time."""
    at, size = start, 256  # a line that merely starts with a space costs a short look
    while at < end:
        window = data[at : min(end, at + size)]
        text = window.lstrip(b" \t\r\n")
        if text:
            end = at + len(window) - len(text)
            break
        at, size = at + len(window), min(2 * size, 1 << 20)
    return data.rfind(b"\n", start, end) + 1 or start


def _text_start(data: bytearray, start: int, end: int) -> int:
    """Past the white space (line ends included) at data[start:end]."""
    while start < end and data[start] in b" \t\r\n":
        start += 1
    return start


def _read_units(pieces: Sequence[Piece], data: bytearray, units: list[_Unit], rows: RangeRows, scan: bool) -> Tables:
    """The tables of the units.

    With `scan`, the page scanner reads every unit first. msgspec then decodes the
    spans and resources of each unit it read, without the events arrays it read
    strictly; a unit it gave up on, or that decodes otherwise (an error, another span
    count), gets msgspec's full decode of its bytes as written, which also words its error.
    """
    view = memoryview(data)
    originals: dict[int, bytes] = {}
    scanned = None
    if scan and units:
        buf = np.frombuffer(data, dtype=np.uint8)
        starts = np.array([unit.first for unit in units], dtype=np.int64)
        ends = np.array([unit.last for unit in units], dtype=np.int64)
        # Insignificant white space is taken out first (in place, keeping the bytes as
        # written for msgspec's error messages), so the scanner reads the compact form.
        spaced = scan_json.spaced(buf, starts, ends)
        for k in np.flatnonzero(spaced).tolist():
            originals[k] = bytes(view[units[k].first : units[k].last])
        if originals:
            ends[spaced] = scan_json.compact(buf, starts[spaced], ends[spaced])
        scanned = page_scanner().scan(buf, starts, ends)
    lines: list[DecodedLine] = []
    for k, unit in enumerate(units):
        line = DecodedLine(pieces[unit.piece].path, (pieces[unit.piece].base_line or 0) + unit.number, k)
        if scanned is not None and scanned.spans[k] >= 0:
            head = scanned.head(k, view, unit.first, int(ends[k]))
            if read_line(rows, line, head, HEAD_DECODER, unit.cut) is None and len(line.spans) == scanned.spans[k]:
                line.scanned = k
                lines.append(line)
                continue
        raw = originals.get(k, view[unit.first : unit.last])
        reason = read_line(rows, line, raw, DECODER, unit.cut)
        if reason is None:
            lines.append(line)
        else:
            rows.errors.append((k, line.file, line.number, reason))
    try:
        return _tables(rows, lines, scanned)
    except UNTYPABLE:
        pass
    # A value its column cannot hold (an integer out of range or not one): find its lines.
    kept = []
    for line in lines:
        reason = untypable(line) or _untypable_by_arrow(line)
        if reason is None:
            kept.append(line)
        else:
            rows.errors.append((line.place, line.file, line.number, reason))
    return _tables(rows, kept, scanned)


def _untypable_by_arrow(line: DecodedLine) -> str | None:
    """What Arrow says of the line's values, should it refuse one `untypable` let through."""
    try:
        table_of(SPANS_SCHEMA, line.spans)
        table_of(PAGES_SCHEMA, line.pages or [])
    except UNTYPABLE as exc:
        return f"bad value: {exc}"
    return None


def _tables(rows: RangeRows, lines: list[DecodedLine], scanned: PageColumns | None) -> Tables:
    """The tables: scanned page rows get their span's columns by (line, span), and rows
    keep the order of their lines."""
    spans = table_of(SPANS_SCHEMA, [row for line in lines for row in line.spans])
    general = [line for line in lines if line.pages]
    pages = table_of(PAGES_SCHEMA, [row for line in general for row in line.pages or ()])
    if scanned is not None:
        # Per scanned line, where its span rows start (-1: its scanned rows are not used).
        first_span = np.full(len(scanned.spans), -1, dtype=np.int64)
        offset = 0
        for line in lines:
            if line.scanned is not None:
                first_span[line.scanned] = offset
            offset += len(line.spans)
        rows_of = first_span[scanned.line] + scanned.span
        time_ns, attributes = pa.array(scanned.time_ns), scanned.columns
        used = first_span[scanned.line] >= 0
        places = scanned.line
        if not used.all():
            rows_of, time_ns, places = rows_of[used], time_ns.filter(pa.array(used)), places[used]
            attributes = [column.filter(pa.array(used)) for column in attributes]
        heads = spans.select(PAGE_COLUMNS_FROM_SPAN).take(rows_of)
        fast = pa.Table.from_arrays([*heads.columns, time_ns, *attributes], schema=PAGES_SCHEMA)
        if pages.num_rows:
            # Keep the lines' order: rows of lines the scanner gave up on belong between its own.
            order = np.concatenate(
                [places, np.repeat([line.place for line in general], [len(line.pages or ()) for line in general])]
            )
            fast = pa.concat_tables([fast, pages]).take(np.argsort(order, kind="stable"))
        pages = fast
    resources: dict[int, list[Any]] = {}
    for line in lines:
        resources.update(line.resources)
    rows.errors.sort(key=lambda error: error[0])
    return Tables(
        table_of(RESOURCES_SCHEMA, [[rid, *row] for rid, row in resources.items()]),
        spans,
        pages,
        table_of(ERRORS_SCHEMA, [error[1:] for error in rows.errors]),
    )


def _blank(line: memoryview) -> bool:
    # Lines start with `{`; only one that starts with white space needs a closer look.
    return not line or (line[0] in b" \t\r\n\x0b\x0c" and not bytes(line).strip())


@functools.cache
def page_scanner() -> PageScanner:
    """The page event scanner for the `pages` columns (compiled on first use, then cached on disk)."""
    columns = [(attr, _SCAN_KIND[kind]) for attr, kind in PAGE_COLUMNS.values()]
    return PageScanner(columns, scratch_bytes=_BUFFER_BYTES)


def read_files(
    files: Sequence[str],
    cursors: Cursors | None = None,
    *,
    final: bool = True,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    sink: Callable[[Tables], Tables | None] | None = None,
) -> Tables:
    """Read what is new in `files` since `cursors` (updated in place).

    Args:
        files: trace files.
        cursors: how far each file has been read; None reads every file from its start.
        final: read an unterminated last line too (a one-shot read); when False it
            is left for the next call, because its writer may be mid-write.
        workers: threads to decode with (default: one per CPU). The page scanner and
            file reads run without the GIL, and they are most of a read.
        progress: called with the number of bytes of each piece decoded.
        sink: called with each task's tables, in file order, as soon as they are read
            (while the next tasks are still decoding); returns the rows it kept of them
            (None: it handed them on, and none is kept for the return).

    Returns:
        All the tables read (those the sink kept, with a sink).
    """
    cursors = Cursors() if cursors is None else cursors
    workers = max(workers or os.cpu_count() or 1, 1)
    # Unbuilt, the scanner is built in the background while this read uses msgspec (scanner_cache).
    scan = pending_bytes(files, cursors, text=True) >= SCAN_MIN_BYTES and scanner_cache.ready_or_building()
    if scan:
        page_scanner().compile()  # once, before the threads want it
    parts: list[Tables] = []
    with _collection_paused(), ThreadPoolExecutor(workers) as pool:
        for pieces, (tables, reads) in _in_order(pool, plan(files, cursors, final=final), final, scan, 2 * workers):
            part = _numbered(pieces, tables, reads, cursors)
            kept = sink(part) if sink else part
            _advance(pieces, reads, cursors)  # only once its rows are in: what was read stays read
            if kept is not None:
                parts.append(kept)
            if progress:
                progress(sum(piece.cost for piece in pieces))
    return Tables.concat(parts)


def _in_order(
    pool: ThreadPoolExecutor, tasks: Iterator[list[Piece]], final: bool, scan: bool, ahead: int
) -> Iterator[tuple[list[Piece], tuple[Tables, list[PieceRead]]]]:
    """Each task with what it read, in order; at most `ahead` tasks read ahead (the planner
    holds the text of compressed and small files in memory until their task runs)."""
    running: deque[tuple[list[Piece], Future[tuple[Tables, list[PieceRead]]]]] = deque()
    for pieces in tasks:
        running.append((pieces, pool.submit(read_task, pieces, final, scan)))
        if len(running) >= ahead:
            pieces, future = running.popleft()
            yield pieces, future.result()
    while running:
        pieces, future = running.popleft()
        yield pieces, future.result()


def _numbered(pieces: list[Piece], tables: Tables, reads: list[PieceRead], cursors: Cursors) -> Tables:
    """A task's tables with its lines numbered where the planner could not, and its I/O
    errors (each reported once per file)."""
    [piece] = pieces if pieces[0].base_line is None else [None]  # such a task has one piece
    if piece is not None and piece.identity in cursors.files:
        tables = _renumber(tables, cursors.files[piece.identity].next_line - 1)
    errors = [
        (piece.path, 0, read.error)
        for piece, read in zip(pieces, reads)
        if read.error is not None and cursors.report(piece.path, read.error)
    ]
    if errors:
        tables = Tables(tables.resources, tables.spans, tables.pages,
                        pa.concat_tables([tables.errors, table_of(ERRORS_SCHEMA, errors)]))  # fmt: skip
    return tables


def _advance(pieces: list[Piece], reads: list[PieceRead], cursors: Cursors) -> None:
    """Move the cursors past what a task read."""
    for piece, read in zip(pieces, reads):
        cursor = cursors.files.get(piece.identity) if piece.identity is not None else None
        if cursor is None or read.error is not None:
            continue
        cursor.offset = read.stop
        cursor.next_line += read.lines
        if piece.seen is not None:
            cursor.size, cursor.ctime_ns, complete = piece.seen
            cursor.whole = complete and read.stop == piece.end


@contextmanager
def _collection_paused() -> Iterator[None]:
    """No cyclic garbage collection meanwhile: decoding allocates many acyclic objects, and
    collection passes would only rescan them."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _renumber(tables: Tables, base: int) -> Tables:
    """Shift line numbers of a piece by the lines of its file before it (line 0, a file
    as a whole, stays)."""
    if not base:
        return tables

    def shift(table: pa.Table) -> pa.Table:
        index = table.schema.get_field_index("line")
        line = table.column(index)
        return table.set_column(index, "line", pc.if_else(pc.greater(line, 0), pc.add(line, base), line))

    return Tables(tables.resources, shift(tables.spans), shift(tables.pages), shift(tables.errors))
