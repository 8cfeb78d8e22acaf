"""Append-only line files with size-based rotation, owned by one process at a time.

Each line goes out in a single `write` on an `O_APPEND` descriptor, so a writer
killed mid-line leaves at most one truncated last line. A file is never shared by
two writers: lines of page descriptors are far longer than what one write keeps
atomic, so a second process that finds the file locked writes to a sibling named
after its pid instead (docs/design.md section 2).

A write is whole or absent: a failed or short write (a full disk, a file-size limit,
an I/O error from fsync) is cut back to the end of the last whole line before the
error is raised, so the next line never lands on a fragment. A file deleted or
replaced under the writer is noticed before the next write and reopened; what had
been written into a deleted file is counted as lost.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# Errors that mean "no room now" (ENOSPC, EDQUOT; EFBIG under a file-size limit): the
# receiver answers them as retryable, the space may come back.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


@dataclass
class LineFileStats:
    lost_items: int = 0  # items (spans) written into files deleted afterwards
    lost_files: int = 0
    cut_backs: int = 0  # failed writes cut back to the last whole line


class LineFile:
    """A rotating, exclusively locked file of complete lines.

    Construction never raises: a file that cannot be opened now is opened by the next
    write, which raises the `OSError` then.

    Args:
        path: where to write; `{pid}` in the name is replaced by the process id.
        max_bytes: rotate before a line would take the file past this size (0: never).
        fsync: fsync after every line (what the receiver does before acknowledging).
    """

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = 0, fsync: bool = False) -> None:
        self._requested = Path(str(path).replace("{pid}", str(os.getpid())))
        self.path = self._requested
        self._max_bytes = max_bytes
        self._fsync = fsync
        self.lock = threading.Lock()
        self.stats = LineFileStats()
        self._fd = -1
        self._identity = (0, 0)
        self._items = 0  # items in the open file since it was opened or rotated
        self._whole = 0  # where the last whole line ends (what a failed write is cut back to)
        self._cut_pending = False  # a cut back failed: retry it before anything is appended
        with self.lock:
            try:
                self._open()
            except OSError as exc:
                logger.debug("%s: not opened yet (%s)", self._requested, exc)

    @property
    def is_open(self) -> bool:
        return self._fd >= 0

    def write(self, line: bytes, *, items: int = 1) -> None:
        """Append one complete line (it must end with a newline), whole or not at all.

        Raises:
            OSError: the line could not be written; nothing of it is in the file.
        """
        with self.lock:
            self.append_locked(line, items)
            if self._fsync:
                try:
                    self.sync_locked()
                except OSError:
                    self.undo_locked(self._whole - len(line), items)
                    raise

    def append_locked(self, line: bytes, items: int) -> None:
        """`write` without the lock or fsync, for writing several files as one (`write_together`)."""
        self._ready()
        if self._max_bytes and self._whole and self._whole + len(line) > self._max_bytes:
            self._rotate()
        start = self._whole
        try:
            view = memoryview(line)
            while view:
                written = os.write(self._fd, view)
                if not written:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[written:]
        except OSError:
            self._cut_back(start)
            raise
        self._whole = start + len(line)
        self._items += items

    def sync_locked(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)

    def undo_locked(self, size: int, items: int) -> None:
        """Cut the file back to `size` (the end of a line already written), forgetting `items`."""
        self._cut_back(size)
        self._items -= items

    @property
    def size_locked(self) -> int:
        return self._whole

    def release(self) -> None:
        """Close the descriptor; the next write opens the file again (the receiver's LRU of open files)."""
        with self.lock:
            if self._fd >= 0:
                self._check_identity()
            self._close_fd()

    close = release

    def _ready(self) -> None:
        """Open the file if needed, and make sure it is still the one at `path`, whole."""
        if self._fd >= 0:
            self._check_identity()
        if self._fd < 0:
            self._open()
        if self._cut_pending:
            self._cut_back(self._whole)
            if self._cut_pending:  # the fragment is still there: appending now would merge onto it
                raise OSError(errno.EIO, f"{self.path}: a failed write could not be cut back yet")

    def _open(self) -> None:
        self._requested.parent.mkdir(parents=True, exist_ok=True)
        self.path, self._fd = _open_owned(self._requested)
        st = os.fstat(self._fd)
        self._identity = (st.st_dev, st.st_ino)
        self._whole = st.st_size
        self._items = 0
        self._cut_pending = False
        if self._whole and not _ends_with_newline(self._fd, self._whole):
            # A writer died mid-line: keep its fragment on a line of its own.
            try:
                self._whole += os.write(self._fd, b"\n")
            except OSError:
                self._close_fd()
                raise

    def _check_identity(self) -> None:
        """Close the descriptor when the path no longer names our file; count what a deletion lost."""
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._identity:
                return
        except FileNotFoundError:
            pass
        if os.fstat(self._fd).st_nlink == 0:
            self.stats.lost_items += self._items
            self.stats.lost_files += 1
            logger.warning("%s was deleted under its writer: %d items written into it are lost", self.path, self._items)
        # else: renamed away (rotated by someone else) and still on disk: nothing lost.
        self._close_fd()

    def _cut_back(self, size: int) -> None:
        """Truncate the file to `size`, the end of its last whole line (also what the next write starts from)."""
        self.stats.cut_backs += 1
        self._whole = size
        try:
            os.ftruncate(self._fd, size)
            self._cut_pending = False
        except OSError as exc:
            # Append nothing until the fragment is gone: the next write retries the cut first.
            self._cut_pending = True
            logger.warning("%s: could not cut a failed write back (%s); retrying before the next write", self.path, exc)

    def _rotate(self) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f".{time.time_ns() % 10**9:09d}"
        rotated = self.path.with_name(f"{self.path.stem}-{stamp}{self.path.suffix}")
        os.rename(self.path, rotated)
        self._close_fd()
        self._open()

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def write_together(writes: Sequence[tuple[LineFile, bytes, int]], *, fsync: bool) -> None:
    """Append one line to each of several files, all or none (one receiver request, several replicas).

    The files are locked in path order (no two requests deadlock), and a failure in
    any of them cuts every file of the request back to where it was.

    Raises:
        OSError: nothing of the request is in any file.
    """
    ordered = sorted(writes, key=lambda write: str(write[0].path))
    locked: list[LineFile] = []
    done: list[tuple[LineFile, int, int]] = []
    try:
        for line_file, _, _ in ordered:
            line_file.lock.acquire()
            locked.append(line_file)
        try:
            for line_file, line, items in ordered:
                line_file.append_locked(line, items)
                done.append((line_file, line_file.size_locked - len(line), items))
            if fsync:
                for line_file, _, _ in done:
                    line_file.sync_locked()
        except OSError:
            for line_file, size, items in done:
                line_file.undo_locked(size, items)
            raise
    finally:
        for line_file in locked:
            line_file.lock.release()


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
