"""Buffers reused from one read to the next.

A fresh buffer of the reader's size (16 MiB) costs a page fault per page on first
touch, which can cost as much as reading the file into it.
Reads of consecutive byte ranges reuse a few buffers instead: the reader's byte
buffers, and the page scanner's arrays (see `page_scan`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sized
from contextlib import contextmanager
from typing import Generic, TypeVar

B = TypeVar("B", bound=Sized)


class BufferPool(Generic[B]):
    """At most `keep` idle buffers (the largest) of at most `max_bytes` each, shared by threads.

    Args:
        keep: idle buffers kept (one per reading thread is enough).
        max_bytes: larger buffers (a range with one huge line) are not kept.
        make: a new buffer of the given size (its `len`); a bytearray by default.
    """

    def __init__(self, keep: int, max_bytes: int, make: Callable[[int], B] = bytearray) -> None:  # type: ignore[assignment]
        self._keep = keep
        self._max_bytes = max_bytes
        self._make = make
        self._idle: list[B] = []
        self._lock = threading.Lock()

    @contextmanager
    def buffer(self, size: int) -> Iterator[B]:
        """A buffer of at least `size` bytes, of undefined content, for the `with` block.

        Nothing may keep a view of it past the block: the next reader gets it.
        """
        with self._lock:
            # The smallest that fits (the list is largest first); by index: `remove` would
            # compare buffers' contents.
            fits = [i for i, b in enumerate(self._idle) if len(b) >= size]
            found = self._idle.pop(fits[-1]) if fits else None
        # A quarter more: ranges end at a line end, so the next one is often a little longer.
        data = found if found is not None else self._make(size + size // 4)
        try:
            yield data
        finally:
            with self._lock:
                if len(data) <= self._max_bytes:
                    self._idle.append(data)
                    self._idle.sort(key=len, reverse=True)
                    del self._idle[self._keep :]  # the smallest go
