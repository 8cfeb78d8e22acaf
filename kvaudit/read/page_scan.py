"""The reader's fast path: page descriptor events scanned straight from OTLP JSON bytes.

Page events are nearly all of a trace file's bytes (about 1.4 KB each, ~20 attributes
as `{"key": ..., "value": {...}}` objects), and decoding them into Python objects cost
more than everything else the reader does. So a compiled scanner (numba) walks each
line's `resourceSpans[].scopeSpans[].spans[].events[]` and writes page attributes into
preallocated arrays, with no Python object per page.

It is deliberately narrow: it reads what JSON writers actually write (compact, or made
compact first: see `compact`) and gives up on a line at anything else (an escape or
non-ASCII byte in a string it must read, a nested array or map value, a repeated field,
a type msgspec would reject, a number that is not a plain integer, broken JSON). The
reader decodes such a line the general way, so both paths give the same rows and the
same errors (tests/test_page_scan.py holds them equal, on random lines and on lines
broken at random).

Its machine code is built once and kept in a user cache directory (`scanner_cache`).

It runs before msgspec. Where it read every byte of a line's `events` arrays by its
exact paths (see _scan), those bytes are valid JSON, and msgspec decodes the spans and
resources of the line without them: skipping the events had been most of msgspec's time.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numba
import numpy as np
import pyarrow as pa
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from kvaudit.contract import EVENT_PAGE
from kvaudit.read import scanner_cache
from kvaudit.read.buffer_pool import BufferPool

# Before any function below is decorated: numba picks a function's cache directory then.
numba.config.CACHE_DIR = scanner_cache.numba_cache_dir()

# Column kinds as the scanner numbers them (kvaudit.read.reader maps its own kinds onto these).
STR, INT, BOOL, INTS = 0, 1, 2, 3

_FAIL: Final = -1  # a position that says: this line needs the general decoder
_GENERAL: Final = -2  # not in the compact form: read it the general way
# The scan's `state` array: array items written, whether the line took a lenient path
# (see _scan), events arrays cut out.
_ITEMS, _LENIENT, _CUTS = 0, 1, 2
PAD: Final = 64  # zero bytes after a scanned buffer, so a look past a line's end stays in memory
# The shortest page event, `{"name":"kvaudit.page"}`: it bounds the rows a buffer can hold.
_MIN_EVENT_BYTES: Final = len('{"name":""}') + len(EVENT_PAGE)


def _ascii(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), dtype=np.uint8).copy()


_RESOURCE_SPANS, _SCOPE_SPANS, _SPANS, _EVENTS = map(_ascii, ("resourceSpans", "scopeSpans", "spans", "events"))
_TIME, _NAME, _ATTRIBUTES, _DROPPED = map(_ascii, ("timeUnixNano", "name", "attributes", "droppedAttributesCount"))
_KEY, _VALUE, _VALUES = map(_ascii, ("key", "value", "values"))
# AnyValue's fields, numbered by their index in this tuple.
_STRING_VALUE, _INT_VALUE, _BOOL_VALUE, _DOUBLE_VALUE, _BYTES_VALUE, _ARRAY_VALUE, _KVLIST_VALUE = map(
    _ascii, ("stringValue", "intValue", "boolValue", "doubleValue", "bytesValue", "arrayValue", "kvlistValue")
)
_NULL, _TRUE, _FALSE = map(_ascii, ("null", "true", "false"))
# The compact form every writer we know uses (the OpenTelemetry Collector, the SDK's
# encoders, kvaudit): read with a few fixed comparisons instead of the general walk.
_KEY_OPEN, _VALUE_OPEN = map(_ascii, ('{"key":"', '","value":{"'))
_COMPACT_STRING, _COMPACT_INT, _COMPACT_BOOL, _COMPACT_ARRAY = (
    'stringValue":',
    'intValue":',
    'boolValue":',
    'arrayValue":{',
)
_PAGE_EVENT: Final = _ascii(EVENT_PAGE)


@intrinsic
def _unmanaged(typingctx: object, array: types.Array) -> tuple:  # pragma: no cover - compiled
    """The same array without its reference count: the scanner passes a handful of arrays
    through millions of calls, and counting each pass cost about half its time. Only
    for arrays that a caller up the stack keeps alive."""

    def codegen(context, builder, signature, args):  # numba's codegen protocol
        view = context.make_array(signature.args[0])(context, builder, value=args[0])
        view.meminfo = cgutils.get_null_value(view.meminfo.type)
        view.parent = cgutils.get_null_value(view.parent.type)
        return view._getvalue()

    return array(array), codegen


# --- JSON primitives ------------------------------------------------------------------
# Each takes the buffer, a position and the end of the line, and returns the position
# after what it read (or _FAIL).


@numba.njit(cache=True, nogil=True)
def _ws(buf: np.ndarray, i: int) -> int:  # pragma: no cover - compiled
    """Past white space. Not past a newline: no line holds one, so it is the line's end."""
    while buf[i] == 32 or buf[i] == 13 or buf[i] == 9:
        i += 1
    return i


