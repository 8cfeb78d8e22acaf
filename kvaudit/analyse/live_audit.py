"""The audit of a store that grows, kept up to date by auditing what arrived since the last look.

`audit.run_audit` audits the whole history. The live surfaces (`kvaudit alerts watch`,
`kvaudit exporter`, `kvaudit tui`) look again every few seconds while a fleet writes, and
an audit of a week of traces costs a week. `LiveAudit` keeps the findings in a temporary
table on the connection it audits through (read through the view `findings`, which the
alert rules and the exporter read) and, at each `update`, audits again only the requests
(traces) whose findings what arrived can change:

- a trace with a fetched page among the rows that arrived;
- a trace with a fetch of a key whose producer may have changed: a key stored among the
  rows that arrived with no earlier store of it within the lookback (so the first store
  of a key withdraws the KVA006 findings of the fetches before it), or a key whose store
  names, as the page of the layer below (`source_key`), a store that arrived in its trace.

Such a trace is audited whole: its fetched pages, with the stores of their keys from
`lookback_s` before its first fetch on (the rule of the audit by partition,
`audit_partitions`, by which the first update audits the history, in bounded memory).
The findings are the whole audit's whenever the first store of each fetched key lies
within `lookback_s` before the fetch, and each request's fetches within `lookback_s` of
one another. The rules over the traces as a whole (KVA007, over spans
and unreadable lines) run again, whole, when spans or unreadable lines arrived.

What arrived is what the store numbered since the last look (`Backend.row_ends`): a
store in a DuckDB database, whose statements this runs. A backend that numbers no rows
(ClickHouse, rows held as Arrow) is audited whole at every update, its findings handed
to it as a table.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Final

import pyarrow as pa

from kvaudit.analyse.audit import (
    Finding,
    audit_query,
    finding_of,
    page_rules,
    prepare,
    run_audit,
    sort_key,
    trace_rules,
)
from kvaudit.analyse.audit_partitions import LOOKBACK_S, plan
from kvaudit.backends import Backend
from kvaudit.contract import Op

# The findings, each with its span's end (`time`, and `end_ns` for the TUI's windows): a
# table on the connection (`LiveAudit`), or a view over the findings handed to a backend.
FINDINGS_TABLE: Final = "kvaudit_findings"
_HANDED: Final = "kvaudit_findings_handed"
_AUDITED: Final = "kvaudit_audited"  # the rows of each view the findings were audited up to (`Backend.row_ends`)
_TRACES: Final = "kvaudit_audit_traces"  # the traces to audit again
_FETCHED: Final = "kvaudit_audit_fetched"  # their fetched pages
_STORED: Final = "kvaudit_audit_stored"  # the stores of those pages' keys, and the stores of the layer below those name
_PARTITION: Final = "kvaudit_audit_partition"  # the rows of one partition of the history (the first update)
_COLUMNS: Final = [field.name for field in dataclasses.fields(Finding)]
# What the view `findings` shows of each: every column but `fields` (a mapping or a list, see
# `Finding`, which rules have no use for), and the end of its span, `time`.
FINDINGS_VIEW: Final = f"SELECT {', '.join(c for c in _COLUMNS if c != 'fields')}, time FROM {FINDINGS_TABLE}"
_HANDED_SCHEMA: Final = pa.schema([(name, pa.int64() if name == "line" else pa.string()) for name in _COLUMNS])


class LiveAudit:
    """The auditor's findings on a backend's connection, brought up to date by `update`.

    The findings, and the rows they were audited up to, are kept on the connection: any
    `LiveAudit` (of the same `skew_s` and `lookback_s`) carries on from the last update there.

    Args:
        skew_s: clock skew allowed when deciding that a store preceded a fetch.
        lookback_s: how far before a fetch the stores of its key are looked for (at least
            `skew_s`; see the module).
    """

    def __init__(self, *, skew_s: float = 1.0, lookback_s: float = LOOKBACK_S) -> None:
        self.skew_s = skew_s
        self._lookback_ns = math.ceil(max(lookback_s, skew_s) * 1e9)

    def update(self, backend: Backend) -> bool:
        """Bring the findings (and the view `findings`) on `backend`'s connection up to date with
        what it holds; whether they may have changed (False: nothing arrived since the last update)."""
        ends = backend.row_ends()
        if ends is None:
            _hand(backend, run_audit(backend, skew_s=self.skew_s))
            backend.temp_view("findings", FINDINGS_VIEW)
            return True
        audited = _audited(backend)
        if audited == ends:
            return False
        if audited is None:  # the history, a partition at a time: in one statement it outgrows the store's budget
            prepare(backend)
            self._run(backend, f"CREATE OR REPLACE TEMP TABLE {FINDINGS_TABLE} AS {_timed(audit_query(trace_rules()))}")
            for partition in plan(backend):
                # Its rows taken once, into a table DuckDB can spill, not selected again by every rule.
                rows = partition.pages(self._lookback_ns / 1e9)
                self._run(backend, f"CREATE OR REPLACE TEMP TABLE {_PARTITION} AS {rows}")
                found = _timed(audit_query(page_rules(), pages=f"SELECT * FROM {_PARTITION}"), partition.start_ns)
                self._run(backend, f"INSERT INTO {FINDINGS_TABLE} {found}")
            self._run(backend, f"DROP TABLE IF EXISTS {_PARTITION}")
        else:
            if ends["pages"] != audited["pages"]:
                self._audit_traces_of(backend, audited["pages"], ends["pages"])
            if (ends["spans"], ends["read_errors"]) != (audited["spans"], audited["read_errors"]):
                codes = _codes(trace_rules())
                self._run(backend, f"DELETE FROM {FINDINGS_TABLE} WHERE code IN ({codes})")
                self._run(backend, f"INSERT INTO {FINDINGS_TABLE} {_timed(audit_query(trace_rules()))}")
        backend.temp_table(_AUDITED, pa.Table.from_pylist([dict(ends)]))
        backend.temp_view("findings", FINDINGS_VIEW)
        return True

    def findings(self, backend: Backend) -> list[tuple[Finding, int | None]]:
        """The findings of the last `update` on `backend`, critical first, each with its span's end
        (ns since the epoch; None without a span, as an unreadable line)."""
        _, rows = backend.query(f"SELECT {', '.join(_COLUMNS)}, end_ns FROM {FINDINGS_TABLE}")
        found = [(finding_of(dict(zip(_COLUMNS, row))), row[-1]) for row in rows]
        return sorted(found, key=lambda pair: sort_key(pair[0]))

    def _audit_traces_of(self, backend: Backend, first: int, end: int) -> None:
        """Audit again the traces the pages numbered `first` to `end - 1` may change the findings of."""
        arrived = f"kvaudit_pages_between({first}, {end})"
        [(low, high)] = backend.query(f"SELECT min(time_ns), max(time_ns) FROM {arrived}")[1]
        if low is None:
            return
        lookback = self._lookback_ns
        self._run(backend, _traces(first, end, low - lookback, high + lookback, lookback))
        # A trace's fetches lie within the lookback of the pages that made it one to audit.
        self._run(
            backend,
            f"CREATE OR REPLACE TEMP TABLE {_FETCHED} AS SELECT * FROM pages WHERE op = '{Op.FETCH}'"
            f" AND time_ns BETWEEN {low - 2 * lookback} AND {high + lookback}"
            f" AND coalesce(trace_id, '') IN (SELECT trace FROM {_TRACES})",
        )
        [(first_fetch,)] = backend.query(f"SELECT min(time_ns) FROM {_FETCHED}")[1]
        self._run(
            backend,
            f"DELETE FROM {FINDINGS_TABLE} WHERE code IN ({_codes(page_rules())})"
            f" AND coalesce(trace_id, '') IN (SELECT trace FROM {_TRACES})",
        )
        if first_fetch is None:
            return
        self._run(backend, _stored(first_fetch - lookback))
        pages = f"SELECT * FROM {_FETCHED} UNION ALL SELECT * FROM {_STORED}"
        found = _timed(audit_query(page_rules(), pages=pages), first_fetch)
        self._run(backend, f"INSERT INTO {FINDINGS_TABLE} {found}")

    def _run(self, backend: Backend, statement: str) -> None:
        backend.query(statement, {"kvaudit_skew_s": self.skew_s})


def _audited(backend: Backend) -> Mapping[str, int] | None:
    """The rows the findings on `backend`'s connection were audited up to (None: none kept there)."""
    _, [(kept,)] = backend.query(f"SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = '{_AUDITED}'")
    if not kept:
        return None
    columns, [row] = backend.query(f"SELECT * FROM {_AUDITED}")
    return dict(zip(columns, row))


