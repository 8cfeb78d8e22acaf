"""KV page tiers: least-recently-used caches of page entries bounded in bytes."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kvaudit.contract import PageDescriptor


@dataclass(frozen=True, slots=True)
class Entry:
    """A page as it sits in a tier: what its producer stored, who that was, and when."""

    page: PageDescriptor
    producer: str
    nbytes: int
    stored_ns: int = 0


class LRUTier:
    """An LRU cache of pages by key, holding at most `capacity` bytes.

    The key does not include the layout (as in LMCache, PR #2497): a page stored
    under one layout is served to a consumer of another. That is the bug the
    rolling-upgrade fault reproduces.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._entries: OrderedDict[str, Entry] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def peek(self, key: str) -> Entry | None:
        """The entry under `key`, leaving the LRU order alone (for routing decisions)."""
        return self._entries.get(key)

    def get(self, key: str) -> Entry | None:
        """The entry under `key`, made most recently used."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: Entry) -> list[Entry] | None:
        """Insert a page unless its key is present (then only touch it).

        Returns:
            The entries evicted to make room, or None when nothing was written
            (present already, or larger than the whole tier).
        """
        if self.get(key) is not None or entry.nbytes > self.capacity:
            return None
        evicted: list[Entry] = []
        while self.used + entry.nbytes > self.capacity:
            _, old = self._entries.popitem(last=False)
            self.used -= old.nbytes
            evicted.append(old)
        self._entries[key] = entry
        self.used += entry.nbytes
        return evicted