@intrinsic
def _load8(typingctx: object, buf: types.Array, i: types.Integer) -> tuple:  # pragma: no cover - compiled
    """The 8 bytes at buf[i] as one little-endian uint64, at any alignment."""

    def codegen(context, builder, signature, args):  # numba's codegen protocol
        view = context.make_array(signature.args[0])(context, builder, value=args[0])
        at = builder.gep(view.data, [args[1]])
        return builder.load(builder.bitcast(at, ir.IntType(64).as_pointer()), align=1)

    return types.uint64(buf, i), codegen


_ONES: Final = np.uint64(0x0101010101010101)
_HIGH: Final = np.uint64(0x8080808080808080)
_QUOTES: Final = np.uint64(0x2222222222222222)
_BACKSLASHES: Final = np.uint64(0x5C5C5C5C5C5C5C5C)
_SPACES: Final = np.uint64(0x2020202020202020)


@numba.njit(cache=True, nogil=True)
def _plain_word(word: np.uint64) -> bool:  # pragma: no cover - compiled
    """Whether 8 bytes hold no quote, no backslash, no control character and no byte above
    127 (the usual bit trick: x - 0x01.. & ~x & 0x80.. is nonzero when some byte of x is
    zero, and x - 0x20.. & ~x & 0x80.. when some byte is below 0x20)."""
    q = word ^ _QUOTES
    b = word ^ _BACKSLASHES
    return ((q - _ONES) & ~q | (b - _ONES) & ~b | (word - _SPACES) & ~word | word) & _HIGH == 0


def _words(text: bytes, count: int) -> tuple[np.ndarray, np.ndarray]:
    """`text` as `count` little-endian uint64 words, and the masks of the bytes it fills."""
    padded = text.ljust(8 * count, b"\0")
    filled = (b"\xff" * len(text)).ljust(8 * count, b"\0")
    return np.frombuffer(padded, dtype="<u8").copy(), np.frombuffer(filled, dtype="<u8").copy()


@numba.njit(cache=True, nogil=True)
def _words_at(buf: np.ndarray, i: int, words: np.ndarray, masks: np.ndarray) -> bool:  # pragma: no cover - compiled
    """Whether the text of _words(text) starts at buf[i], compared a word at a time (it may
    look up to 8 * len(words) bytes ahead: PAD covers that)."""
    differ = np.uint64(0)
    for k in range(len(words)):
        if masks[k] == 0:
            break
        differ |= (_load8(buf, i + 8 * k) ^ words[k]) & masks[k]
    return differ == 0


@numba.njit(cache=True, nogil=True)
def _string(buf: np.ndarray, i: int, end: int) -> tuple[int, bool]:  # pragma: no cover - compiled
    """Past the string whose quote is at buf[i]; and whether it is plain: ASCII without escapes
    or control characters (JSON allows none raw; a plain string is valid JSON)."""
    i += 1
    while i + 8 <= end and _plain_word(_load8(buf, i)):
        i += 8
    plain = True
    while i < end:
        c = buf[i]
        if c == 34:
            return i + 1, plain
        if c == 92:
            plain = False
            i += 1
        elif c >= 128 or c < 32:
            plain = False
        i += 1
    return _FAIL, False


@numba.njit(cache=True, nogil=True)
def _skip(buf: np.ndarray, i: int, end: int) -> int:  # pragma: no cover - compiled
    """Past any JSON value."""
    c = buf[i]
    if c == 34:
        return _string(buf, i, end)[0]
    if c == 123 or c == 91:
        depth = 0
        while i < end:
            c = buf[i]
            if c == 34:
                i = _string(buf, i, end)[0]
                if i < 0:
                    return _FAIL
                continue
            if c == 123 or c == 91:
                depth += 1
            elif c == 125 or c == 93:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return _FAIL
    while i < end:
        c = buf[i]
        if c == 44 or c == 125 or c == 93 or c == 32 or c == 10 or c == 13 or c == 9:
            return i
        i += 1
    return i


@numba.njit(cache=True, nogil=True)
def _is(buf: np.ndarray, start: int, stop: int, text: np.ndarray) -> bool:  # pragma: no cover - compiled
    return stop - start == len(text) and _at(buf, start, text)


