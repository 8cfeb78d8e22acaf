"""The exporter's reuse left on the table: counters that add each request once, when it has settled.

A request's reuse left (queries/reuse_left_requests.sql) is decided by what the fleet
held at its lookup: the stores and evictions of every replica around that moment. Those
come from other replicas' files, a little late, so a request is counted once its lookup
lies `settle_s` before the newest span, or once nothing has arrived for `settle_s` (the
fleet is quiet, or the files are complete). Each analysis then explains only the requests
looked up since the last one counted (`kvaudit_since_ns`), never the history again, and
adds their tokens: a counter only adds, as Prometheus' model asks, and a request counted
is never counted again, even when a late store would have changed its causes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from kvaudit.backends import Backend
from kvaudit.causes import MISSES

# How long after its lookup a request's reuse left is counted: the spans and stores that decide
# it, written by other replicas at about the same time, reach the files within this.
SETTLE_S: Final = 60.0

# A request whose spans name no tokens requested has no prompt tokens: NULL, counted as none.
_COLUMNS: Final = ("prompt_tokens", "hit_tokens", "achievable_tokens", *(cause.value for cause in MISSES))
# The named query `reuse_left_requests` (a view, see `derived_views`) per replica, over the requests
# looked up from `kvaudit_since_ns` (unset: the first time, the history) up to `kvaudit_until_ns`.
SETTLED: Final = f"""
    SELECT replica, {", ".join(f"coalesce(sum({column}), 0)" for column in _COLUMNS)}
    FROM query_reuse_left_requests WHERE lookup_ns < getvariable('kvaudit_until_ns')
    GROUP BY replica ORDER BY replica"""
_NEWEST: Final = "SELECT max(end_ns) FROM spans"


@dataclass
class ReuseCounts:
    """The sums of `SETTLED` per replica over the requests counted so far.

    Args:
        settle_s: how long after its lookup, or after the last rows arrived, a request is counted.
    """

    settle_s: float = SETTLE_S
    totals: dict[str, list[int]] = field(default_factory=dict)  # replica -> the columns of SETTLED
    counted_until: int | None = None  # requests looked up before this (Unix ns) are counted
    settled: bool = False  # every request of the spans seen is counted

    def add_settled(self, backend: Backend, *, quiet: bool) -> None:
        """Count the requests that settled since the last call (the views `SETTLED` reads made).

        Args:
            quiet: nothing arrived for `settle_s`: every request looked up so far is counted.
        """
        [(newest,)] = backend.query(_NEWEST)[1]
        if newest is None:  # no span yet
            self.settled = quiet
            return
        until = newest + 1 if quiet else newest - int(self.settle_s * 1e9)
        if self.counted_until is not None and until <= self.counted_until:
            self.settled = quiet
            return
        params = {"kvaudit_until_ns": until}
        if self.counted_until is not None:
            params["kvaudit_since_ns"] = self.counted_until
        for replica, *sums in backend.query(SETTLED, params)[1]:
            totals = self.totals.setdefault(str(replica), [0] * len(sums))
            for k, value in enumerate(sums):
                totals[k] += value
        self.counted_until = until
        self.settled = quiet

    def rows(self) -> list[tuple[object, ...]]:
        """Per replica: prompt, hit and achievable tokens, then the missed tokens per cause."""
        return [(replica, *totals) for replica, totals in sorted(self.totals.items())]
