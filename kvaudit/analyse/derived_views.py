"""Views derived from the analysis, beside the kvaudit views: what alert rules and the exporter's metrics read.

- `findings`: the auditor's findings (rules KVA001-KVA008, `kvaudit.analyse.audit`), one
  row each: code, rule, severity, replica, key, trace_id, span_id, message, producer,
  file, line, and `time`, the end of the finding's span (NULL for an unreadable line),
  as a `LiveAudit` keeps them (`kvaudit.analyse.live_audit`: over a live store, brought
  up to date by auditing what arrived since its last update).
- `recent(ts, INTERVAL 10 MINUTE)`, kvaudit SQL's own function (`kvaudit.backends.base`):
  `ts` lies within that long before the newest span. Windows end at the newest span
  rather than at the wall clock, so a rule means the same over a live trace directory
  and over last week's files.
- Each named query of `queries/` and `queries/evictions/` as a temporary view
  `query_<name>` (`/` in a name becomes `_`: `queries/hit_rate.sql` is `query_hit_rate`).
  The auditor's parts (`audit/`) and the TUI's (`tui/`) are not views. Only the views
  the caller's SQL names are made: on ClickHouse, making one costs the analysis of its
  whole query (seconds for the explain queries), every time the views are refreshed.
  A caller that looks at a window (alert rules) may bound the queries that explain
  requests (`kvaudit_since_ns`: `reuse_left`, `reuse_left_requests`, `explain`) to the
  requests looked up within that long before the newest span: explaining every request
  of the history is what they cost otherwise.

Temporary objects live in the backend's session only, so this works over a read-only
ingested database or a ClickHouse fed by the Collector, and never changes what they hold.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from math import ceil
from typing import Final

from kvaudit.analyse.live_audit import LiveAudit
from kvaudit.analyse.named_queries import load, named_queries
from kvaudit.backends import Backend, BackendError

logger = logging.getLogger(__name__)

PREFIX: Final = "query_"
_NOT_VIEWS: Final = ("audit/", "tui/")
# The parameter of the queries that explain requests: the requests looked up from then on (unset: all).
_SINCE: Final = "getvariable('kvaudit_since_ns')"


def view_name(query: str) -> str:
    """The view a rule reads a named query through: `evictions/rates` is `query_evictions_rates`."""
    return PREFIX + query.replace("/", "_")


def prepare(backend: Backend, reads: Iterable[str], *, audit: LiveAudit | None, window_s: float | None = None) -> None:
    """Create (or refresh) the named query views `reads` names, and the `findings` view, on the backend.

    Args:
        reads: the SQL the caller will run over these views (a rule's, a metric's).
        audit: brings the findings on this backend up to date (it audits what arrived since
            its last update on this connection); None makes no `findings` view.
        window_s: the views of the queries that explain requests hold the requests looked up
            within this long before the newest span; None: every request.
    """
    since = _SINCE
    if window_s is not None:
        since = f"coalesce({_SINCE}, (SELECT max(end_ns) FROM spans) - {ceil(window_s * 1e9)})"
    named = {name.lower() for name in re.findall(rf"\b{PREFIX}\w+", " ".join(reads), re.IGNORECASE)}
    for name in named_queries():
        if name.startswith(_NOT_VIEWS) or view_name(name) not in named:
            continue
        try:
            backend.temp_view(view_name(name), load(name).strip().rstrip(";").replace(_SINCE, since))
        except BackendError as exc:
            logger.debug("named query %s is not usable as view %s: %s", name, view_name(name), exc)
    if audit is not None:
        audit.update(backend)
