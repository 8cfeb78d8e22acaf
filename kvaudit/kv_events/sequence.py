"""Gap detection over one publisher's sequence numbers.

vLLM numbers its published batches 0, 1, 2, ... per publisher. ZMQ PUB/SUB drops
silently (a slow subscriber past the high-water mark, a subscriber that joined late,
a reconnect), so a sequence number past the expected one is the only sign that
batches were missed. A number below the expected one cannot come from the same
publisher over one connection: it means the publisher restarted (a new engine).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Observation:
    """What one sequence number says: the publisher restarted before it, and what was missed."""

    restarted: bool
    gap: Gap | None


@dataclass(frozen=True)
class Gap:
    """Batches `start` up to, not including, `stop` were not received."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


class SequenceTracker:
    """Tracks the next expected sequence number of one publisher."""

    def __init__(self) -> None:
        self.expected = 0
        self.restarts = 0

    def observe(self, seq: int) -> Observation:
        """Account for batch `seq` about to be processed.

        The first batch of a publisher is 0: a subscriber that starts later sees a gap
        from 0, which is what it missed.
        """
        restarted = seq < self.expected
        if restarted:
            self.restarts += 1
            self.expected = 0
        gap = Gap(self.expected, seq) if seq > self.expected else None
        self.expected = seq + 1
        return Observation(restarted, gap)
