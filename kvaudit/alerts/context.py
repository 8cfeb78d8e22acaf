"""What a rule's SQL can use besides the kvaudit views.

- `findings`: the auditor's findings (rules KVA001-KVA007, `kvaudit.audit`), one row
  each: code, rule, severity, replica, key, trace_id, span_id, message, producer,
  file, line, and `time`, the end of the finding's span (NULL for an unreadable line).
- `recent(ts, INTERVAL 10 MINUTE)`: `ts` lies within that long before the newest span.
  Windows end at the newest span rather than at the wall clock, so a rule means the
  same over a live trace directory and over last week's files.
- Each parameterless named query as a temporary view `query_<name>` (`/` in a name
  becomes `_`: `queries/hit_rate.sql` is `query_hit_rate`).

Temporary objects live in the connection only, so this works over a read-only
ingested database too, and never changes what the database holds.
"""

from __future__ import annotations

import logging
from typing import Final

import duckdb
import pyarrow as pa

from kvaudit.analyse.audit import run_audit
from kvaudit.analyse.named_queries import load, named_queries
from kvaudit.read.store import TraceStore

logger = logging.getLogger(__name__)

PREFIX: Final = "query_"
_FINDINGS: Final = pa.schema(
    [(name, pa.string()) for name in ("code", "rule", "severity", "replica", "key", "trace_id", "span_id")]
    + [("message", pa.string()), ("producer", pa.string()), ("file", pa.string()), ("line", pa.int64())]
)


def prepare(store: TraceStore) -> None:
    """Create (or refresh) the findings, the macro and the named query views on the store's connection."""
    con = store.con
    con.execute("CREATE OR REPLACE TEMP MACRO recent(ts, span) AS ts > (SELECT max(end_time) FROM spans) - span")
    for name in named_queries():
        view = PREFIX + name.replace("/", "_")
        try:
            con.execute(f'CREATE OR REPLACE TEMP VIEW "{view}" AS {load(name).strip().rstrip(";")}')
        except duckdb.Error as exc:
            # A query over a table of its own (the audit rules over `audit_fetches`) is no view.
            logger.debug("named query %s is not usable as view %s: %s", name, view, exc)
    findings = run_audit(store)
    con.register("_findings", pa.Table.from_pylist([vars(f) for f in findings], schema=_FINDINGS))
    con.execute(
        "CREATE OR REPLACE TEMP TABLE findings AS SELECT f.*, s.end_time AS time FROM _findings f "
        "LEFT JOIN (SELECT trace_id, span_id, end_time FROM spans) s USING (trace_id, span_id)"
    )
    con.unregister("_findings")
