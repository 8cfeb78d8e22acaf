"""What became of each page of a request's prompt, and why: `kvaudit explain`'s vocabulary.

docs/design.md section 7 defines every cause, the order in which they are decided and
what "present", "reachable" and "compatible" mean, once; `queries/explain.sql` decides
them from the traces, and the simulator (`kvaudit.simulator.page_truth`) records them
from the exact state of its caches, so that the two can be held equal.

Standard library only: the simulator, a serving side, shares this package's top level.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Cause(StrEnum):
    """One page's fate at its request's lookup, in the order the causes are decided (docs/design.md section 7.2)."""

    HIT_GPU = "hit_gpu"
    HIT_LOCAL = "hit_local"
    HIT_POOL = "hit_pool"
    REJECTED = "rejected"
    OUTSIDE_WINDOW = "outside_window"
    PREFIX_BROKEN = "prefix_broken"
    ROUTED_AWAY = "routed_away"
    INCOMPATIBLE_PRODUCER = "incompatible_producer"
    EVICTED = "evicted"
    STORED_AFTER_LOOKUP = "stored_after_lookup"
    NEVER_STORED = "never_stored"

    @property
    def hit(self) -> bool:
        return self in HITS


HITS: Final = frozenset({Cause.HIT_GPU, Cause.HIT_LOCAL, Cause.HIT_POOL})
# Pages absent by design, not missed: a sliding-window group's pages before the window of
# the lookup, which the engine drops and never needs again (docs/design.md section 7.2).
DROPPED: Final = frozenset({Cause.OUTSIDE_WINDOW})
# The causes of a missed page, in the order they are decided: also the columns of missed
# tokens in `queries/reuse_left_requests.sql` and `reuse_left.sql`, the reuse left on the table.
MISSES: Final = tuple(cause for cause in Cause if not cause.hit and cause not in DROPPED)
# What to do about a missed page, in one line per cause (`kvaudit explain` prints it beside
# each cause's tokens): the lever an SRE has for it.
REMEDIES: Final = {
    Cause.REJECTED: "the guard refused an incompatible page (its rule is shown): align the producer's KV"
    " configuration with this replica's, or key pages by geometry (`prevent`)",
    Cause.OUTSIDE_WINDOW: "none needed: a sliding-window group keeps only the tokens of its window, the"
    " engine drops these by design",
    Cause.PREFIX_BROKEN: "engines reuse only an unbroken prefix: remove the first miss before these pages",
    Cause.ROUTED_AWAY: "routing: send the session to the replica that holds its prefix (session affinity,"
    " prefix-aware routing), or share the tier",
    Cause.INCOMPATIBLE_PRODUCER: "a rolling upgrade's other geometry: finish the upgrade, or key pages by"
    " geometry (`prevent`) so that replicas of each geometry reuse their own",
    Cause.EVICTED: "pool capacity: the copy was evicted before its reuse; grow the pool or tier"
    " (`kvaudit report`'s capacity curve), or shorten the time to reuse",
    Cause.STORED_AFTER_LOOKUP: "concurrency of identical prompts: another request was computing these pages;"
    " hold requests of a prefix being computed, or stagger them",
    Cause.NEVER_STORED: "first seen: nothing held these tokens before (or their store is not in the traces)",
}
