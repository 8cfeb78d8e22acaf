"""Append-only line files with size-based rotation, owned by one process at a time.

Each line goes out in a single `write` on an `O_APPEND` descriptor, so a writer
killed mid-line leaves at most one truncated last line. A file is never shared by
two writers: lines of page descriptors are far longer than what one write keeps
atomic, so a second process that finds the file locked writes to a sibling named
after its pid instead (docs/design.md section 2).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path


class LineFile:
    """A rotating, exclusively locked file of complete lines.

    Args:
        path: where to write; `{pid}` in the name is replaced by the process id.
        max_bytes: rotate before a line would take the file past this size (0: never).
        fsync: fsync after every line (what the receiver does before acknowledging).

    Raises:
        OSError: the directory cannot be created or the file cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = 0, fsync: bool = False) -> None:
        self._requested = Path(str(path).replace("{pid}", str(os.getpid())))
        self._max_bytes = max_bytes
        self._fsync = fsync
        self._lock = threading.Lock()
        self._requested.parent.mkdir(parents=True, exist_ok=True)
        self.path, self._fd = _open_owned(self._requested)
        self._size = os.fstat(self._fd).st_size
        if self._size and not _ends_with_newline(self._fd, self._size):
            # A writer died mid-line: keep its fragment on a line of its own.
            self._size += os.write(self._fd, b"\n")

    def write(self, line: bytes) -> None:
        """Append one complete line (it must end with a newline)."""
        with self._lock:
            if self._max_bytes and self._size and self._size + len(line) > self._max_bytes:
                self._rotate()
            view = memoryview(line)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            self._size += len(line)
            if self._fsync:
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _rotate(self) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f".{time.time_ns() % 10**9:09d}"
        rotated = self.path.with_name(f"{self.path.stem}-{stamp}{self.path.suffix}")
        os.rename(self.path, rotated)
        os.close(self._fd)
        self._fd = _open_locked(self.path)
        self._size = 0


def _open_owned(path: Path) -> tuple[Path, int]:
    """Open `path` if no other process holds it, else a sibling named after our pid."""
    try:
        return path, _open_locked(path)
    except BlockingIOError:
        sibling = path.with_name(f"{path.stem}.{os.getpid()}{path.suffix}")
        return sibling, _open_locked(sibling)


def _open_locked(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def _ends_with_newline(fd: int, size: int) -> bool:
    return os.pread(fd, 1, size - 1) == b"\n"
