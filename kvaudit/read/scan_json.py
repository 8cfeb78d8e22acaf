"""The page scanner's JSON primitives: bytes read in place, a position at a time.

The compiled functions here know JSON and nothing of OTLP: each takes a buffer of
UTF-8 bytes and a position in it, and returns the position past what it read, or
FAIL where the bytes are not what it reads (`scan_otlp` then leaves the line to the
general decoder). They look ahead without bounds checks, so every buffer they read
holds PAD zero bytes after its last line. `compact` takes the insignificant white
space out of lines first, for the word-at-a-time comparisons of the compact form.

numba is told here where to keep the scanner's machine code: the scanner's other
modules import this one before they compile anything.
"""

from __future__ import annotations

from typing import Final

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from kvaudit.read import scanner_cache

# Before any function of the scanner is decorated: numba picks a function's cache directory then.
numba.config.CACHE_DIR = scanner_cache.numba_code_dir()

FAIL: Final = -1  # a position that says: this line needs the general decoder
PAD: Final = 64  # zero bytes after a scanned buffer, so a look past a line's end stays in memory


def text_bytes(text: str) -> np.ndarray:
    """`text` as the uint8 array the compiled functions compare bytes with."""
    return np.frombuffer(text.encode(), dtype=np.uint8).copy()


NULL, TRUE, FALSE = map(text_bytes, ("null", "true", "false"))


@intrinsic
def unmanaged(typingctx: object, array: types.Array) -> tuple:  # pragma: no cover - compiled
    """The same array without its reference count: the scanner passes a handful of arrays
    through millions of calls, and counting each pass would cost as much as the work
    it passes them to. Only for arrays that a caller up the stack keeps alive."""

    def codegen(context, builder, signature, args):  # numba's codegen protocol
        view = context.make_array(signature.args[0])(context, builder, value=args[0])
        view.meminfo = cgutils.get_null_value(view.meminfo.type)
        view.parent = cgutils.get_null_value(view.parent.type)
        return view._getvalue()

    return array(array), codegen


# --- JSON primitives ------------------------------------------------------------------
# Each takes the buffer, a position and the end of the line, and returns the position
# after what it read (or FAIL).


@numba.njit(cache=True, nogil=True)
def past_space(buf: np.ndarray, i: int) -> int:  # pragma: no cover - compiled
    """Past white space. Not past a newline: no line holds one, so it is the line's end."""
    while buf[i] == 32 or buf[i] == 13 or buf[i] == 9:
        i += 1
    return i


@intrinsic
def load8(typingctx: object, buf: types.Array, i: types.Integer) -> tuple:  # pragma: no cover - compiled
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


def words(text: bytes, count: int) -> tuple[np.ndarray, np.ndarray]:
    """`text` as `count` little-endian uint64 words, and the masks of the bytes it fills."""
    padded = text.ljust(8 * count, b"\0")
    filled = (b"\xff" * len(text)).ljust(8 * count, b"\0")
    return np.frombuffer(padded, dtype="<u8").copy(), np.frombuffer(filled, dtype="<u8").copy()


@numba.njit(cache=True, nogil=True)
def words_at(buf: np.ndarray, i: int, packed: np.ndarray, masks: np.ndarray) -> bool:  # pragma: no cover - compiled
    """Whether the text packed by words(text) starts at buf[i], compared a word at a time (it
    may look up to 8 * len(packed) bytes ahead: PAD covers that)."""
    differ = np.uint64(0)
    for k in range(len(packed)):
        if masks[k] == 0:
            break
        differ |= (load8(buf, i + 8 * k) ^ packed[k]) & masks[k]
    return differ == 0


@numba.njit(cache=True, nogil=True)
def past_string(buf: np.ndarray, i: int, end: int) -> tuple[int, bool]:  # pragma: no cover - compiled
    """Past the string whose quote is at buf[i]; and whether it is plain: ASCII without escapes
    or control characters (JSON allows none raw; a plain string is valid JSON)."""
    i += 1
    while i + 8 <= end and _plain_word(load8(buf, i)):
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
    return FAIL, False


