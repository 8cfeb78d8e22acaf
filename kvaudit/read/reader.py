"""Read OTLP JSON trace files into columns: spans, page descriptors, resources, errors.

Verbose JSON is the bottleneck of the analysis side (docs/design.md section 5), so each
file is decoded once, split into byte ranges that threads decode in parallel (msgspec
for spans, the compiled page scanner for page events, without the GIL), and handed to
DuckDB as Arrow tables. Bad lines never stop a read: each becomes a `file:line: reason`
row in `read_errors`.
"""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvaudit.contract import PAGE_COLUMNS, Kind
from kvaudit.otlp.schema import DECODER, HEAD_DECODER
from kvaudit.read import page_scan
from kvaudit.read.buffer_pool import BufferPool
from kvaudit.read.columns import ERRORS_SCHEMA, PAGES_SCHEMA, RESOURCES_SCHEMA, SPANS_SCHEMA, Tables, table_of
from kvaudit.read.decode import PAGE_COLUMNS_FROM_SPAN, DecodedLine, RangeRows, read_line
from kvaudit.read.files import CHUNK_BYTES, Cursor, plan_ranges
from kvaudit.read.page_scan import PageColumns, PageScanner

_SCAN_KIND: Final = {
    Kind.STR: page_scan.STR,
    Kind.INT: page_scan.INT,
    Kind.BOOL: page_scan.BOOL,
    Kind.INTS: page_scan.INTS,
}
# A range is a chunk and the rest of the line it ends in. Idle, these buffers hold at
# most 2 * CHUNK_BYTES per CPU.
_BUFFER_BYTES: Final = 2 * CHUNK_BYTES  # larger buffers, for a range with a huge line, are not kept
_BUFFERS: Final = BufferPool(keep=os.cpu_count() or 1, max_bytes=_BUFFER_BYTES)
# The page scanner's machine code takes ~0.5 s to load from numba's disk cache (and ~40 s
# to compile on a fresh install); msgspec's full decode reads this much faster than that.
SCAN_MIN_BYTES: Final = 4 * 1024 * 1024


def read_range(path: str, start: int, end: int, final: bool, scan: bool = True) -> tuple[Tables, int, int]:
    """Decode the lines in bytes [start, end) of `path`, numbering them from 1.

    `start` must be a line start. The range ends at its last newline, unless `final`
    is set and `end` is the end of the file: then an unterminated last line is read
    too (and reported as truncated if it does not decode).

    With `scan`, msgspec decodes spans with their events left as raw JSON, the page
    scanner (kvaudit.page_scan) reads page events into columns, and lines it gives up
    on get msgspec's full decode; without it, every line gets the full decode.

    Returns:
        The tables, the offset just past the last line consumed, the lines consumed.
    """
    with _BUFFERS.buffer(end - start + page_scan.PAD) as data:
        size = _read_into(data, path, start, end - start)
        stop = data.rfind(b"\n", 0, size) + 1
        bounds = list(_line_bounds(data, stop))
        truncated = final and stop < size
        if truncated:
            bounds.append((stop, size))
        tables = _read_lines(path, data, bounds, size if truncated else 0, scan)
        return tables, start + (size if truncated else stop), len(bounds)


def _read_lines(path: str, data: bytearray, bounds: list[tuple[int, int]], cut_at: int, scan: bool) -> Tables:
    """The tables of the lines data[first:last] for each (first, last) of `bounds`, numbered
    from 1; a line ending at `cut_at` (not 0) is the unterminated end of the file.

    With `scan`, the page scanner reads every line first. msgspec then decodes the
    spans and resources of each line it read, without the events arrays it read
    strictly; a line it gave up on, or that decodes otherwise (an error, another span
    count), gets msgspec's full decode, which also words its error.
    """
    columns = RangeRows(path)
    view = memoryview(data)
    candidates = [(n, first, last) for n, (first, last) in enumerate(bounds, start=1) if not _blank(view[first:last])]
    scanned = None
    if scan:
        buf = np.frombuffer(data, dtype=np.uint8)
        scanned = page_scanner().scan(buf, [first for _, first, _ in candidates], [last for _, _, last in candidates])
    lines: list[DecodedLine] = []
    for k, (number, first, last) in enumerate(candidates):
        line = DecodedLine(number)
        cut = last == cut_at
        if scanned is not None and scanned.spans[k] >= 0:
            head = scanned.head(k, view, first, last)
            if read_line(columns, line, head, HEAD_DECODER, cut) is None and len(line.spans) == scanned.spans[k]:
                line.scanned = k
                lines.append(line)
                continue
        reason = read_line(columns, line, view[first:last], DECODER, cut)
        if reason is None:
            lines.append(line)
        else:
            columns.errors.append((path, number, reason))
    return _tables(columns, lines, scanned)


