"""Ctrl-C while DuckDB runs a query: the query is interrupted, and the command ends as on any Ctrl-C.

DuckDB's Python client looks for a pending SIGINT only at some points of a query (before
it runs, between result chunks), so a long aggregation would run to its end with Ctrl-C
pressed; Python's own handler cannot run either while the main thread waits in DuckDB.
So the signal is also written to a pipe (`signal.set_wakeup_fd`: Python's C-level handler
does that at once, whatever the main thread is doing), and a watcher thread reading it
interrupts the query the main thread runs (`interrupt()` is safe from any thread). Where
something else already owns the wakeup fd (an asyncio loop: the TUI), this is left to it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb


class _Watcher:
    """Reads the signals Python writes to the wakeup pipe; on SIGINT, interrupts the running query."""

    def __init__(self, read_fd: int) -> None:
        self._read_fd = read_fd
        self.lock = threading.Lock()
        self.running: duckdb.DuckDBPyConnection | None = None
        self.pressed = False
        threading.Thread(target=self._watch, name="kvaudit-ctrl-c", daemon=True).start()

    def _watch(self) -> None:
        while data := os.read(self._read_fd, 64):
            if signal.SIGINT in data:
                with self.lock:
                    if self.running is not None:
                        self.pressed = True
                        self.running.interrupt()


_watcher: _Watcher | None = None
_installed = False


def _main_thread_watcher() -> _Watcher | None:
    """The watcher, installed on first use from the main thread (None elsewhere, or where the pipe is taken)."""
    global _watcher, _installed
    if threading.current_thread() is not threading.main_thread():
        return None
    if not _installed:
        _installed = True
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        if previous != -1:  # someone else's: give it back
            signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
        else:
            _watcher = _Watcher(read_fd)
    return _watcher


@contextmanager
def ctrl_c_interrupts(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Around a query on `con`: Ctrl-C interrupts it and raises KeyboardInterrupt.

    Raises:
        KeyboardInterrupt: Ctrl-C was pressed while the query ran.
    """
    watcher = _main_thread_watcher()
    if watcher is None:
        yield
        return
    with watcher.lock:
        watcher.running, watcher.pressed = con, False
    try:
        yield
    except duckdb.InterruptException:
        if watcher.pressed:
            raise KeyboardInterrupt from None
        raise  # another interrupt: a rule's time limit
    finally:
        with watcher.lock:
            watcher.running = None