@numba.njit(cache=True, nogil=True)
def past_value(buf: np.ndarray, i: int, end: int) -> int:  # pragma: no cover - compiled
    """Past any JSON value."""
    c = buf[i]
    if c == 34:
        return past_string(buf, i, end)[0]
    if c == 123 or c == 91:
        depth = 0
        while i < end:
            c = buf[i]
            if c == 34:
                i = past_string(buf, i, end)[0]
                if i < 0:
                    return FAIL
                continue
            if c == 123 or c == 91:
                depth += 1
            elif c == 125 or c == 93:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return FAIL
    while i < end:
        c = buf[i]
        if c == 44 or c == 125 or c == 93 or c == 32 or c == 10 or c == 13 or c == 9:
            return i
        i += 1
    return i


@numba.njit(cache=True, nogil=True)
def is_text(buf: np.ndarray, start: int, stop: int, text: np.ndarray) -> bool:  # pragma: no cover - compiled
    return stop - start == len(text) and text_at(buf, start, text)


@numba.njit(cache=True, nogil=True)
def text_at(buf: np.ndarray, i: int, text: np.ndarray) -> bool:  # pragma: no cover - compiled
    """Whether `text` starts at buf[i] (the padding keeps a look past the end in memory)."""
    for k in range(len(text)):  # noqa: SIM110 - numba compiles loops, not generators
        if buf[i + k] != text[k]:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def member(buf: np.ndarray, i: int, end: int) -> tuple[int, int, int]:  # pragma: no cover - compiled
    """An object member's key at buf[i]: (key start, key stop, position of its value)."""
    if buf[i] != 34:
        return 0, 0, FAIL
    stop, plain = past_string(buf, i, end)
    if stop < 0 or not plain:
        return 0, 0, FAIL
    colon = past_space(buf, stop)
    if buf[colon] != 58:
        return 0, 0, FAIL
    return i + 1, stop - 1, past_space(buf, colon + 1)


@numba.njit(cache=True, nogil=True)
def next_item(buf: np.ndarray, i: int) -> int:  # pragma: no cover - compiled
    """Past a member or item just read and its comma: at the next one or the closing bracket.
    What JSON does not allow there (no comma, or a comma before a closing bracket) fails."""
    if i < 0:
        return FAIL
    i = past_space(buf, i)
    c = buf[i]
    if c == 44:
        i = past_space(buf, i + 1)
        c = buf[i]
        return FAIL if c == 93 or c == 125 else i
    return i if c == 93 or c == 125 else FAIL


@numba.njit(cache=True, nogil=True)
def inside(buf: np.ndarray, i: int, bracket: int) -> int:  # pragma: no cover - compiled
    """Inside the object or array (`bracket`) that must start at buf[i]."""
    if i < 0 or buf[i] != bracket:
        return FAIL
    return past_space(buf, i + 1)


_INT64_MAX: Final = np.uint64(2**63 - 1)


@numba.njit(cache=True, nogil=True)
def integer(buf: np.ndarray, start: int, stop: int) -> tuple[bool, int]:  # pragma: no cover - compiled
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
def number(buf: np.ndarray, start: int, stop: int) -> tuple[bool, int]:  # pragma: no cover - compiled
    """`integer` for a JSON number, which allows no leading zero."""
    first = start + (buf[start] == 45)
    if buf[first] == 48 and stop - first > 1:
        return False, 0
    return integer(buf, start, stop)


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
                i = past_string(buf, i, end)[0]
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
                stop = past_string(buf, i, end)[0]
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
    document is mostly indentation: what is read after is only what is left."""
    compacted = np.array(ends, dtype=np.int64)
    _compact_lines(buf, starts, compacted)
    return compacted