def _traces(first: int, end: int, low: int, high: int, lookback: int) -> str:
    """The statement that makes `_TRACES`: the traces whose findings the pages numbered `first` to
    `end - 1` may change (see the module), of those whose pages lie from `low` to `high`."""
    return f"""
        CREATE OR REPLACE TEMP TABLE {_TRACES} AS
        WITH arrived AS (
            SELECT op, trace_id, key, source_key, time_ns FROM kvaudit_pages_between({first}, {end})
        ),
        earlier AS NOT MATERIALIZED (  -- read where each reader needs it, not copied whole
            SELECT op, trace_id, key, source_key, time_ns FROM kvaudit_pages_between(0, {first})
            WHERE time_ns BETWEEN {low} AND {high}
        ),
        produced AS (
            -- keys whose producer may have changed
            SELECT a.key FROM arrived a
            WHERE a.op = '{Op.STORE}' AND a.key IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM earlier e
                WHERE e.op = '{Op.STORE}' AND e.key = a.key AND e.time_ns <= a.time_ns
                  AND e.time_ns >= a.time_ns - {lookback}
            )
            UNION
            SELECT e.key FROM earlier e
            JOIN arrived a ON a.trace_id = e.trace_id AND a.key = e.source_key
            WHERE e.op = '{Op.STORE}' AND a.op = '{Op.STORE}'
        )
        SELECT coalesce(trace_id, '') AS trace FROM arrived WHERE op = '{Op.FETCH}'
        UNION
        SELECT coalesce(trace_id, '') FROM earlier WHERE op = '{Op.FETCH}' AND key IN (SELECT key FROM produced)"""


