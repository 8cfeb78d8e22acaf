"""A replica's requests that left the most reuse on the table: the drill-down from a replica row.

Rows of the named query `reuse_left_requests` (docs/design.md section 7.3) for one
replica's requests looked up in the TUI's window (its `kvaudit_since_ns`), most lost
first; from one of them the TUI opens its `explain` (`kvaudit.analyse.explain`). Each
request is explained over all the traces: a copy stored before the window still counts
at a lookup within it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kvaudit.analyse.named_queries import load
from kvaudit.backends import Backend
from kvaudit.causes import MISSES

SHOWN: Final = 100
# Most reuse lost first; among equals, most tokens missed: a request the fleet could not have served better
# still shows what it missed (on one shared pool the achievable prefix is the used one).
_QUERY: Final = f"""
SELECT * FROM (
{load("reuse_left_requests").strip().rstrip(";")}
)
ORDER BY lost_tokens DESC, coalesce(prompt_tokens, 0) - hit_tokens DESC, request_id
LIMIT {SHOWN}
"""


@dataclass(frozen=True)
class LostRequest:
    """One request of the replica: its hit and achievable tokens, and its missed tokens per cause."""

    request_id: str
    lookup_ns: int
    prompt_tokens: int | None
    hit_tokens: int
    achievable_tokens: int
    lost_tokens: int
    missed: dict[str, int]  # the causes that kept any of its tokens from reuse -> those tokens

    @property
    def main_cause(self) -> str | None:
        """The cause that cost it the most tokens."""
        return max(self.missed, key=lambda cause: self.missed[cause]) if self.missed else None


def lost_requests(backend: Backend, replica: str, since_ns: int | None = None) -> list[LostRequest]:
    """The `SHOWN` requests of `replica` looked up from `since_ns` on (None: all) that left
    the most reuse on the table, most first."""
    columns, rows = backend.query(_QUERY, {"kvaudit_replica": replica, "kvaudit_since_ns": since_ns})
    found = []
    for row in rows:
        values = dict(zip(columns, row))
        found.append(
            LostRequest(
                request_id=values["request_id"],
                lookup_ns=values["lookup_ns"],
                prompt_tokens=values["prompt_tokens"],
                hit_tokens=values["hit_tokens"],
                achievable_tokens=values["achievable_tokens"],
                lost_tokens=values["lost_tokens"],
                missed={cause.value: values[cause] for cause in MISSES if values[cause]},
            )
        )
    return found
