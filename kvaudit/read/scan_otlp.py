"""The page scanner's OTLP grammar: the page events of a line, read into columns.

The compiled functions here walk one line of OTLP JSON along
`resourceSpans[].scopeSpans[].spans[].events[]` and write each page event's attributes
into preallocated arrays, with no Python object per page (`scan` is the entry). They
read AnyValue, KeyValue and Event objects as msgspec checks them (`kvaudit.otlp.schema`),
with `scan_json`'s primitives, and give up on a line (rows -1: the general decoder reads
it) wherever msgspec's answer could differ: a repeated field, a map value, a type it
would reject. The compact form every writer we know uses is read by fixed comparisons a
word at a time; any other form takes the general walk and marks the line lenient.
"""

from __future__ import annotations

from typing import Final

import numba
import numpy as np

from kvaudit.contract import EVENT_PAGE
from kvaudit.otlp.limits import MAX_ATTRIBUTES
from kvaudit.read.scan_json import (
    FAIL,
    FALSE,
    NULL,
    PAD,
    TRUE,
    inside,
    integer,
    is_text,
    load8,
    member,
    next_item,
    number,
    past_space,
    past_string,
    past_value,
    text_at,
    text_bytes,
    unmanaged,
    words,
    words_at,
)

# Column kinds as the scanner numbers them (kvaudit.read.reader maps its own kinds onto these).
STR, INT, BOOL, INTS = 0, 1, 2, 3

_GENERAL: Final = -2  # not in the compact form: read it the general way
# The scan's `state` array: array items written, whether the line took a lenient path
# (see `scan`), events arrays cut out.
_ITEMS, _LENIENT, CUTS = 0, 1, 2

_RESOURCE_SPANS, _SCOPE_SPANS, _SPANS, _EVENTS = map(text_bytes, ("resourceSpans", "scopeSpans", "spans", "events"))
_TIME, _NAME, _ATTRIBUTES, _DROPPED = map(text_bytes, ("timeUnixNano", "name", "attributes", "droppedAttributesCount"))
_KEY, _VALUE, _VALUES = map(text_bytes, ("key", "value", "values"))
# AnyValue's fields, numbered by their index in this tuple.
_STRING_VALUE, _INT_VALUE, _BOOL_VALUE, _DOUBLE_VALUE, _BYTES_VALUE, _ARRAY_VALUE, _KVLIST_VALUE = map(
    text_bytes, ("stringValue", "intValue", "boolValue", "doubleValue", "bytesValue", "arrayValue", "kvlistValue")
)
# The compact form every writer we know uses (the OpenTelemetry Collector, the SDK's
# encoders, kvaudit): read with a few fixed comparisons instead of the general walk.
_KEY_OPEN, _VALUE_OPEN = map(text_bytes, ('{"key":"', '","value":{"'))
_COMPACT_STRING, _COMPACT_INT, _COMPACT_BOOL, _COMPACT_ARRAY = (
    'stringValue":',
    'intValue":',
    'boolValue":',
    'arrayValue":{',
)
_PAGE_EVENT: Final = text_bytes(EVENT_PAGE)