def _stored(since_ns: int) -> str:
    """The statement that makes `_STORED`: the stores from `since_ns` on of the keys of `_FETCHED`,
    and the stores of the layer below that those name (docs/design.md section 4.2)."""
    stores = f"SELECT * FROM pages WHERE op = '{Op.STORE}' AND time_ns >= {since_ns}"
    return f"""
        CREATE OR REPLACE TEMP TABLE {_STORED} AS
        WITH stored AS ({stores} AND key IN (SELECT key FROM {_FETCHED}))
        SELECT * FROM stored
        UNION ALL
        {stores} AND key IN (SELECT source_key FROM stored)
          AND key NOT IN (SELECT key FROM stored WHERE key IS NOT NULL)"""


def _timed(findings: str, since_ns: int | None = None) -> str:
    """The rows of an audit statement with the end of each one's span (spans ending from `since_ns` on)."""
    ended = "" if since_ns is None else f" WHERE end_ns >= {since_ns}"
    return (
        f"SELECT f.*, s.end_time AS time, s.end_ns FROM ({findings}) f"
        f" LEFT JOIN (SELECT trace_id, span_id, end_time, end_ns FROM spans{ended}) s USING (trace_id, span_id)"
    )


def _hand(backend: Backend, findings: Sequence[Finding]) -> None:
    """Hand findings to a backend as the table of `FINDINGS_TABLE`'s columns (a view over them and the spans)."""
    rows = [{**vars(f), "fields": json.dumps(f.fields)} for f in findings]
    backend.temp_table(_HANDED, pa.Table.from_pylist(rows, schema=_HANDED_SCHEMA))
    backend.temp_view(FINDINGS_TABLE, _timed(f"SELECT * FROM {_HANDED}"))


def _codes(rules: Sequence[str]) -> str:
    """The codes of rule queries (`audit/kva006_orphan_fetch` is KVA006), as an SQL list."""
    return ", ".join(f"'{name.removeprefix('audit/')[:6].upper()}'" for name in rules)
