"""How long a rule's query may run and how many alerts it may produce (Prometheus' query timeout and `limit`).

A module of its own, with no query engine behind it, so that the command line offers
the defaults without loading one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# A rule's query is stopped after this long (Prometheus' query timeout is 2 minutes; a
# rule is evaluated every interval, and a slow one must not hold the others up).
DEFAULT_TIMEOUT_S: Final = 10.0
# The most alerts one rule may produce, unless its group sets `limit`.
DEFAULT_LIMIT: Final = 1000


@dataclass(frozen=True)
class Bounds:
    """How long a rule's query may run, and how many alerts it may produce."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    limit: int = DEFAULT_LIMIT