@numba.njit(cache=True, nogil=True)
def _at(buf: np.ndarray, i: int, text: np.ndarray) -> bool:  # pragma: no cover - compiled
    """Whether `text` starts at buf[i] (the padding keeps a look past the end in memory)."""
    for k in range(len(text)):  # noqa: SIM110 - numba compiles loops, not generators
        if buf[i + k] != text[k]:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def _member(buf: np.ndarray, i: int, end: int) -> tuple[int, int, int]:  # pragma: no cover - compiled
    """An object member's key at buf[i]: (key start, key stop, position of its value)."""
    if buf[i] != 34:
        return 0, 0, _FAIL
    stop, plain = _string(buf, i, end)
    if stop < 0 or not plain:
        return 0, 0, _FAIL
    colon = _ws(buf, stop)
    if buf[colon] != 58:
        return 0, 0, _FAIL
    return i + 1, stop - 1, _ws(buf, colon + 1)


@numba.njit(cache=True, nogil=True)
def _next(buf: np.ndarray, i: int) -> int:  # pragma: no cover - compiled
    """Past a member or item just read and its comma: at the next one or the closing bracket.
    What JSON does not allow there (no comma, or a comma before a closing bracket) fails."""
    if i < 0:
        return _FAIL
    i = _ws(buf, i)
    c = buf[i]
    if c == 44:
        i = _ws(buf, i + 1)
        c = buf[i]
        return _FAIL if c == 93 or c == 125 else i
    return i if c == 93 or c == 125 else _FAIL


@numba.njit(cache=True, nogil=True)
def _open(buf: np.ndarray, i: int, bracket: int) -> int:  # pragma: no cover - compiled
    """Inside the object or array (`bracket`) that must start at buf[i]."""
    if i < 0 or buf[i] != bracket:
        return _FAIL
    return _ws(buf, i + 1)


_INT64_MAX: Final = np.uint64(2**63 - 1)


@numba.njit(cache=True, nogil=True)
def _integer(buf: np.ndarray, start: int, stop: int) -> tuple[bool, int]:  # pragma: no cover - compiled
    """A decimal int64 in buf[start:stop] (19 digits fit a uint64, so the range check is exact)."""
    negative = start < stop and buf[start] == 45
    if negative:
        start += 1
    if stop <= start or stop - start > 19:
        return False, 0
    value = np.uint64(0)
    for k in range(start, stop):
        digit = buf[k] - np.uint8(48)
        if digit > 9:
            return False, 0
        value = value * np.uint64(10) + np.uint64(digit)
    if value > _INT64_MAX + np.uint64(negative):
        return False, 0
    return True, -np.int64(value - np.uint64(1)) - 1 if negative else np.int64(value)


@numba.njit(cache=True, nogil=True)
def _int64(buf: np.ndarray, i: int, end: int) -> tuple[int, bool, int]:  # pragma: no cover - compiled
    """An OTLP int64 at buf[i] (digits as a string or a number, or null): (end, present, value)."""
    if buf[i] == 34:
        stop, plain = _string(buf, i, end)
        if stop < 0 or not plain:
            return _FAIL, False, 0
        ok, value = _integer(buf, i + 1, stop - 1)
        return (stop if ok else _FAIL), ok, value
    stop = _skip(buf, i, end)
    if _is(buf, i, stop, _NULL):
        return stop, False, 0
    ok, value = _number(buf, i, stop)
    return (stop if ok else _FAIL), ok, value


@numba.njit(cache=True, nogil=True)
def _number(buf: np.ndarray, start: int, stop: int) -> tuple[bool, int]:  # pragma: no cover - compiled
    """_integer for a JSON number, which allows no leading zero."""
    first = start + (buf[start] == 45)
    if buf[first] == 48 and stop - first > 1:
        return False, 0
    return _integer(buf, start, stop)


# --- the OTLP tree --------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _any_value(
    buf: np.ndarray, i: int, end: int, array: bool
) -> tuple[int, int, int, bool, int, int, int]:  # pragma: no cover - compiled
    """An AnyValue object at buf[i], checked as msgspec checks it.

    Returns (end, string start, string stop, int present, int, bool as -1 absent/0/1,
    arrayValue position). The string bounds are -1 when it has none. An arrayValue is
    only taken where `array` is set, and left for _int_items to read (numba compiles no
    recursion well); its position is -1 when there is none. Maps always fall back.
    """
    fail = (_FAIL, -1, -1, False, 0, -1, -1)
    s_start = s_stop = -1
    int_ok = False
    int_value = 0
    flag = -1
    array_at = -1
    seen = 0
    i = _open(buf, i, 123)
    while i >= 0 and buf[i] != 125:
        k_start, k_stop, i = _member(buf, i, end)
        if i < 0:
            return fail
        field = -1
        for f, name in enumerate(
            (_STRING_VALUE, _INT_VALUE, _BOOL_VALUE, _DOUBLE_VALUE, _BYTES_VALUE, _ARRAY_VALUE, _KVLIST_VALUE)
        ):
            if _is(buf, k_start, k_stop, name):
                field = f
                break
        if field >= 0:
            if seen & (1 << field):
                return fail  # a repeated field: msgspec keeps the last, let it
            seen |= 1 << field
        c = buf[i]
        if field == -1:
            i = _skip(buf, i, end)
        elif c == 110:
            stop = _skip(buf, i, end)
            if not _is(buf, i, stop, _NULL):
                return fail
            i = stop
        elif field == 0 or field == 4:
            if c != 34:
                return fail
            stop, plain = _string(buf, i, end)
            if stop < 0 or not plain:
                return fail
            if field == 0:
                s_start, s_stop = i + 1, stop - 1
            i = stop
        elif field == 1:
            i, int_ok, int_value = _int64(buf, i, end)
        elif field == 2:
            stop = _skip(buf, i, end)
            if _is(buf, i, stop, _TRUE):
                flag = 1
            elif _is(buf, i, stop, _FALSE):
                flag = 0
            else:
                return fail
            i = stop
        elif field == 3:
            if c == 34:
                stop, plain = _string(buf, i, end)
                if not plain:
                    return fail
                i = stop
            elif c == 45 or 48 <= c <= 57:
                i = _skip(buf, i, end)
            else:
                return fail
        elif field == 5 and array:
            array_at = i
            i = _skip(buf, i, end)
        else:
            return fail
        i = _next(buf, i)
    if i < 0:
        return fail
    return i + 1, s_start, s_stop, int_ok, int_value, flag, array_at