@numba.njit(cache=True, nogil=True)
def _int64(buf: np.ndarray, i: int, end: int) -> tuple[int, bool, int]:  # pragma: no cover - compiled
    """An OTLP int64 at buf[i] (digits as a string or a number, or null): (end, present, value)."""
    if buf[i] == 34:
        stop, plain = past_string(buf, i, end)
        if stop < 0 or not plain:
            return FAIL, False, 0
        ok, value = integer(buf, i + 1, stop - 1)
        return (stop if ok else FAIL), ok, value
    stop = past_value(buf, i, end)
    if is_text(buf, i, stop, NULL):
        return stop, False, 0
    ok, value = number(buf, i, stop)
    return (stop if ok else FAIL), ok, value


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
    fail = (FAIL, -1, -1, False, 0, -1, -1)
    s_start = s_stop = -1
    int_ok = False
    int_value = 0
    flag = -1
    array_at = -1
    seen = 0
    i = inside(buf, i, 123)
    while i >= 0 and buf[i] != 125:
        k_start, k_stop, i = member(buf, i, end)
        if i < 0:
            return fail
        field = -1
        for f, name in enumerate(
            (_STRING_VALUE, _INT_VALUE, _BOOL_VALUE, _DOUBLE_VALUE, _BYTES_VALUE, _ARRAY_VALUE, _KVLIST_VALUE)
        ):
            if is_text(buf, k_start, k_stop, name):
                field = f
                break
        if field >= 0:
            if seen & (1 << field):
                return fail  # a repeated field: msgspec keeps the last, let it
            seen |= 1 << field
        c = buf[i]
        if field == -1:
            i = past_value(buf, i, end)
        elif c == 110:
            stop = past_value(buf, i, end)
            if not is_text(buf, i, stop, NULL):
                return fail
            i = stop
        elif field == 0 or field == 4:
            if c != 34:
                return fail
            stop, plain = past_string(buf, i, end)
            if stop < 0 or not plain:
                return fail
            if field == 0:
                s_start, s_stop = i + 1, stop - 1
            i = stop
        elif field == 1:
            i, int_ok, int_value = _int64(buf, i, end)
        elif field == 2:
            stop = past_value(buf, i, end)
            if is_text(buf, i, stop, TRUE):
                flag = 1
            elif is_text(buf, i, stop, FALSE):
                flag = 0
            else:
                return fail
            i = stop
        elif field == 3:
            if c == 34:
                stop, plain = past_string(buf, i, end)
                if not plain:
                    return fail
                i = stop
            elif c == 45 or 48 <= c <= 57:
                i = past_value(buf, i, end)
            else:
                return fail
        elif field == 5 and array:
            array_at = i
            i = past_value(buf, i, end)
        else:
            return fail
        i = next_item(buf, i)
    if i < 0:
        return fail
    return i + 1, s_start, s_stop, int_ok, int_value, flag, array_at


_STRING_WORDS, _INT_WORDS, _BOOL_WORDS, _ARRAY_WORDS = (
    words(text.encode(), 2) for text in (_COMPACT_STRING, _COMPACT_INT, _COMPACT_BOOL, _COMPACT_ARRAY)
)
_KEY_OPEN_WORD: Final = words(_KEY_OPEN.tobytes(), 1)[0][0]


# The three functions run per attribute are inlined (numba's own inliner): a call passes
# every array of `out` and `names` by value, which costs more than their work. Inlining
# more makes the compile much longer for no gain a scan can measure.
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
    if c == 115 and words_at(buf, f, _STRING_WORDS[0], _STRING_WORDS[1]):
        v = f + len(_COMPACT_STRING)
        if buf[v] != 34:
            return general
        stop, plain = past_string(buf, v, end)
        if not plain or buf[stop] != 125:
            return general
        return stop + 1, v + 1, stop - 1, False, 0, -1, -1
    if c == 105 and words_at(buf, f, _INT_WORDS[0], _INT_WORDS[1]):
        stop, ok, value = _int64(buf, f + len(_COMPACT_INT), end)
        if stop < 0 or buf[stop] != 125:
            return general
        return stop + 1, -1, -1, ok, value, -1, -1
    if c == 98 and words_at(buf, f, _BOOL_WORDS[0], _BOOL_WORDS[1]):
        v = f + len(_COMPACT_BOOL)
        if text_at(buf, v, TRUE) and buf[v + 4] == 125:
            return v + 5, -1, -1, False, 0, 1, -1
        if text_at(buf, v, FALSE) and buf[v + 5] == 125:
            return v + 6, -1, -1, False, 0, 0, -1
        return general
    if array and c == 97 and words_at(buf, f, _ARRAY_WORDS[0], _ARRAY_WORDS[1]):
        array_at = f + len(_COMPACT_ARRAY) - 1  # the ArrayValue object
        stop = past_value(buf, array_at, end)
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
    i = inside(buf, i, 123)
    while i >= 0 and buf[i] != 125:
        k_start, k_stop, i = member(buf, i, end)
        if i < 0:
            return FAIL, FAIL
        if not is_text(buf, k_start, k_stop, _VALUES):
            state[_LENIENT] = True
            i = next_item(buf, past_value(buf, i, end))
            continue
        if seen:
            return FAIL, FAIL
        seen = True
        n_items = start
        i = inside(buf, i, 91)
        while i >= 0 and buf[i] != 93:
            if n_items >= len(items):
                return FAIL, FAIL
            stop, _, _, ok, value, _, _ = _compact_value(buf, i, end, False)
            if stop == _GENERAL:
                state[_LENIENT] = True
                stop, _, _, ok, value, _, _ = _any_value(buf, i, end, False)
            i = stop
            items[n_items] = value
            items_ok[n_items] = ok
            n_items += 1
            i = next_item(buf, i)
        if i < 0:
            return FAIL, FAIL
        i = next_item(buf, i + 1)
    if i < 0:
        return FAIL, FAIL
    return i + 1, n_items


