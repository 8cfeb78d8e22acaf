"""The reader's fast path: page descriptor events scanned straight from OTLP JSON bytes.

Page events are nearly all of a trace file's bytes (each attribute of each page a
`{"key": ..., "value": {...}}` object), and decoding them into Python objects cost
more than everything else the reader does. So a compiled scanner (numba) walks each
line's `resourceSpans[].scopeSpans[].spans[].events[]` and writes page attributes into
preallocated arrays, with no Python object per page. It is three modules: `scan_json`
(JSON primitives over bytes, and `compact`), `scan_otlp` (the OTLP grammar down to
the page events) and this one, which drives a scan and turns its arrays into Arrow
columns.

It is deliberately narrow: it reads what JSON writers actually write (compact, or made
compact first: see `scan_json.compact`) and gives up on a line at anything else (an
escape or non-ASCII byte in a string it must read, a nested array or map value, a
repeated field, a type msgspec would reject, a number that is not a plain integer,
broken JSON). The reader decodes such a line the general way, so both paths give the
same rows and the same errors (the page scanner's tests hold them equal, on random
lines and on lines broken at random).

Its machine code is built once and kept in a user cache directory (`scanner_cache`).

It runs before msgspec. Where it read every byte of a line's `events` arrays by its
exact paths (see `scan_otlp.scan`), those bytes are valid JSON, and msgspec decodes the
spans and resources of the line without them: skipping the events had been most of
msgspec's time.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numba
import numpy as np
import pyarrow as pa

from kvaudit.contract import EVENT_PAGE
from kvaudit.read.buffer_pool import BufferPool
from kvaudit.read.scan_json import PAD, compact, spaced  # which tells numba where to cache
from kvaudit.read.scan_otlp import BOOL, CUTS, INT, INTS, STR, attribute_heads, hash_table, scan

# The shortest page event, `{"name":"kvaudit.page"}`: it bounds the rows a buffer can hold.
_MIN_EVENT_BYTES: Final = len('{"name":""}') + len(EVENT_PAGE)


@dataclass
class PageColumns:
    """Page rows scanned from one buffer, and what the scanner found of each line.

    `line` numbers the scanned lines from 0 and `span` counts the spans of that line
    in document order (the order msgspec decodes them in), so (line, span) finds the
    span each page belongs to. `columns` are the page attribute columns, in the order
    the scanner was given them. Per line: `spans` (-1: left to the general decoder),
    `strict` (see `scan_otlp.scan`), and in `cuts[cut_ends[k - 1]:cut_ends[k]]` the brackets of
    its `events` arrays.
    """

    line: np.ndarray
    span: np.ndarray
    time_ns: np.ndarray
    columns: list[pa.Array]
    spans: np.ndarray
    strict: np.ndarray
    cuts: np.ndarray
    cut_ends: np.ndarray

    def head(self, k: int, view: memoryview, start: int, end: int) -> bytes | memoryview:
        """Scanned line k, view[start:end], for msgspec to decode its spans and resources from:
        when read strictly, without what its `events` arrays held (`"events":[]`), which
        msgspec would otherwise spend most of its time skipping."""
        first, last = (self.cut_ends[k - 1] if k else 0), self.cut_ends[k]
        if not self.strict[k] or first == last:
            return view[start:end]
        pieces, at = [], start
        for open_, close in self.cuts[first:last].tolist():
            pieces.append(view[at : open_ + 1])
            at = close
        pieces.append(view[at:end])
        return b"".join(pieces)


class PageScanner:
    """Scans page events for a fixed set of attribute columns.

    Args:
        columns: (attribute name, kind) per column, kind one of STR, INT, BOOL, INTS;
            at most one INTS and one BOOL column.
        scratch_bytes: scans of buffers up to this size reuse their arrays (see _Scratch).
    """

    def __init__(self, columns: Sequence[tuple[str, int]], scratch_bytes: int = 1 << 26) -> None:
        self._kinds = np.array([kind for _, kind in columns], dtype=np.int64)
        if (self._kinds == INTS).sum() > 1 or (self._kinds == BOOL).sum() > 1:
            raise ValueError("at most one list column and one bool column")
        names = [name.encode() for name, _ in columns]
        self._keys = np.frombuffer(b"".join(names), dtype=np.uint8).copy()
        bounds = np.cumsum([0, *map(len, names)])
        self._slots = np.zeros(len(columns), dtype=np.int64)
        for kind in (STR, INT):
            where = np.flatnonzero(self._kinds == kind)
            self._slots[where] = np.arange(len(where))
        # Per column: where its name lies in `keys`, its kind, its slot among its kind.
        self._columns = np.stack([bounds[:-1], bounds[1:], self._kinds, self._slots], axis=1).astype(np.int64)
        self._table = hash_table(self._keys, self._columns)
        self._heads, self._head_masks = attribute_heads(names)
        n_str, n_int = int((self._kinds == STR).sum()), int((self._kinds == INT).sum())
        self._scratch = BufferPool(
            keep=os.cpu_count() or 1,
            max_bytes=scratch_bytes + scratch_bytes // 4,  # the pool sizes what it makes a quarter up
            make=lambda size: _Scratch(size, n_str, n_int),
        )

    def _follow(self) -> np.ndarray:
        """A fresh table of which column followed which (`scan_otlp._column`), one per scan: threads share a scanner."""
        return np.full(len(self._kinds) + 1, -1, dtype=np.int64)

    def compile(self) -> None:
        """Compile now (or load from numba's disk cache), so that reading threads find the
        machine code ready instead of each waiting for it."""
        buf, none = np.zeros(PAD, dtype=np.uint8), np.zeros(0, dtype=np.int64)
        compact(buf, none, none[spaced(buf, none, none)])
        self.scan(buf, [], [])

    def scan(self, buf: np.ndarray, starts: Sequence[int], ends: Sequence[int]) -> PageColumns:
        """Scan the lines buf[starts[k]:ends[k]].

        `buf` is writable uint8 and holds PAD zero bytes after its last line. Runs without the GIL.
        """
        with self._scratch.buffer(len(buf)) as scratch:
            state = np.zeros(3, dtype=np.int64)
            lines = np.empty((len(starts), 3), dtype=np.int64)
            out = (*scratch.out, state)
            n = scan(
                buf,
                np.asarray(starts, dtype=np.int64),
                np.asarray(ends, dtype=np.int64),
                (self._keys, self._columns, self._table, self._heads, self._head_masks, self._follow()),
                scratch.rows,
                out,
                scratch.cuts,
                lines,
            )
            # Everything returned is copied out of `scratch`: the next scan reuses it.
            strings, ints, ints_ok, flags, shapes, items, items_ok = scratch.out
            texts = _Strings(buf, strings, n)
            columns: list[pa.Array] = []
            for column, kind in enumerate(self._kinds):
                slot = self._slots[column]
                if kind == STR:
                    columns.append(texts.column(slot))
                elif kind == INT:
                    columns.append(pa.array(ints[:n, slot].copy(), mask=~ints_ok[:n, slot]))
                elif kind == BOOL:
                    columns.append(pa.array(flags[:n] == 1, mask=flags[:n] < 0))
                else:
                    columns.append(_lists(shapes[:n], items, items_ok))
            line, span, time_ns = scratch.rows[:n].T.copy()
            cuts = scratch.cuts[: state[CUTS]].copy()
        return PageColumns(line, span, time_ns, columns, lines[:, 0], lines[:, 1] == 1, cuts, lines[:, 2])


class _Scratch:
    """The arrays a scan of a buffer of up to `size` bytes writes into, before its rows are
    copied into Arrow columns; `len` is that size (see `BufferPool`).

    They are kept for the next scan (PageScanner._scratch): numpy asks the kernel for huge
    pages for arrays this large, so the first touch of each fresh 2 MiB is a page fault
    that zeroes all of it.
    """

    def __init__(self, size: int, n_str: int, n_int: int) -> None:
        self._size = size
        # Every bound is generous, and costs nothing: pages never written stay unmapped.
        capacity = size // _MIN_EVENT_BYTES + 1
        # An array item is at least `{"intValue":0}` long.
        item_capacity = size // len('{"intValue":0}') + 1
        # Each event resets its row's presence marks (string start, int ok, flag, list start):
        # what lies under a mark that says absent is never read.
        self.out = (
            np.empty((capacity, n_str, 2), dtype=np.int64),  # strings
            np.empty((capacity, n_int), dtype=np.int64),  # ints
            np.empty((capacity, n_int), dtype=np.bool_),  # ints_ok
            np.empty(capacity, dtype=np.int8),  # flags
            np.empty((capacity, 2), dtype=np.int64),  # shapes
            np.empty(item_capacity, dtype=np.int64),  # items
            np.empty(item_capacity, dtype=np.bool_),  # items_ok
        )
        self.rows = np.empty((capacity, 3), dtype=np.int64)
        # A span with events is at least `{"events":[]}` long.
        self.cuts = np.empty((size // len('{"events":[]}') + 1, 2), dtype=np.int64)

    def __len__(self) -> int:
        return self._size


@numba.njit(cache=True, nogil=True)
def _gather(
    buf: np.ndarray, strings: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """Arrow string offsets, per slot, and the data they share, of rows [0, n) of `strings`:
    slot s of row k is buf[strings[k, s, 0]:strings[k, s, 1]] (a null, start < 0, is empty)."""
    slots = strings.shape[1]
    offsets = np.empty((slots, n + 1), dtype=np.int32)
    total = 0
    for s in range(slots):
        offsets[s, 0] = total
        for k in range(n):
            if strings[k, s, 0] >= 0:
                total += strings[k, s, 1] - strings[k, s, 0]
            offsets[s, k + 1] = total
    data = np.empty(total, dtype=np.uint8)
    for k in range(n):
        for s in range(slots):
            at = offsets[s, k]
            start = strings[k, s, 0]
            for b in range(offsets[s, k + 1] - at):
                data[at + b] = buf[start + b]
    return offsets, data


class _Strings:
    """The string columns of a scan as Arrow arrays, over one shared data buffer."""

    def __init__(self, buf: np.ndarray, strings: np.ndarray, n: int) -> None:
        self._offsets, data = _gather(buf, strings, n)
        self._data = pa.py_buffer(data)
        self._valid = strings[:n, :, 0] >= 0

    def column(self, slot: int) -> pa.Array:
        valid = self._valid[:, slot]
        return pa.Array.from_buffers(
            pa.string(),
            len(valid),
            [_bitmap(valid), pa.py_buffer(self._offsets[slot]), self._data],
            null_count=int(len(valid) - valid.sum()),
        )


def _bitmap(valid: np.ndarray) -> pa.Buffer | None:
    return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


@numba.njit(cache=True, nogil=True)
def _gather_items(
    shapes: np.ndarray, items: np.ndarray, items_ok: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """Arrow list offsets, values and their validity: row k holds items[start:stop] (start < 0: null)."""
    n = len(shapes)
    offsets = np.zeros(n + 1, dtype=np.int32)
    for k in range(n):
        offsets[k + 1] = offsets[k] + (shapes[k, 1] - shapes[k, 0] if shapes[k, 0] >= 0 else 0)
    values = np.empty(offsets[n], dtype=np.int64)
    valid = np.empty(offsets[n], dtype=np.bool_)
    for k in range(n):
        if shapes[k, 0] >= 0:
            values[offsets[k] : offsets[k + 1]] = items[shapes[k, 0] : shapes[k, 1]]
            valid[offsets[k] : offsets[k + 1]] = items_ok[shapes[k, 0] : shapes[k, 1]]
    return offsets, values, valid


def _lists(shapes: np.ndarray, items: np.ndarray, items_ok: np.ndarray) -> pa.Array:
    offsets, values, valid = _gather_items(np.ascontiguousarray(shapes), items, items_ok)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, mask=~valid), mask=pa.array(shapes[:, 0] < 0))