_STRING_WORDS, _INT_WORDS, _BOOL_WORDS, _ARRAY_WORDS = (
    _words(text.encode(), 2) for text in (_COMPACT_STRING, _COMPACT_INT, _COMPACT_BOOL, _COMPACT_ARRAY)
)
_KEY_OPEN_WORD: Final = _words(_KEY_OPEN.tobytes(), 1)[0][0]


# The three functions run per attribute are inlined (numba's own inliner): a call passes
# every array of `out` and `names` by value, and inlining them took ~20% off a scan.
# Inlining more cost minutes of compile time for no measurable gain.
@numba.njit(cache=True, nogil=True, inline="always")
def _compact_value(
    buf: np.ndarray, i: int, end: int, array: bool
) -> tuple[int, int, int, bool, int, int, int]:  # pragma: no cover - compiled
    """_any_value for the compact one-field form (`{"intValue":"46"}`); end _GENERAL for any other."""
    general = (_GENERAL, -1, -1, False, 0, -1, -1)
    f = i + 2
    c = buf[f]
    if buf[i] != 123 or buf[i + 1] != 34:
        return general
    if c == 115 and _words_at(buf, f, _STRING_WORDS[0], _STRING_WORDS[1]):
        v = f + len(_COMPACT_STRING)
        if buf[v] != 34:
            return general
        stop, plain = _string(buf, v, end)
        if not plain or buf[stop] != 125:
            return general
        return stop + 1, v + 1, stop - 1, False, 0, -1, -1
    if c == 105 and _words_at(buf, f, _INT_WORDS[0], _INT_WORDS[1]):
        stop, ok, value = _int64(buf, f + len(_COMPACT_INT), end)
        if stop < 0 or buf[stop] != 125:
            return general
        return stop + 1, -1, -1, ok, value, -1, -1
    if c == 98 and _words_at(buf, f, _BOOL_WORDS[0], _BOOL_WORDS[1]):
        v = f + len(_COMPACT_BOOL)
        if _at(buf, v, _TRUE) and buf[v + 4] == 125:
            return v + 5, -1, -1, False, 0, 1, -1
        if _at(buf, v, _FALSE) and buf[v + 5] == 125:
            return v + 6, -1, -1, False, 0, 0, -1
        return general
    if array and c == 97 and _words_at(buf, f, _ARRAY_WORDS[0], _ARRAY_WORDS[1]):
        array_at = f + len(_COMPACT_ARRAY) - 1  # the ArrayValue object
        stop = _skip(buf, array_at, end)
        if stop < 0 or buf[stop] != 125:
            return general
        return stop + 1, -1, -1, False, 0, -1, array_at
    return general


@numba.njit(cache=True, nogil=True)
def _int_items(
    buf: np.ndarray, i: int, end: int, items: np.ndarray, items_ok: np.ndarray, state: np.ndarray
) -> tuple[int, int]:  # pragma: no cover - compiled
    """An ArrayValue object `{"values": [AnyValue...]}` whose items' intValues go to `items`
    from state[_ITEMS] on: (end, items end)."""
    start = state[_ITEMS]
    n_items = start
    seen = False
    i = _open(buf, i, 123)
    while i >= 0 and buf[i] != 125:
        k_start, k_stop, i = _member(buf, i, end)
        if i < 0:
            return _FAIL, _FAIL
        if not _is(buf, k_start, k_stop, _VALUES):
            state[_LENIENT] = True
            i = _next(buf, _skip(buf, i, end))
            continue
        if seen:
            return _FAIL, _FAIL
        seen = True
        n_items = start
        i = _open(buf, i, 91)
        while i >= 0 and buf[i] != 93:
            if n_items >= len(items):
                return _FAIL, _FAIL
            stop, _, _, ok, value, _, _ = _compact_value(buf, i, end, False)
            if stop == _GENERAL:
                state[_LENIENT] = True
                stop, _, _, ok, value, _, _ = _any_value(buf, i, end, False)
            i = stop
            items[n_items] = value
            items_ok[n_items] = ok
            n_items += 1
            i = _next(buf, i)
        if i < 0:
            return _FAIL, _FAIL
        i = _next(buf, i + 1)
    if i < 0:
        return _FAIL, _FAIL
    return i + 1, n_items


