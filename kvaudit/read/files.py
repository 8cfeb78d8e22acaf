"""Which bytes of which trace files a read decodes: paths expanded, files followed, pieces planned.

A file is followed by its identity (device and inode), never by its name: a file renamed
the way writers rotate them (the Collector's `traces.json` -> `traces-<time>.json`,
kvaudit's own `r1.jsonl` -> `r1-<time>.jsonl`) is the same file under another name, read
on from where it was, so nothing is counted twice. Its first bytes (its fingerprint) are
kept too: a new file given the inode of a removed one starts with other bytes, and is
read from its start (docs/design.md section 3.1).

A read is planned as tasks of pieces: a piece is a byte range of one file's text that
ends at the end of a line (or of a pretty-printed document). Large files are split into
chunks that threads decode in parallel; the rest of a small file is read whole, and
several are decoded together in one task, so many small files cost about what the same
bytes in one file cost. Compressed files are decompressed as they are planned, in
chunks of their text. What cannot be read (a file that cannot be opened, is not OTLP
JSON, or a line longer than MAX_LINE_BYTES) is a piece with the error to report.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Final

from kvaudit.otlp.limits import MAX_LINE_BYTES
from kvaudit.read import sources

CHUNK_BYTES: Final = 16 * 1024 * 1024
# The rest of a file this small is read whole, by the planner, and decoded beside others.
SMALL_BYTES: Final = 1024 * 1024
BATCH_BYTES: Final = 4 * 1024 * 1024  # the bytes of small files decoded in one task
FINGERPRINT_BYTES: Final = sources.SNIFF_BYTES
# OTLP JSON compresses 10-30 times: the least of that is taken as a compressed file's text.
COMPRESSION_RATIO: Final = 10
_SEARCH_BYTES: Final = 1024 * 1024  # read at a time when looking for the end of a line
# What a directory holds that is read: OTLP JSON (`*.json`, `*.jsonl`, ...) and compressed files.
_TRACE_NAME: Final = re.compile(r".*\.json.*|.*\.(gz|zst|zstd)")

Identity = tuple[int, int]  # (device, inode)
_RETIRED: Final = 64  # truncated files remembered, for their copies
# The least text a file's first bytes and another's fingerprint must share to be the same
# text (a trace line is longer; two files share whole lines only if one copies the other).
_MIN_MATCH: Final = 64


@dataclass
class Cursor:
    """How far one file (one identity) has been read."""

    path: str  # the name it was last seen under
    offset: int = 0  # bytes of its text consumed (of the decompressed text, when compressed)
    next_line: int = 1
    fingerprint: bytes = b""  # its first bytes (up to FINGERPRINT_BYTES) when last read
    compression: str | None = None  # None until its first bytes are read; "" when not compressed
    document: bool = False  # pretty-printed documents, not lines
    size: int = 0  # its size and change time when it was last read to its end
    ctime_ns: int = 0
    whole: bool = False  # that read consumed all of its text (no unterminated last line was left)
    not_json: str | None = None  # why its text is not read (reported once; read again only if replaced)


@dataclass
class Cursors:
    """The cursors of the files a store follows, and errors of names that are no file."""

    files: dict[Identity, Cursor] = field(default_factory=dict)
    # Cursors of files truncated or rewritten in place (the last few): a copy of what they held
    # (logrotate's copytruncate, then maybe compressed) is read only past where they were read to.
    retired: list[Cursor] = field(default_factory=list)
    # Names that could not be opened or read: the error last reported (reported again when it changes).
    failed: dict[str, str] = field(default_factory=dict)

    def retire(self, cursor: Cursor) -> None:
        """Keep what a file had been read to when it is truncated or replaced: its copy may turn up."""
        self.retired.append(cursor)
        del self.retired[:-_RETIRED]

    def read_before(self, text: bytes, path: str, identity: Identity, size: int | None) -> Cursor | None:
        """The cursor of another file whose text starts as `text` does, read furthest (within
        `size` bytes of text, when known): the file at `path` is a copy of what it read.

        Only a file that may have been copied is looked at: one truncated or rewritten
        (retired), one gone from its name, or one whose name `path` extends (logrotate's
        `NAME.1`, `NAME-20261207`, `NAME.1.gz`). Two files that merely hold the same lines
        are read as two.
        """
        found = None
        for cursor in self.retired + [c for key, c in self.files.items() if key != identity]:
            if cursor.compression or not cursor.offset or (size is not None and cursor.offset > size):
                continue  # a compressed file's fingerprint is of its compressed bytes, not its text
            common = min(len(text), len(cursor.fingerprint))
            if common < _MIN_MATCH or text[:common] != cursor.fingerprint[:common]:
                continue
            copied = cursor in self.retired or _gone(cursor) or _rotated_name(path, cursor.path)
            if copied and (found is None or cursor.offset > found.offset):
                found = cursor
        return found

    def report(self, path: str, reason: str) -> bool:
        """Whether an I/O error of `path` is to be reported (not the one reported last)."""
        if self.failed.get(path) == reason:
            return False
        self.failed[path] = reason
        return True


@dataclass
class Piece:
    """Bytes [start, end) of one file's text, ending at the end of a line or document.

    `base_line` is the number of the line before the piece's first, when the planner
    knows it (the file's first piece of this read); otherwise the reader numbers the
    piece once the pieces before it are counted. `text` holds the bytes when the planner
    read them (small and compressed files); otherwise the reader reads them from the file.
    A piece with `error` is not read: a file error (line 0), or a line too long to read
    (spanning `lines` lines).
    """

    path: str
    identity: Identity | None
    start: int
    end: int
    base_line: int | None
    text: bytes | None = None
    document: bool = False
    error: str | None = None
    lines: int = 0
    cost: int = 0  # bytes of the file this piece accounts for (progress)
    seen: tuple[int, int, bool] | None = None  # the last piece of its file: (size, ctime_ns, to its end)


def expand_paths(paths: Iterable[str | os.PathLike[str]], *, missing_ok: bool = False) -> list[str]:
    """Files named by paths, directories (their OTLP JSON and compressed files, recursively) and globs.

    A file named explicitly is read whatever its name; a directory's files are those named
    `*.json*`, `*.gz`, `*.zst` or `*.zstd` (what is so named and no file is listed too: its
    read reports it).

    Raises:
        FileNotFoundError: a path matches nothing (unless `missing_ok`).
        OSError: a path names a FIFO, a device or a socket (unless `missing_ok`).
    """
    files: list[str] = []
    for spec in paths:
        path = Path(spec)
        if path.is_dir():
            # Whatever has a trace file's name is listed, files or not: a FIFO, a device, a dangling
            # link or a directory so named is a read error of its own (never opened), not skipped silently.
            found = sorted(p for p in path.rglob("*") if _TRACE_NAME.fullmatch(p.name))
        elif any(ch in str(spec) for ch in "*?["):
            anchor = Path(path.anchor or ".")
            pattern = str(path.relative_to(anchor)) if path.is_absolute() else str(spec)
            found = sorted(p for p in anchor.glob(pattern) if p.is_file())
        elif path.exists() or path.is_symlink():
            if not missing_ok:
                _refuse_special(path)
            found = [path]  # a dangling link: named when it is read
        elif missing_ok:
            found = []
        else:
            raise FileNotFoundError(f"{spec}: no such file or directory")
        files.extend(str(p) for p in found)
    return list(dict.fromkeys(files))


_KINDS: Final = {
    stat.S_ISFIFO: "a FIFO",
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISSOCK: "a socket",
}


def _not_a_file(mode: int) -> str:
    """What a path that is no regular file is, as a read error names it."""
    if stat.S_ISDIR(mode):
        return "a directory, not a trace file"
    kind = next((kind for test, kind in _KINDS.items() if test(mode)), "not a regular file")
    return f"{kind}, not a trace file (not opened)"


def _refuse_special(path: Path) -> None:
    """Refuse a FIFO, device or socket named on the command line before it is opened (a FIFO would hang the read).

    Raises:
        OSError: it is one (the caller's `user_files` makes it bad input).
    """
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # a dangling link: named when it is read
    if any(test(mode) for test in _KINDS):
        raise OSError(errno.EINVAL, _not_a_file(mode), str(path))


def pending_bytes(files: Sequence[str], cursors: Cursors, *, text: bool = False) -> int:
    """About how many bytes of `files` a read would still decode: bytes on disk (for
    progress bars), or with `text` bytes of text, a compressed file's taken to be
    COMPRESSION_RATIO times its size (to tell how large a read is, see `reader`)."""
    total = 0
    for path in files:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue  # named when it is read, never opened
        cursor = cursors.files.get((st.st_dev, st.st_ino))
        if cursor is not None and cursor.not_json and not _changed(cursor, st):
            continue  # named once, and not read
        if cursor is None or cursor.compression:
            size = st.st_size if cursor is None or _changed(cursor, st) else 0
            compressed = cursor.compression if cursor is not None else text and _compression_of(path)
            total += size * COMPRESSION_RATIO if text and compressed else size
        else:
            total += max(st.st_size - cursor.offset, 0)
    return total


def _compression_of(path: str) -> str:
    try:
        with open(path, "rb", buffering=0) as f:
            return sources.compression_of(f.read(8))
    except OSError:
        return ""  # named when it is read


def _gone(cursor: Cursor) -> bool:
    """Whether the file a cursor follows is gone from its last name, or holds less there than was read."""
    try:
        return os.stat(cursor.path).st_size < cursor.offset  # truncated there, or replaced by a shorter file
    except OSError:
        return True


def _rotated_name(path: str, original: str) -> bool:
    """Whether `path` is a name logrotate gives a copy of `original` (`NAME.1`, `NAME-DATE`, `NAME.1.gz`)."""
    head, name = os.path.split(path)
    original_head, original_name = os.path.split(original)
    return (
        head == original_head
        and name[len(original_name) : len(original_name) + 1] in (".", "-", "_")
        and (name.startswith(original_name))
    )


def _text_head(f: BinaryIO, compression: str) -> bytes:
    """The first FINGERPRINT_BYTES of a compressed file's text (what its fingerprint is of, uncompressed)."""
    text = b""
    f.seek(0)
    try:
        for block in sources.decompress(f, compression):
            text += block
            if len(text) >= FINGERPRINT_BYTES:
                break
    except sources.CompressedDataError:
        pass  # what it held before the damage: named when it is read
    f.seek(0)
    return text[:FINGERPRINT_BYTES]


def _changed(cursor: Cursor, st: os.stat_result) -> bool:
    return (cursor.size, cursor.ctime_ns) != (st.st_size, st.st_ctime_ns)


def plan(files: Sequence[str], cursors: Cursors, *, final: bool) -> Iterator[list[Piece]]:
    """The tasks that read what is new in `files`, in file order (a task: its pieces).

    Cursors of files no longer among `files` (removed, or renamed out of what the paths
    match) are dropped: their rows stay where they are.
    """
    seen: set[Identity] = set()
    batch: list[Piece] = []
    batched = 0
    for path in files:
        for piece in _file_pieces(path, cursors, seen, final):
            if piece.text is not None and piece.base_line is not None and len(piece.text) <= SMALL_BYTES:
                batch.append(piece)
                batched += len(piece.text)
                if batched >= BATCH_BYTES:
                    yield batch
                    batch, batched = [], 0
                continue
            if batch:  # keep file order
                yield batch
                batch, batched = [], 0
            yield [piece]
    if batch:
        yield batch
    cursors.files = {identity: cursor for identity, cursor in cursors.files.items() if identity in seen}


def _file_pieces(path: str, cursors: Cursors, seen: set[Identity], final: bool) -> Iterator[Piece]:
    """The pieces of one file's new text, or of the error that keeps it from being read."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, _not_a_file(st.st_mode))
    except OSError as exc:
        if exc.errno == errno.ENOENT and os.path.islink(path):
            exc = OSError(errno.ENOENT, "a dangling symbolic link")
        if exc.errno == errno.ENOENT and any(c.path == path for c in cursors.files.values()):
            return  # renamed or removed since it was read: a rotation, read on under its new name
        if cursors.report(path, unreadable(exc)):
            yield Piece(path, None, 0, 0, 0, error=unreadable(exc))
        return
    identity = (st.st_dev, st.st_ino)
    if identity in seen:
        return  # the same file under a second name
    seen.add(identity)
    cursor = cursors.files.get(identity)
    if cursor is not None:
        cursor.path = path
        if not _changed(cursor, st) and (cursor.whole or not final):
            return
    try:
        with open(path, "rb", buffering=0) as f:
            head = f.read(FINGERPRINT_BYTES)
            cursors.failed.pop(path, None)
            fresh = cursor is None or st.st_size < cursor.size or not head.startswith(cursor.fingerprint[: len(head)])
            if cursor is None or fresh:
                if cursor is not None and cursor.offset:
                    cursors.retire(cursor)  # truncated (copytruncate) or rewritten: a copy may turn up
                cursor = cursors.files[identity] = Cursor(path)  # new, truncated, or another file on this inode
            if len(head) > len(cursor.fingerprint):
                cursor.fingerprint = head
            stamp = (st.st_size, st.st_ctime_ns)
            if cursor.compression is None:
                cursor.compression = sources.compression_of(head)
                if not cursor.compression:
                    cursor.document = sources.is_document(head)
                    cursor.not_json = sources.not_json(head)
                    if cursor.not_json:
                        yield Piece(path, identity, 0, 0, 0, error=cursor.not_json, seen=(*stamp, True))
            if cursor.not_json:
                return
            if fresh:
                text = _text_head(f, cursor.compression) if cursor.compression else head
                known = cursors.read_before(text, path, identity, None if cursor.compression else st.st_size)
                if known is not None:  # a copy of text read before (logrotate's copy, maybe compressed)
                    cursor.offset, cursor.next_line, cursor.document = known.offset, known.next_line, known.document
            if cursor.compression:
                yield from _compressed_pieces(f, path, identity, cursor, stamp, final)
            else:
                yield from _text_pieces(f, path, identity, cursor, stamp, final)
    except OSError as exc:
        if cursors.report(path, unreadable(exc)):
            yield Piece(path, identity, 0, 0, 0, error=unreadable(exc))


def unreadable(exc: OSError) -> str:
    """The reason a file could not be read, as a read error names it."""
    return f"cannot read the file: {exc.strerror or exc}"


def _text_pieces(
    f: BinaryIO, path: str, identity: Identity, cursor: Cursor, stamp: tuple[int, int], final: bool
) -> Iterator[Piece]:
    """Pieces of a plain file from its cursor on: chunks ending at a line (or document) end."""
    size, start = stamp[0], cursor.offset
    base: int | None = cursor.next_line - 1
    if start >= size:
        cursor.size, cursor.ctime_ns = stamp
        return
    if size - start <= SMALL_BYTES:
        f.seek(start)
        text = f.read(size - start)
        yield Piece(
            path, identity, start, start + len(text), base, text, cursor.document, cost=len(text), seen=(*stamp, True)
        )
        return
    while start < size:
        end = min(start + CHUNK_BYTES, size)
        last = end == size
        if not last:
            found = _unit_end(f, end, cursor.document, MAX_LINE_BYTES)
            if found is not None:
                end, last = found, found == size
            else:  # the line (or document) across `end` is longer than the limit
                begin = _unit_start(f, start, end, cursor.document)
                if begin > start:
                    yield Piece(path, identity, start, begin, base, document=cursor.document, cost=begin - start)
                    base = None
                after, lines = _skip_unit(f, begin, cursor.document)
                if after is None and not final:
                    return  # its end is not written yet
                stop = size if after is None else after
                yield Piece(
                    path, identity, begin, stop, base, error=too_long(stop - begin, cursor.document), lines=lines,
                    cost=stop - begin, seen=(*stamp, True) if stop == size else None,
                )  # fmt: skip
                start, base = stop, None
                continue
        yield Piece(path, identity, start, end, base, document=cursor.document, cost=end - start,
                    seen=(*stamp, True) if last else None)  # fmt: skip
        start, base = end, None


def too_long(size: int, document: bool) -> str:
    what = "document" if document else "line"
    return f"{what} of {size} bytes is longer than the {MAX_LINE_BYTES}-byte limit (KVAUDIT_MAX_LINE_BYTES): not read"


def _ends(block: bytes, document: bool) -> Iterator[int]:
    """Offsets just past each line (or document) end in `block`, the newline included."""
    if document:
        for match in sources.DOCUMENT_END.finditer(block):
            yield match.end() + 1
    else:
        at = block.find(b"\n")
        while at >= 0:
            yield at + 1
            at = block.find(b"\n", at + 1)


def _unit_end(f: BinaryIO, at: int, document: bool, limit: int) -> int | None:
    """Where the line (or document) running across offset `at` ends, looking at most `limit`
    bytes ahead; None if not found there. The end of the file ends it too."""
    keep = 64 if document else 0  # a document's closing line may straddle two blocks
    f.seek(max(at - keep, 0))
    base = f.tell()
    carried = b""
    while base + len(carried) < at + limit:
        block = f.read(_SEARCH_BYTES)
        if not block:
            return base + len(carried)
        data = carried + block
        for end in _ends(data, document):
            if base + end > at:
                return base + end
        base, carried = base + len(data) - min(keep, len(data)), data[len(data) - min(keep, len(data)) :]
    return None


def _unit_start(f: BinaryIO, start: int, at: int, document: bool) -> int:
    """Where the line (or document) running across offset `at` starts, no earlier than `start`."""
    stop = at
    while stop > start:
        first = max(start, stop - _SEARCH_BYTES)
        f.seek(first)
        block = f.read(stop - first + (64 if document else 0))
        ends = [first + end for end in _ends(block, document) if first + end <= at]
        if ends:
            return ends[-1]
        stop = first
    return start


def _skip_unit(f: BinaryIO, begin: int, document: bool) -> tuple[int | None, int]:
    """Past the line (or document) starting at `begin`, unread: (its end or None at the end
    of the file, the lines it spans)."""
    f.seek(begin)
    lines, carried = 0, b""
    base = begin
    while block := f.read(_SEARCH_BYTES):
        data = carried + block
        end = next(_ends(data, document), None)
        if end is not None:
            return base + end, lines + data.count(b"\n", 0, end)
        keep = 64 if document else 0
        lines += data.count(b"\n", 0, len(data) - keep)
        base, carried = base + len(data) - keep, data[len(data) - keep :]
    return None, lines + carried.count(b"\n") + 1


def _compressed_pieces(
    f: BinaryIO, path: str, identity: Identity, cursor: Cursor, stamp: tuple[int, int], final: bool
) -> Iterator[Piece]:
    """Pieces of a compressed file's text past its cursor: decompressed from the start (a
    compressed stream cannot be entered midway), chunks ending at a line (or document) end."""
    f.seek(0)
    skip, start, base = cursor.offset, cursor.offset, cursor.next_line - 1
    pending = bytearray()
    accounted = 0  # compressed bytes the pieces so far account for
    skipping: Piece | None = None  # a line too long to read, being passed over

    def take(size: int, complete: bool | None) -> Piece:
        nonlocal start, base, accounted
        text = bytes(pending[:size])
        del pending[:size]
        made = Piece(path, identity, start, start + size, base, text, cursor.document, cost=f.tell() - accounted,
                     seen=None if complete is None else (*stamp, complete))  # fmt: skip
        start, base, accounted = start + size, None, f.tell()
        return made

    try:
        for block in sources.decompress(f, cursor.compression or ""):
            if skip:
                block, skip = block[skip:], max(skip - len(block), 0)
                if not block:
                    continue
            if start == 0 and not pending and skipping is None:
                cursor.document = sources.is_document(block)
                cursor.not_json = sources.not_json(block[: sources.SNIFF_BYTES])
                if cursor.not_json:
                    yield Piece(path, identity, 0, 0, 0, error=cursor.not_json, seen=(*stamp, True))
                    return
            if skipping is not None:
                end = next(_ends(block, cursor.document), None)
                skipping.lines += block.count(b"\n", 0, len(block) if end is None else end)
                skipping.end += len(block) if end is None else end
                if end is None:
                    continue
                start, skipping.error = skipping.end, too_long(skipping.end - skipping.start, cursor.document)
                yield skipping
                skipping, block = None, block[end:]
            pending += block
            if len(pending) < CHUNK_BYTES:
                continue
            cut = _last_end(pending, cursor.document)
            if cut:
                yield take(cut, None)
            elif len(pending) > MAX_LINE_BYTES:
                skipping = Piece(path, identity, start, start + len(pending), base, lines=pending.count(b"\n"),
                                 error=too_long(MAX_LINE_BYTES, cursor.document))  # fmt: skip
                base = None
                pending.clear()
    except sources.CompressedDataError as exc:
        if not final:  # a writer may still be writing it: read on when it grows
            yield take(_last_end(pending, cursor.document), False)
            return
        yield take(len(pending), None)
        yield Piece(path, identity, start, start, None, error=f"{cursor.compression}: {exc}", seen=(*stamp, True))
        return
    if skipping is not None:
        if final:
            skipping.lines += 1
            skipping.seen, skipping.error = (*stamp, True), too_long(skipping.end - skipping.start, cursor.document)
            yield skipping
        return
    cut = len(pending) if final else _last_end(pending, cursor.document)
    yield take(cut, cut == len(pending))


def _last_end(data: bytearray, document: bool) -> int:
    """Just past the last line (or document) end in `data` (0: none)."""
    if document:
        return max((match.end() + 1 for match in sources.DOCUMENT_END.finditer(data)), default=0)
    return data.rfind(b"\n") + 1
