"""A memory budget shared by the receiver's requests, in the spirit of the Collector's `memory_limiter`.

The Collector's limiter watches the process's heap and refuses data while it is above
its limit. Python's memory does not shrink back when a request is done, so the process
size cannot say when room has returned; instead each request reserves what it will
cost before it costs it (its body as read, then what decoding it takes), and gives it
back when it is answered. A reservation that does not fit is refused at once, and the
request is answered 503 with Retry-After, as the limiter's refusal is.
"""

from __future__ import annotations

import threading
from typing import Final

from kvaudit.errors import InputError

# Peak bytes of decoding one byte of a (decompressed) body: parsing it into protobuf
# messages and encoding them as one OTLP JSON line. Measured by bench/bench_receive.py
# (protobuf about 8, JSON about 10.5, for bodies of 27B page descriptors); above both.
DECODE_BYTES_PER_BODY_BYTE: Final = 12


class BudgetExceededError(InputError):
    """The reservation does not fit now; `whole` when it would never fit, however idle the receiver."""

    def __init__(self, wanted: int, limit: int, *, whole: bool) -> None:
        super().__init__(f"needs {wanted >> 20} MiB of a {limit >> 20} MiB memory budget")
        self.whole = whole


class MemoryBudget:
    """Bytes that requests in flight may hold together.

    Args:
        limit_bytes: the budget; 0 for none.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self._used = 0
        self._lock = threading.Lock()
        self.peak = 0
        self.refused = 0

    @property
    def used(self) -> int:
        return self._used

    def reservation(self) -> Reservation:
        return Reservation(self)

    def _take(self, amount: int, held: int) -> None:
        with self._lock:
            if self.limit and self._used + amount > self.limit:
                self.refused += 1
                raise BudgetExceededError(held + amount, self.limit, whole=held + amount > self.limit)
            self._used += amount
            self.peak = max(self.peak, self._used)

    def _give(self, amount: int) -> None:
        with self._lock:
            self._used -= amount


class Reservation:
    """What one request holds of the budget; grows as the request is decoded, given back on `release`."""

    def __init__(self, budget: MemoryBudget) -> None:
        self._budget = budget
        self.held = 0

    def grow(self, amount: int) -> None:
        """Hold `amount` more bytes.

        Raises:
            BudgetExceededError: they do not fit now (nothing more is held).
        """
        self._budget._take(amount, self.held)
        self.held += amount

    def release(self) -> None:
        self._budget._give(self.held)
        self.held = 0

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