_TABLE: Final = 256  # slots of the attribute name hash table


@numba.njit(cache=True, nogil=True)
def _name_hash(buf: np.ndarray, start: int, stop: int, salt: int) -> int:  # pragma: no cover - compiled
    """A hash of a name's length and last 8 bytes (attribute names share their prefixes)."""
    h = np.uint64(stop - start) * np.uint64(salt)
    for k in range(max(start, stop - 8), stop):
        h = (h ^ np.uint64(buf[k])) * np.uint64(0x100000001B3)
    return np.int64((h >> np.uint64(29)) & np.uint64(_TABLE - 1))


@numba.njit(cache=True, nogil=True)
def _column(buf: np.ndarray, start: int, stop: int, names: tuple) -> int:  # pragma: no cover - compiled
    """The column whose attribute name is buf[start:stop], or -1.

    `names` is (keys, columns, table, heads, head masks, follow): every column's attribute
    name concatenated, per column (name start, name stop, kind, slot), the hash table of
    _hash_table, each column's name and `","value":{"` as _words, and per attribute
    (its column + 1, 0 at an event's start) the column that followed it last.
    """
    keys, columns, table = names[0], names[1], names[2]
    c = table[_name_hash(buf, start, stop, table[_TABLE])]
    if c >= 0 and _is(buf, start, stop, keys[columns[c, 0] : columns[c, 1]]):
        return c
    return -1


@numba.njit(cache=True, nogil=True)
def _kind_slot(columns: np.ndarray, column: int) -> tuple[int, int]:  # pragma: no cover - compiled
    """A column's (kind, slot), or (-1, 0) for an attribute that is no column (-1)."""
    return (columns[column, 2], columns[column, 3]) if column >= 0 else (-1, 0)


@numba.njit(cache=True, nogil=True, inline="always")
def _value(
    buf: np.ndarray, i: int, end: int, kind: int, slot: int, row: int, out: tuple
) -> int:  # pragma: no cover - compiled
    """The AnyValue at buf[i] into row `row` of column (kind, slot) of `out` (kind -1: checked,
    kept nowhere). With i < 0 (none given: msgspec's default AnyValue) the column is
    absent and it returns 0."""
    strings, ints, ints_ok, flags, shapes, items, items_ok, state = out
    stop, s_start, s_stop, int_ok, int_value, flag, array_at = 0, -1, -1, False, 0, -1, -1
    if i >= 0:
        stop, s_start, s_stop, int_ok, int_value, flag, array_at = _compact_value(buf, i, end, kind == INTS)
        if stop == _GENERAL:
            state[_LENIENT] = True
            stop, s_start, s_stop, int_ok, int_value, flag, array_at = _any_value(buf, i, end, kind == INTS)
        if stop < 0:
            return _FAIL
    items_end = -1
    if array_at >= 0:
        array_end, items_end = _int_items(buf, array_at, end, items, items_ok, state)
        if items_end < 0:
            return _FAIL
        if array_end != stop - 1:  # the value was skipped, not read, up to its end
            state[_LENIENT] = True
    # Each write replaces an earlier attribute of the same name: msgspec's last one wins.
    if kind == STR:
        strings[row, slot, 0] = s_start
        strings[row, slot, 1] = s_stop
    elif kind == INT:
        ints[row, slot] = int_value
        ints_ok[row, slot] = int_ok
    elif kind == BOOL:
        flags[row] = flag
    elif kind == INTS:
        shapes[row, 0] = state[_ITEMS] if items_end >= 0 else -1
        shapes[row, 1] = items_end
        if items_end >= 0:
            state[_ITEMS] = items_end
    return stop


