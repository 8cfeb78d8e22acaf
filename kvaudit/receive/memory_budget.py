"""A memory budget shared by the receiver's requests, in the spirit of the Collector's `memory_limiter`.

The Collector's limiter watches the process's heap and refuses data while it is above
its limit. Python's memory does not shrink back when a request is done, so the process
size cannot say when room has returned; instead each request reserves what it will
cost before it costs it (its body as it arrives, a MiB at a time, then what decoding it
takes, per byte and per span), and gives it back when it is answered. A reservation that
does not fit is refused at once, and the request is answered 503 with Retry-After, as the
limiter's refusal is, saying what holds the budget.
"""

from __future__ import annotations

import threading
from typing import Final

from kvaudit.errors import InputError

# Peak bytes of decoding one byte of a (decompressed) body: parsing it into protobuf
# messages and encoding them as one OTLP JSON line. Measured by bench/bench_receive.py
# (protobuf about 8, JSON about 10.5, for bodies of 27B page descriptors); above both.
DECODE_BYTES_PER_BODY_BYTE: Final = 12
# What each parsed span costs beyond its bytes (its message objects, its JSON pieces):
# a body of tiny spans costs far more per byte than one of page descriptors.
DECODE_BYTES_PER_SPAN: Final = 700
# A body is reserved as it arrives, this much at a time: a sender that announces a large
# body and sends nothing holds no more than this.
BODY_STEP: Final = 1 << 20


def _size(amount: int) -> str:
    return f"{amount / (1 << 20):.1f} MiB" if amount < 10 << 20 else f"{amount >> 20} MiB"


class BudgetExceededError(InputError):
    """The reservation does not fit now; `whole` when it would never fit, however idle the receiver."""

    def __init__(self, message: str, *, whole: bool) -> None:
        super().__init__(message)
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
        self._holders: set[Reservation] = set()
        self.peak = 0
        self.refused = 0

    @property
    def used(self) -> int:
        return self._used

    def reservation(self) -> Reservation:
        return Reservation(self)

    def check_whole(self, amount: int) -> None:
        """Refuse, as never fitting, a request that would need `amount` bytes on an idle receiver.

        Raises:
            BudgetExceededError: `amount` is more than the whole budget.
        """
        if self.limit and amount > self.limit:
            raise BudgetExceededError(f"needs {_size(amount)} of a {_size(self.limit)} memory budget", whole=True)

    def _take(self, amount: int, holder: Reservation) -> None:
        with self._lock:
            if self.limit and self._used + amount > self.limit:
                self.refused += 1
                raise self._refusal(amount, holder)
            self._used += amount
            self._holders.add(holder)
            self.peak = max(self.peak, self._used)

    def _refusal(self, amount: int, holder: Reservation) -> BudgetExceededError:
        """Why `amount` more does not fit: what holds the budget (under the lock)."""
        wanted = holder.held + amount
        if wanted > self.limit:
            return BudgetExceededError(f"needs {_size(wanted)} of a {_size(self.limit)} memory budget", whole=True)
        others = [other for other in self._holders if other is not holder]
        receiving = [other for other in others if other.receiving]
        return BudgetExceededError(
            f"needs {_size(amount)} more; {_size(self._used)} of the {_size(self.limit)} memory budget is held by"
            f" {len(others)} other requests ({len(receiving)} receiving their bodies, holding"
            f" {_size(sum(other.held for other in receiving))}; {len(others) - len(receiving)} decoding or writing)",
            whole=False,
        )

    def _give(self, amount: int, holder: Reservation) -> None:
        with self._lock:
            self._used -= amount
            self._holders.discard(holder)


class Reservation:
    """What one request holds of the budget; grows as the request arrives and is decoded, given back on `release`."""

    def __init__(self, budget: MemoryBudget) -> None:
        self._budget = budget
        self.held = 0
        self.receiving = True  # its body is still arriving (what a 503 says holds the budget)

    def grow(self, amount: int) -> None:
        """Hold `amount` more bytes.

        Raises:
            BudgetExceededError: they do not fit now (nothing more is held).
        """
        self._budget._take(amount, self)
        self.held += amount

    def release(self) -> None:
        self._budget._give(self.held, self)
        self.held = 0

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