_TABLE: Final = 256  # slots of the attribute name hash table


@numba.njit(cache=True, nogil=True)
def _name_hash(buf: np.ndarray, start: int, stop: int, salt: int) -> int:  # pragma: no cover - compiled
    """A hash of a name's length and last 8 bytes (attribute names share their prefixes)."""
    h = np.uint64(stop - start) * np.uint64(salt)
    for k in range(max(start, stop - 8), stop):
        h = (h ^ np.uint64(buf[k])) * np.uint64(0x100000001B3)
    return np.int64((h >> np.uint64(29)) & np.uint64(_TABLE - 1))


def hash_table(keys: np.ndarray, columns: np.ndarray) -> np.ndarray:
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


def attribute_heads(names: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Per column, its attribute name and what follows it in the compact form, as `words` and
    their masks: what `_attribute` compares at once where the column it expects comes next."""
    heads = [name + _VALUE_OPEN.tobytes() for name in names]
    if max(map(len, heads)) > PAD:
        raise ValueError(f"attribute names of at most {PAD - len(_VALUE_OPEN)} bytes")
    packed = [words(head, PAD // 8) for head in heads]
    return np.stack([w for w, _ in packed]), np.stack([m for _, m in packed])


@numba.njit(cache=True, nogil=True)
def _column(buf: np.ndarray, start: int, stop: int, names: tuple) -> int:  # pragma: no cover - compiled
    """The column whose attribute name is buf[start:stop], or -1.

    `names` is (keys, columns, table, heads, head masks, follow): every column's attribute
    name concatenated, per column (name start, name stop, kind, slot), the table made by
    `hash_table`, the words and masks made by `attribute_heads`, and per attribute
    (its column + 1, 0 at an event's start) the column that followed it last.
    """
    keys, columns, table = names[0], names[1], names[2]
    c = table[_name_hash(buf, start, stop, table[_TABLE])]
    if c >= 0 and is_text(buf, start, stop, keys[columns[c, 0] : columns[c, 1]]):
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
            return FAIL
    items_end = -1
    if array_at >= 0:
        array_end, items_end = _int_items(buf, array_at, end, items, items_ok, state)
        if items_end < 0:
            return FAIL
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
    if load8(buf, i) == _KEY_OPEN_WORD:
        columns, heads, head_masks, follow = names[1], names[3], names[4], names[5]
        name = i + len(_KEY_OPEN)
        column = follow[after]
        at = -1  # the value object
        if column >= 0 and words_at(buf, name, heads[column], head_masks[column]):
            at = name + columns[column, 1] - columns[column, 0] + len(_VALUE_OPEN) - 2
        else:
            stop, plain = past_string(buf, name - 1, end)
            if plain and text_at(buf, stop - 1, _VALUE_OPEN):
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
    i = inside(buf, i, 123)
    while i >= 0 and buf[i] != 125:
        m_start, m_stop, i = member(buf, i, end)
        if i < 0:
            return FAIL
        if is_text(buf, m_start, m_stop, _KEY):
            if column != -2 or buf[i] != 34:
                return FAIL
            stop, plain = past_string(buf, i, end)
            if not plain:
                return FAIL
            column = _column(buf, i + 1, stop - 1, names)
            kind, slot = _kind_slot(names[1], column)
            i = stop
        elif is_text(buf, m_start, m_stop, _VALUE):
            if has_value or buf[i] != 123:
                return FAIL
            has_value = True
            if column == -2:
                v_start = i
                i = past_value(buf, i, end)
            else:
                i = _value(buf, i, end, kind, slot, row, out)
        else:
            i = past_value(buf, i, end)
        i = next_item(buf, i)
    if i < 0 or column == -2:
        return FAIL
    # A value given before its key is read now; none given makes the column absent.
    if (v_start >= 0 or not has_value) and _value(buf, v_start, end, kind, slot, row, out) < 0:
        return FAIL
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
    i = inside(buf, i, 123)
    while i >= 0 and buf[i] != 125:
        m_start, m_stop, i = member(buf, i, end)
        if i < 0:
            return FAIL, False, 0
        if is_text(buf, m_start, m_stop, _TIME):
            if seen & 1 or buf[i] == 110:  # repeated, or null (no int | str)
                return FAIL, False, 0
            seen |= 1
            i, _, time = _int64(buf, i, end)
        elif is_text(buf, m_start, m_stop, _NAME):
            if seen & 2 or buf[i] != 34:
                return FAIL, False, 0
            seen |= 2
            stop, plain = past_string(buf, i, end)
            if not plain:
                return FAIL, False, 0
            page = is_text(buf, i + 1, stop - 1, _PAGE_EVENT)
            i = stop
        elif is_text(buf, m_start, m_stop, _ATTRIBUTES):
            if seen & 4:
                return FAIL, False, 0
            seen |= 4
            i = inside(buf, i, 91)
            after = 0
            count = 0
            while i >= 0 and buf[i] != 93:
                count += 1
                if count > MAX_ATTRIBUTES:  # the general decoder names the line
                    return FAIL, False, 0
                i, after = _attribute(buf, i, end, names, row, out, after)
                i = next_item(buf, i)
            if i >= 0:
                i += 1
        elif is_text(buf, m_start, m_stop, _DROPPED):
            stop = past_value(buf, i, end)
            if not number(buf, i, stop)[0]:
                return FAIL, False, 0
            i = stop
        else:
            out[7][_LENIENT] = True
            i = past_value(buf, i, end)
        i = next_item(buf, i)
    if i < 0:
        return FAIL, False, 0
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
    i = inside(buf, past_space(buf, i), 123)
    while i >= 0:
        if in_array:
            if buf[i] == 93:
                if depth == 3:
                    if state[CUTS] >= len(cuts):
                        return FAIL, spans
                    cuts[state[CUTS], 1] = i
                    state[CUTS] += 1
                in_array = False
                i = next_item(buf, i + 1)
            elif depth == 3:
                if n >= len(rows):
                    return FAIL, spans
                i, page, time = _event(buf, i, end, names, n, out)
                if page and i >= 0:
                    rows[n, 0] = line
                    rows[n, 1] = spans - 1
                    rows[n, 2] = time
                    n += 1
                i = next_item(buf, i)
            else:
                i = inside(buf, i, 123)
                depth += 1
                found[depth] = False
                in_array = False
                spans += depth == 3
        elif buf[i] == 125:
            if depth == 0:
                return n, spans
            depth -= 1
            in_array = True
            i = next_item(buf, i + 1)
        else:
            m_start, m_stop, i = member(buf, i, end)
            if i >= 0 and is_text(buf, m_start, m_stop, path[depth]):
                if found[depth] or buf[i] != 91:
                    return FAIL, spans
                found[depth] = True
                in_array = True
                if depth == 3 and state[CUTS] < len(cuts):
                    cuts[state[CUTS], 0] = i
                i = past_space(buf, i + 1)
            elif i >= 0:
                i = next_item(buf, past_value(buf, i, end))
    return FAIL, spans


@numba.njit(cache=True, nogil=True)
def scan(
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
    buf = unmanaged(buf)
    names = (
        unmanaged(names[0]),
        unmanaged(names[1]),
        unmanaged(names[2]),
        unmanaged(names[3]),
        unmanaged(names[4]),
        unmanaged(names[5]),
    )
    rows = unmanaged(rows)
    cuts = unmanaged(cuts)
    out = (
        unmanaged(out[0]),
        unmanaged(out[1]),
        unmanaged(out[2]),
        unmanaged(out[3]),
        unmanaged(out[4]),
        unmanaged(out[5]),
        unmanaged(out[6]),
        unmanaged(out[7]),
    )
    state = out[7]
    n = 0
    for line in range(len(starts)):
        items_before, cuts_before = state[_ITEMS], state[CUTS]
        state[_LENIENT] = False
        after, spans = _line(buf, starts[line], ends[line], line, n, names, rows, out, cuts)
        if after < 0:
            state[_ITEMS], state[CUTS] = items_before, cuts_before
            spans = -1
        else:
            n = after
        lines[line, 0] = spans
        lines[line, 1] = not state[_LENIENT]
        lines[line, 2] = state[CUTS]
    return n