@numba.njit(cache=True, nogil=True, inline="always")
def _attribute(
    buf: np.ndarray, i: int, end: int, names: tuple, row: int, out: tuple, after: int
) -> tuple[int, int]:  # pragma: no cover - compiled
    """A KeyValue object at buf[i]; a page attribute's value is written to row `row` of `out`.

    Writers put attributes in the same order every time, so the column that followed
    the previous attribute's (`after`: its column + 1, 0 at an event's start) last time
    is tried first, its name and what follows compared a word at a time. Returns the
    end and what `after` is for the next attribute.
    """
    if _load8(buf, i) == _KEY_OPEN_WORD:
        columns, heads, head_masks, follow = names[1], names[3], names[4], names[5]
        name = i + len(_KEY_OPEN)
        column = follow[after]
        at = -1  # the value object
        if column >= 0 and _words_at(buf, name, heads[column], head_masks[column]):
            at = name + columns[column, 1] - columns[column, 0] + len(_VALUE_OPEN) - 2
        else:
            stop, plain = _string(buf, name - 1, end)
            if plain and _at(buf, stop - 1, _VALUE_OPEN):
                column = _column(buf, name, stop - 1, names)
                follow[after] = column
                at = stop - 1 + len(_VALUE_OPEN) - 2
        if at >= 0:
            kind, slot = _kind_slot(columns, column)
            stop = _value(buf, at, end, kind, slot, row, out)
            if stop >= 0 and buf[stop] == 125:
                return stop + 1, column + 1
    return _general_attribute(buf, i, end, names, row, out), 0


@numba.njit(cache=True, nogil=True)
def _general_attribute(
    buf: np.ndarray, i: int, end: int, names: tuple, row: int, out: tuple
) -> int:  # pragma: no cover - compiled
    """_attribute for any member order and spacing."""
    out[7][_LENIENT] = True
    column = -2  # not yet known
    kind, slot = -1, 0
    v_start = -1  # a value met before its key, read once the key is known
    has_value = False
    i = _open(buf, i, 123)
    while i >= 0 and buf[i] != 125:
        m_start, m_stop, i = _member(buf, i, end)
        if i < 0:
            return _FAIL
        if _is(buf, m_start, m_stop, _KEY):
            if column != -2 or buf[i] != 34:
                return _FAIL
            stop, plain = _string(buf, i, end)
            if not plain:
                return _FAIL
            column = _column(buf, i + 1, stop - 1, names)
            kind, slot = _kind_slot(names[1], column)
            i = stop
        elif _is(buf, m_start, m_stop, _VALUE):
            if has_value or buf[i] != 123:
                return _FAIL
            has_value = True
            if column == -2:
                v_start = i
                i = _skip(buf, i, end)
            else:
                i = _value(buf, i, end, kind, slot, row, out)
        else:
            i = _skip(buf, i, end)
        i = _next(buf, i)
    if i < 0 or column == -2:
        return _FAIL
    # A value given before its key is read now; none given makes the column absent.
    if (v_start >= 0 or not has_value) and _value(buf, v_start, end, kind, slot, row, out) < 0:
        return _FAIL
    return i + 1


@numba.njit(cache=True, nogil=True)
def _event(
    buf: np.ndarray, i: int, end: int, names: tuple, row: int, out: tuple
) -> tuple[int, bool, int]:  # pragma: no cover - compiled
    """An Event object at buf[i], its attributes written to row `row`: (end, is a page, time)."""
    strings, ints_ok, flags, shapes = out[0], out[2], out[3], out[4]
    strings[row, :, 0] = -1
    ints_ok[row, :] = False
    flags[row] = -1
    shapes[row, 0] = -1
    time = 0
    page = False
    seen = 0
    i = _open(buf, i, 123)
    while i >= 0 and buf[i] != 125:
        m_start, m_stop, i = _member(buf, i, end)
        if i < 0:
            return _FAIL, False, 0
        if _is(buf, m_start, m_stop, _TIME):
            if seen & 1 or buf[i] == 110:  # repeated, or null (no int | str)
                return _FAIL, False, 0
            seen |= 1
            i, _, time = _int64(buf, i, end)
        elif _is(buf, m_start, m_stop, _NAME):
            if seen & 2 or buf[i] != 34:
                return _FAIL, False, 0
            seen |= 2
            stop, plain = _string(buf, i, end)
            if not plain:
                return _FAIL, False, 0
            page = _is(buf, i + 1, stop - 1, _PAGE_EVENT)
            i = stop
        elif _is(buf, m_start, m_stop, _ATTRIBUTES):
            if seen & 4:
                return _FAIL, False, 0
            seen |= 4
            i = _open(buf, i, 91)
            after = 0
            while i >= 0 and buf[i] != 93:
                i, after = _attribute(buf, i, end, names, row, out, after)
                i = _next(buf, i)
            if i >= 0:
                i += 1
        elif _is(buf, m_start, m_stop, _DROPPED):
            stop = _skip(buf, i, end)
            if not _number(buf, i, stop)[0]:
                return _FAIL, False, 0
            i = stop
        else:
            out[7][_LENIENT] = True
            i = _skip(buf, i, end)
        i = _next(buf, i)
    if i < 0:
        return _FAIL, False, 0
    return i + 1, page, time


