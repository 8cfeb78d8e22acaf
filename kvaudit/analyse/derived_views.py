"""Views derived from the analysis, beside the kvaudit views: what alert rules and the exporter's metrics read.

- `findings`: the auditor's findings (rules KVA001-KVA008, `kvaudit.analyse.audit`), one
  row each: code, rule, severity, replica, key, trace_id, span_id, message, producer,
  file, line, and `time`, the end of the finding's span (NULL for an unreadable line).
- `recent(ts, INTERVAL 10 MINUTE)`, kvaudit SQL's own function (`kvaudit.backends.base`):
  `ts` lies within that long before the newest span. Windows end at the newest span
  rather than at the wall clock, so a rule means the same over a live trace directory
  and over last week's files.
- Each named query of `queries/` and `queries/evictions/` as a temporary view
  `query_<name>` (`/` in a name becomes `_`: `queries/hit_rate.sql` is `query_hit_rate`).
  The auditor's parts (`audit/`) and the TUI's (`tui/`) are not views. Only the views
  the caller's SQL names are made: on ClickHouse, making one costs the analysis of its
  whole query (seconds for the explain queries), every time the views are refreshed.

Temporary objects live in the backend's session only, so this works over a read-only
ingested database or a ClickHouse fed by the Collector, and never changes what they hold.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Final

import pyarrow as pa

from kvaudit.analyse.audit import Finding, run_audit
from kvaudit.analyse.named_queries import load, named_queries
from kvaudit.backends import Backend, BackendError

logger = logging.getLogger(__name__)

PREFIX: Final = "query_"
_NOT_VIEWS: Final = ("audit/", "tui/")
# Every column of a finding but `fields` (a mapping or list, see Finding), which rules have no use for.
_FINDINGS: Final = pa.schema(
    [
        (field.name, pa.int64() if field.name == "line" else pa.string())
        for field in dataclasses.fields(Finding)
        if field.name != "fields"
    ]
)
_FINDINGS_VIEW: Final = (
    "SELECT f.*, s.end_time AS time FROM kvaudit_findings f "
    "LEFT JOIN (SELECT trace_id, span_id, end_time FROM spans) s USING (trace_id, span_id)"
)


def view_name(query: str) -> str:
    """The view a rule reads a named query through: `evictions/rates` is `query_evictions_rates`."""
    return PREFIX + query.replace("/", "_")


def prepare(
    backend: Backend, reads: Iterable[str], *, skew_s: float = 1.0, findings: Sequence[Finding] | None = None
) -> Sequence[Finding]:
    """Create (or refresh) the `findings` view and the named query views `reads` names on the backend.

    Args:
        reads: the SQL the caller will run over these views (a rule's, a metric's).
        skew_s: clock skew the auditor allows between replicas.
        findings: the auditor's findings over these traces when the caller has them
            already (the TUI audits for its own panels); None runs the auditor.

    Returns:
        The findings the view holds.
    """
    named = {name.lower() for name in re.findall(rf"\b{PREFIX}\w+", " ".join(reads), re.IGNORECASE)}
    for name in named_queries():
        if name.startswith(_NOT_VIEWS) or view_name(name) not in named:
            continue
        try:
            backend.temp_view(view_name(name), load(name).strip().rstrip(";"))
        except BackendError as exc:
            logger.debug("named query %s is not usable as view %s: %s", name, view_name(name), exc)
    if findings is None:
        findings = run_audit(backend, skew_s=skew_s)
    rows = [vars(finding) for finding in findings]
    backend.temp_table("kvaudit_findings", pa.Table.from_pylist(rows, schema=_FINDINGS))
    backend.temp_view("findings", _FINDINGS_VIEW)
    return findings