def _tables(columns: RangeRows, lines: list[DecodedLine], scanned: PageColumns | None) -> Tables:
    """The range's tables: scanned page rows get their span's columns by (line, span)."""
    spans = table_of(SPANS_SCHEMA, [row for line in lines for row in line.spans])
    pages = table_of(PAGES_SCHEMA, [row for line in lines if line.pages is not None for row in line.pages])
    if scanned is not None:
        # Per scanned line, where its span rows start (-1: its scanned rows are not used).
        first_span = np.full(len(scanned.spans), -1, dtype=np.int64)
        offset = 0
        for line in lines:
            if line.scanned is not None:
                first_span[line.scanned] = offset
            offset += len(line.spans)
        rows = first_span[scanned.line] + scanned.span
        time_ns, attributes = pa.array(scanned.time_ns), scanned.columns
        used = first_span[scanned.line] >= 0
        if not used.all():
            rows, time_ns = rows[used], time_ns.filter(pa.array(used))
            attributes = [column.filter(pa.array(used)) for column in attributes]
        heads = spans.select(PAGE_COLUMNS_FROM_SPAN).take(rows)
        fast = pa.Table.from_arrays([*heads.columns, time_ns, *attributes], schema=PAGES_SCHEMA)
        if pages.num_rows:
            # Keep file order: rows of lines the scanner gave up on belong between its own.
            fast = pa.concat_tables([fast, pages])
            fast = fast.take(pc.sort_indices(fast, [("line", "ascending")]))
        pages = fast
    return Tables(
        table_of(RESOURCES_SCHEMA, [[rid, *row] for rid, row in _line_resources(lines).items()]),
        spans,
        pages,
        table_of(ERRORS_SCHEMA, columns.errors),
    )


def _line_resources(lines: list[DecodedLine]) -> dict[int, list[Any]]:
    resources: dict[int, list[Any]] = {}
    for line in lines:
        resources.update(line.resources)
    return resources


def _read_into(data: bytearray, path: str, start: int, size: int) -> int:
    """Read bytes [start, start + size) of `path` into `data` and zero the PAD bytes after
    them, as the page scanner wants; returns the bytes read (fewer if the file is shorter now)."""
    got = 0
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        while got < size and (n := f.readinto(memoryview(data)[got:size])):
            got += n
    data[got : got + page_scan.PAD] = bytes(page_scan.PAD)
    return got


def _line_bounds(data: bytearray, stop: int) -> Iterator[tuple[int, int]]:
    pos = 0
    while pos < stop:
        nl = data.index(b"\n", pos)
        yield pos, nl
        pos = nl + 1


def _blank(line: memoryview) -> bool:
    # Lines start with `{`; only one that starts with white space needs a closer look.
    return not line or (line[0] in b" \t\r\x0b\x0c" and not bytes(line).strip())


@functools.cache
def page_scanner() -> PageScanner:
    """The page event scanner for the `pages` columns (compiled on first use, then cached on disk)."""
    columns = [(attr, _SCAN_KIND[kind]) for attr, kind in PAGE_COLUMNS.values()]
    return PageScanner(columns, scratch_bytes=_BUFFER_BYTES)


def read_files(
    files: Sequence[str],
    cursors: dict[str, Cursor] | None = None,
    *,
    final: bool = True,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    sink: Callable[[Tables], None] | None = None,
) -> Tables:
    """Read what is new in `files` since `cursors` (updated in place).

    Args:
        files: trace files.
        cursors: per-file read positions; None reads every file from the start.
        final: read an unterminated last line too (a one-shot read); when False it
            is left for the next call, because its writer may be mid-write.
        workers: threads to decode with (default: one per CPU). The page scanner and
            file reads run without the GIL, and they are most of a read.
        progress: called with the number of bytes of each range decoded.
        sink: called with each range's tables, in file order, as soon as they are read
            (while the next ranges are still decoding).

    Returns:
        All the tables read.
    """
    cursors = {} if cursors is None else cursors
    tasks = list(plan_ranges(files, cursors))
    size = sum(end - start for _, start, end in tasks)
    workers = min(workers or os.cpu_count() or 1, len(tasks))
    scan = size >= SCAN_MIN_BYTES
    if scan:
        page_scanner().compile()  # once, before the threads want it
    parts: list[Tables] = []
    with _collection_paused(), ThreadPoolExecutor(max(workers, 1)) as pool:
        results = pool.map(read_range, *zip(*tasks), [final] * len(tasks), [scan] * len(tasks))
        for (path, start, end), (tables, stop, lines) in zip(tasks, results):
            cursor = cursors[path]
            part = _renumber(tables, cursor.next_line - 1)
            if sink:
                sink(part)
            cursor.offset = stop
            cursor.next_line += lines
            parts.append(part)
            if progress:
                progress(end - start)
    return Tables.concat(parts)


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
    """Shift line numbers of a range by the lines of the file before it."""
    if not base:
        return tables

    def shift(table: pa.Table) -> pa.Table:
        index = table.schema.get_field_index("line")
        return table.set_column(index, "line", pc.add(table.column(index), base))

    return Tables(tables.resources, shift(tables.spans), shift(tables.pages), shift(tables.errors))
