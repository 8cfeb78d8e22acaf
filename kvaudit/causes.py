"""What became of each page of a request's prompt, and why: `kvaudit explain`'s vocabulary.

docs/design.md section 7 defines every cause, the order in which they are decided and
what "present", "reachable" and "compatible" mean; `queries/explain.sql` decides them
from the traces, and the simulator (`kvaudit.simulator.page_truth`) records the same
causes from the exact state of its caches, so that the two can be held equal.

Standard library only: the simulator, a serving side, shares this package's top level.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Cause(StrEnum):
    """One page's fate at its request's lookup (docs/design.md section 7.2), in the order they are decided."""

    HIT_GPU = "hit_gpu"  # already in the replica's own prefix cache
    HIT_LOCAL = "hit_local"  # fetched and used from a tier of the replica's own, which it produced itself
    HIT_POOL = "hit_pool"  # fetched and used from the shared pool, or produced by another replica
    REJECTED = "rejected"  # fetched; the guard refused it (used = false)
    PREFIX_BROKEN = "prefix_broken"  # usable, but an earlier page of the prefix missed
    ROUTED_AWAY = "routed_away"  # a compatible copy sat only where this replica cannot reach
    INCOMPATIBLE_PRODUCER = "incompatible_producer"  # the only copies came from a differently configured replica
    EVICTED = "evicted"  # stored before the lookup, but no copy was left
    STORED_AFTER_LOOKUP = "stored_after_lookup"  # first stored later, by a request already under way (a race)
    NEVER_STORED = "never_stored"  # none of the above

    @property
    def hit(self) -> bool:
        return self in HITS


HITS: Final = frozenset({Cause.HIT_GPU, Cause.HIT_LOCAL, Cause.HIT_POOL})
