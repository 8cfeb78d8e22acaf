"""Routers: which replica serves a request."""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Callable, Sequence
from typing import Final, Protocol


class FleetView(Protocol):
    """What a router may know about the fleet when it routes."""

    replicas: int

    def cached_prefix(self, replica: int, keys: Sequence[str]) -> int:
        """Leading pages of `keys` that `replica` holds itself (local tier, else what it produced)."""
        ...

    def backlog(self, replica: int) -> int:
        """Requests queued or running on `replica`."""
        ...


class Router(Protocol):
    def route(self, session: str, keys: Sequence[str], fleet: FleetView) -> int: ...


class RoundRobin:
    def __init__(self, seed: int) -> None:
        self._next = itertools.count()

    def route(self, session: str, keys: Sequence[str], fleet: FleetView) -> int:
        return next(self._next) % fleet.replicas


class RandomRouter:
    def __init__(self, seed: int) -> None:
        self._rng = random.Random(f"{seed}:router")

    def route(self, session: str, keys: Sequence[str], fleet: FleetView) -> int:
        return self._rng.randrange(fleet.replicas)


class SessionAffinity:
    """Every request of a session goes to the same replica (a stable hash, not Python's salted one)."""

    def __init__(self, seed: int) -> None:
        pass

    def route(self, session: str, keys: Sequence[str], fleet: FleetView) -> int:
        return int.from_bytes(hashlib.sha256(session.encode()).digest()[:8]) % fleet.replicas


class PrefixAware:
    """The replica holding the longest prefix of the prompt, among those not far behind in load.

    Pure prefix affinity would send every request sharing a popular system prompt to
    one replica; bounding the backlog gap keeps the fleet balanced.
    """

    MAX_BACKLOG_GAP: Final = 2

    def __init__(self, seed: int) -> None:
        pass

    def route(self, session: str, keys: Sequence[str], fleet: FleetView) -> int:
        backlogs = [fleet.backlog(r) for r in range(fleet.replicas)]
        eligible = [r for r in range(fleet.replicas) if backlogs[r] <= min(backlogs) + self.MAX_BACKLOG_GAP]
        return max(eligible, key=lambda r: (fleet.cached_prefix(r, keys), -backlogs[r], -r))


ROUTERS: Final[dict[str, Callable[[int], Router]]] = {
    "round-robin": RoundRobin,
    "random": RandomRouter,
    "session-affinity": SessionAffinity,
    "prefix-aware": PrefixAware,
}


def make_router(name: str, seed: int) -> Router:
    """Raises ValueError for an unknown router name."""
    if name not in ROUTERS:
        raise ValueError(f"router {name!r}: expected one of {', '.join(ROUTERS)}")
    return ROUTERS[name](seed)