@numba.njit(cache=True, nogil=True)
def _line(
    buf: np.ndarray,
    i: int,
    end: int,
    line: int,
    n: int,
    names: tuple,
    rows: np.ndarray,
    out: tuple,
    cuts: np.ndarray,
) -> tuple[int, int]:  # pragma: no cover - compiled
    """The page events of one line, as rows from `n` on: (rows now, spans seen), rows -1 to fall back.

    One pass with an explicit stack: depth d is inside an object holding the array
    named _PATH[d] (the line, a ResourceSpans, a ScopeSpans, a Span); the items of a
    Span's `events` are read by _event. Repeated names fall back (msgspec keeps the
    last); other members are skipped. Each `events` array's brackets go to `cuts`.
    """
    state = out[7]
    path = (_RESOURCE_SPANS, _SCOPE_SPANS, _SPANS, _EVENTS)
    found = np.zeros(4, dtype=np.bool_)
    depth = 0
    in_array = False
    spans = 0
    i = _open(buf, _ws(buf, i), 123)
    while i >= 0:
        if in_array:
            if buf[i] == 93:
                if depth == 3:
                    if state[_CUTS] >= len(cuts):
                        return _FAIL, spans
                    cuts[state[_CUTS], 1] = i
                    state[_CUTS] += 1
                in_array = False
                i = _next(buf, i + 1)
            elif depth == 3:
                if n >= len(rows):
                    return _FAIL, spans
                i, page, time = _event(buf, i, end, names, n, out)
                if page and i >= 0:
                    rows[n, 0] = line
                    rows[n, 1] = spans - 1
                    rows[n, 2] = time
                    n += 1
                i = _next(buf, i)
            else:
                i = _open(buf, i, 123)
                depth += 1
                found[depth] = False
                in_array = False
                spans += depth == 3
        elif buf[i] == 125:
            if depth == 0:
                return n, spans
            depth -= 1
            in_array = True
            i = _next(buf, i + 1)
        else:
            m_start, m_stop, i = _member(buf, i, end)
            if i >= 0 and _is(buf, m_start, m_stop, path[depth]):
                if found[depth] or buf[i] != 91:
                    return _FAIL, spans
                found[depth] = True
                in_array = True
                if depth == 3 and state[_CUTS] < len(cuts):
                    cuts[state[_CUTS], 0] = i
                i = _ws(buf, i + 1)
            elif i >= 0:
                i = _next(buf, _skip(buf, i, end))
    return _FAIL, spans


