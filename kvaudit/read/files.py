"""Which bytes of which trace files a read decodes: paths expanded, files followed, ranges planned."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

CHUNK_BYTES: Final = 16 * 1024 * 1024


@dataclass
class Cursor:
    """How far a file has been read: byte offset and the number of the next line."""

    offset: int = 0
    next_line: int = 1
    identity: tuple[int, int] | None = None  # (device, inode): a replaced file starts over


def expand_paths(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Files named by paths, directories (their `*.json*` files, recursively) and globs.

    Raises:
        FileNotFoundError: a path matches nothing.
    """
    files: list[str] = []
    for spec in paths:
        path = Path(spec)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.json*") if p.is_file())
        elif any(ch in str(spec) for ch in "*?["):
            anchor = Path(path.anchor or ".")
            pattern = str(path.relative_to(anchor)) if path.is_absolute() else str(spec)
            found = sorted(p for p in anchor.glob(pattern) if p.is_file())
        elif path.is_file():
            found = [path]
        else:
            raise FileNotFoundError(f"{spec}: no such file or directory")
        files.extend(str(p) for p in found)
    return list(dict.fromkeys(files))


def plan_ranges(files: Sequence[str], cursors: dict[str, Cursor]) -> Iterator[tuple[str, int, int]]:
    """Byte ranges to decode, each ending at a line end, in file order."""
    for path in files:
        stat = os.stat(path)
        cursor = cursors.setdefault(path, Cursor())
        identity = (stat.st_dev, stat.st_ino)
        if cursor.identity != identity or stat.st_size < cursor.offset:
            cursor.offset, cursor.next_line, cursor.identity = 0, 1, identity
        start = cursor.offset
        with open(path, "rb") as f:
            while start < stat.st_size:
                end = min(start + CHUNK_BYTES, stat.st_size)
                if end < stat.st_size:
                    f.seek(end)
                    end += len(f.readline())
                yield path, start, end
                start = end
