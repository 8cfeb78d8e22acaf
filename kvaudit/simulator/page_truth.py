"""The ground truth of every page of every request: its cause, from the exact state of every cache.

At each lookup the simulator knows what every tier of every replica and every pool
holds; this module turns that into the cause docs/design.md section 7 defines for
each page of the prompt (`kvaudit.causes.Cause`), and into the achievable prefix: the
leading pages of which a compatible copy existed anywhere in the fleet, or that were
used. A miss that no store preceded is decided when the run ends, once it is known
whether a request already under way stored the page later (`stored_after_lookup`).

`queries/explain.sql` decides the same causes from the traces alone; the tests hold
the two equal under every router and fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from kvaudit.causes import Cause
from kvaudit.contract import CONSUMER_FIELDS, KVConfig, PageDescriptor, Tier
from kvaudit.simulator.pool import Entry, LRUTier
from kvaudit.simulator.records import read_records


class PageTruth(msgspec.Struct, kw_only=True):
    """One page of one request's prompt, as the simulator knows it.

    producer, stored_ns: for a hit, the replica that stored the copy used, and when.
    """

    request_id: str
    replica: str
    token_start: int
    key: str
    cause: Cause
    producer: str | None = None
    stored_ns: int | None = None


@dataclass(frozen=True)
class Fetched:
    """A page the lookup found: where, and whether the consumer used it."""

    entry: Entry
    tier: str
    used: bool


@dataclass(frozen=True)
class _Write:
    time_ns: int
    request_id: str
    request_start_ns: int


def compatible(page: PageDescriptor, consumer: KVConfig) -> bool:
    """Whether a stored page fits the consumer: no field of `CONSUMER_FIELDS` present on both sides differs."""
    return all(
        (mine := getattr(page, name)) is None or (theirs := getattr(consumer, name, None)) is None or mine == theirs
        for name in CONSUMER_FIELDS
    )


class PageTruthRecorder:
    """Collects the cause of each page as requests look their prompts up, and every write into a store."""

    def __init__(self) -> None:
        self._writes: dict[str, list[_Write]] = {}
        self._records: list[PageTruth] = []
        self._undecided: list[tuple[int, int]] = []  # (record index, lookup time) of misses no store preceded

    def written(self, key: str, time_ns: int, request_id: str, request_start_ns: int) -> None:
        """A page was written into a store (the pool or a local tier)."""
        self._writes.setdefault(key, []).append(_Write(time_ns, request_id, request_start_ns))

    def lookup(
        self,
        now: int,
        request_id: str,
        replica: str,
        consumer: KVConfig,
        keys: Sequence[str],
        page_tokens: int,
        fetched: Sequence[Fetched],
        reachable: Sequence[LRUTier],
        elsewhere: Sequence[LRUTier],
    ) -> int:
        """Record the cause of each page of a prompt looked up at `now`; return the achievable pages.

        Args:
            fetched: the pages the lookup found, in order (a prefix of `keys`).
            reachable: the tiers this replica looks in (its local tier, its pool).
            elsewhere: every other tier of the fleet.
        """
        first_unused = next((i for i, page in enumerate(fetched) if not page.used), None)
        achievable, leading = 0, True
        for index, key in enumerate(keys):
            near = [entry for tier in reachable if (entry := tier.peek(key)) is not None]
            far = [entry for tier in elsewhere if (entry := tier.peek(key)) is not None]
            record = PageTruth(
                request_id=request_id,
                replica=replica,
                token_start=index * page_tokens,
                key=key,
                cause=Cause.NEVER_STORED,
            )
            if index < len(fetched):
                self._fetched(record, fetched[index], index == first_unused)
            elif any(compatible(entry.page, consumer) for entry in near):
                record.cause = Cause.PREFIX_BROKEN
            elif any(compatible(entry.page, consumer) for entry in far):
                record.cause = Cause.ROUTED_AWAY
            elif near or far:
                record.cause = Cause.INCOMPATIBLE_PRODUCER
            elif key in self._writes:
                record.cause = Cause.EVICTED
            else:
                self._undecided.append((len(self._records), now))
            used = index < len(fetched) and fetched[index].used
            leading = leading and (used or any(compatible(entry.page, consumer) for entry in near + far))
            achievable += leading
            self._records.append(record)
        return achievable

    @staticmethod
    def _fetched(record: PageTruth, page: Fetched, first_unused: bool) -> None:
        if page.used:
            own = page.tier != Tier.REMOTE and page.entry.producer == record.replica
            record.cause = Cause.HIT_LOCAL if own else Cause.HIT_POOL
            record.producer, record.stored_ns = page.entry.producer, page.entry.stored_ns
        else:
            # The guard refuses the first bad page; the engines drop every later one unjudged.
            record.cause = Cause.REJECTED if first_unused else Cause.PREFIX_BROKEN

    def records(self) -> list[PageTruth]:
        """Every page's truth, the misses no store preceded decided now that the run is over."""
        for index, lookup_ns in self._undecided:
            record = self._records[index]
            raced = any(
                write.time_ns > lookup_ns
                and write.request_id != record.request_id
                and write.request_start_ns <= lookup_ns
                for write in self._writes.get(record.key, ())
            )
            record.cause = Cause.STORED_AFTER_LOOKUP if raced else Cause.NEVER_STORED
        self._undecided = []
        return self._records


def read_page_truth(path: Path) -> list[PageTruth]:
    return read_records(path, PageTruth)