@numba.njit(cache=True, nogil=True)
def _scan(
    buf: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    names: tuple,
    rows: np.ndarray,
    out: tuple,
    cuts: np.ndarray,
    lines: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """Scan lines [starts[k], ends[k]); returns the rows written.

    `rows` gets (line, span, time) per row, `cuts` the brackets of each `events` array.
    Per line, `lines` gets (spans, whether it was read strictly, cuts end), spans -1
    for a line that needs the general decoder (it leaves no rows and no cuts).

    A line read strictly had every byte of its `events` arrays read by the exact paths
    (the compact forms, known members only): those bytes are valid JSON, and msgspec
    need not see them. A lenient path skipped some of them unchecked.
    """
    buf = _unmanaged(buf)
    names = (
        _unmanaged(names[0]),
        _unmanaged(names[1]),
        _unmanaged(names[2]),
        _unmanaged(names[3]),
        _unmanaged(names[4]),
        _unmanaged(names[5]),
    )
    rows = _unmanaged(rows)
    cuts = _unmanaged(cuts)
    out = (
        _unmanaged(out[0]),
        _unmanaged(out[1]),
        _unmanaged(out[2]),
        _unmanaged(out[3]),
        _unmanaged(out[4]),
        _unmanaged(out[5]),
        _unmanaged(out[6]),
        _unmanaged(out[7]),
    )
    state = out[7]
    n = 0
    for line in range(len(starts)):
        items_before, cuts_before = state[_ITEMS], state[_CUTS]
        state[_LENIENT] = False
        after, spans = _line(buf, starts[line], ends[line], line, n, names, rows, out, cuts)
        if after < 0:
            state[_ITEMS], state[_CUTS] = items_before, cuts_before
            spans = -1
        else:
            n = after
        lines[line, 0] = spans
        lines[line, 1] = not state[_LENIENT]
        lines[line, 2] = state[_CUTS]
    return n


# --- insignificant white space ---------------------------------------------------------
# Writers in the json.dumps style put a space after every separator, and a pretty-printed
# document is mostly indentation. The scanner's fast path compares the compact form a
# word at a time, so such lines are made compact first, in place: white space outside
# strings goes, except between two bare tokens (`1 2`), which JSON does not allow and
# which must stay for the scanner to refuse the line as msgspec would. Valid JSON stays
# the same value; invalid JSON stays invalid. The freed bytes at the end become spaces.

_SPACED_LOOK: Final = 64  # a line with no white space outside strings in its first bytes is taken as compact


@numba.njit(cache=True, nogil=True)
def _white(c: int) -> bool:  # pragma: no cover - compiled
    return c == 32 or c == 10 or c == 13 or c == 9


@numba.njit(cache=True, nogil=True)
def _bare(c: int) -> bool:  # pragma: no cover - compiled
    """Whether `c` is part of a number or literal (nor white space, a string or structure)."""
    return not (_white(c) or c == 34 or c == 123 or c == 125 or c == 91 or c == 93 or c == 44 or c == 58 or c == 0)


@numba.njit(cache=True, nogil=True)
def _spaced_lines(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    for k in range(len(starts)):
        i, end = starts[k], ends[k]
        look = min(end, i + _SPACED_LOOK)
        out[k] = False
        while i < look:
            c = buf[i]
            if c == 34:
                i = _string(buf, i, end)[0]
                if i < 0:
                    break
            elif _white(c):
                out[k] = True
                break
            else:
                i += 1


@numba.njit(cache=True, nogil=True)
def _compact_lines(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:  # pragma: no cover - compiled
    for k in range(len(starts)):
        i = w = starts[k]
        end = ends[k]
        last = 0  # the last byte kept (0: none yet)
        while i < end:
            c = buf[i]
            if c == 34:  # a string, kept as it is
                stop = _string(buf, i, end)[0]
                if stop < 0:
                    stop = end
                if w == i:
                    w = i = stop
                else:
                    while i < stop:
                        buf[w] = buf[i]
                        w += 1
                        i += 1
                last = 34
            elif _white(c):
                while i < end and _white(buf[i]):
                    i += 1
                if _bare(last) and i < end and _bare(buf[i]):
                    buf[w] = 32
                    w += 1
            else:
                buf[w] = c
                w += 1
                i += 1
                last = c
        ends[k] = w
        while w < end:
            buf[w] = 32
            w += 1


def spaced(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per line buf[starts[k]:ends[k]], whether it has white space outside strings in its
    first bytes (then `compact` makes it a line the fast path reads)."""
    out = np.empty(len(starts), dtype=np.bool_)
    _spaced_lines(buf, starts, ends, out)
    return out


def compact(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Take the insignificant white space out of the lines buf[starts[k]:ends[k]], in place;
    returns where each ends now (spaces fill the rest of its bytes). A pretty-printed
    document is two thirds indentation: what is read after is the third that is left."""
    compacted = np.array(ends, dtype=np.int64)
    _compact_lines(buf, starts, compacted)
    return compacted


# --- the Python side ------------------------------------------------------------------


@dataclass
class PageColumns:
    """Page rows scanned from one buffer, and what the scanner found of each line.

    `line` numbers the scanned lines from 0 and `span` counts the spans of that line
    in document order (the order msgspec decodes them in), so (line, span) finds the
    span each page belongs to. `columns` are the page attribute columns, in the order
    the scanner was given them. Per line: `spans` (-1: left to the general decoder),
    `strict` (see _scan), and in `cuts[cut_ends[k - 1]:cut_ends[k]]` the brackets of
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
        self._table = _hash_table(self._keys, self._columns)
        heads = [name + _VALUE_OPEN.tobytes() for name in names]
        if max(map(len, heads)) > PAD:
            raise ValueError(f"attribute names of at most {PAD - len(_VALUE_OPEN)} bytes")
        words = [_words(head, PAD // 8) for head in heads]
        self._heads = np.stack([w for w, _ in words])
        self._head_masks = np.stack([m for _, m in words])
        n_str, n_int = int((self._kinds == STR).sum()), int((self._kinds == INT).sum())
        self._scratch = BufferPool(
            keep=os.cpu_count() or 1,
            max_bytes=scratch_bytes + scratch_bytes // 4,  # the pool sizes what it makes a quarter up
            make=lambda size: _Scratch(size, n_str, n_int),
        )

    def _follow(self) -> np.ndarray:
        """A fresh table of which column followed which (see _column), one per scan: threads share a scanner."""
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
            n = _scan(
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
            cuts = scratch.cuts[: state[_CUTS]].copy()
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


def _hash_table(keys: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """A collision-free table from _name_hash to column (-1: none), its salt in the last slot."""
    for salt in range(1, 1 << 16):
        table = np.full(_TABLE + 1, -1, dtype=np.int64)
        for c, (start, stop, _, _) in enumerate(columns):
            h = _name_hash(keys, start, stop, salt)
            if table[h] >= 0:
                break
            table[h] = c
        else:
            table[_TABLE] = salt
            return table
    raise ValueError("no collision-free hash for these attribute names")


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
