"""Short turns at the GIL for kvaudit's exporter thread, so that serving never waits long for it.

CPython gives the GIL to a thread that waits for it only when its holder blocks (a
sleep, a write, a lock) or, failing that, once the waiter has waited the switch
interval (`sys.getswitchinterval()`, 5 ms by default) and asked for it. Building,
encoding and framing spans block on nothing: while the exporter thread does them, a
serving thread coming back from a GPU wait or a torch operation, several times a step,
waits up to the switch interval each time, and up to a whole C call past it (encoding
a batch). The switch interval is the process's, not kvaudit's to change.

A thread that gives way sleeps for `pause_s` once it has held the GIL about `slice_s`
since it last did (the sleep releases the GIL, and a waiting thread takes it), so that a
waiting thread gets the GIL back within about `slice_s` plus the exporter's longest
single step (one span's build or encoding; `SpanBatcher` bounds a batch, and so its
framing, by its page events). bench/bench_emission.py measures the serving thread's
waits with and without. The thread loses about `pause_s` of wall time
each `slice_s`; what it exports in a second is far more than replicas emit
(docs/design.md section 5).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

DEFAULT_SLICE_S: Final = 0.0005
# The shortest sleep Linux grants by default (its timer slack is 50 us): long enough for
# a thread waiting on the GIL's condition to wake and take it.
DEFAULT_PAUSE_S: Final = 0.00005

_current = threading.local()


class GiveWay:
    """Call it between steps of background work: it sleeps once a slice has run.

    Args:
        slice_s: how long the thread may hold the GIL between pauses.
        pause_s: how long each pause sleeps.
        clock, sleep: `time.perf_counter` and `time.sleep` (tests pass their own).
    """

    def __init__(
        self,
        slice_s: float = DEFAULT_SLICE_S,
        pause_s: float = DEFAULT_PAUSE_S,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._slice_s, self._pause_s = slice_s, pause_s
        self._clock, self._sleep = clock, sleep
        self._since = clock()
        self.pauses = 0

    def __call__(self) -> None:
        if self._clock() - self._since >= self._slice_s:
            self._sleep(self._pause_s)
            self.pauses += 1
            self.resume()

    def resume(self) -> None:
        """A new slice starts now (after the thread waited or slept: it held no GIL meanwhile)."""
        self._since = self._clock()


def install(give_way: GiveWay | None) -> None:
    """Make `give_way` the calling thread's (None: the thread never gives way)."""
    _current.give_way = give_way


def current() -> GiveWay | None:
    """The calling thread's `GiveWay`, or None: the thread is not one that gives way."""
    return getattr(_current, "give_way", None)
