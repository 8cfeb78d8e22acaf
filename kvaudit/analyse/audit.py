"""The auditor: rules KVA001-KVA008 of docs/design.md section 4 over the kvaudit views.

Every rule is SQL in `queries/audit/` (one file per rule, `kva00N_<name>.sql`) over
`audit_fetches`, which `queries/audit/lineage.sql` defines: fetched pages beside their
producer's stored descriptor (`queries/audit/producers.sql`, the earliest store of each
key) and their consumer's configuration. This module composes them into one statement,
with the producers and the lineage as CTEs that every rule reads, keeps of each rule's
rows the columns of `Finding` (a rule selects its code, rule, fields and message beside
the fetched page's columns), and turns the rows into `Finding`s; what a rule checks is
in its SQL.

The producers are materialised: one row per stored key, computed once instead of once
per rule (the window that picks the earliest store was most of each rule's time). The
lineage is deliberately not: each rule then streams its one hash join again, which at
10M descriptors is much faster than holding millions of wide rows for all rules at once,
which spill to disk under a memory limit.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from typing import Any, Final, Protocol

import duckdb
import pyarrow as pa

from kvaudit.analyse.named_queries import load
from kvaudit.backends import Backend, Source, as_backend
from kvaudit.contract import DTYPE_BYTES

SEVERITY_ORDER: Final = {"critical": 0, "warning": 1, "info": 2}
PRODUCERS_QUERY: Final = "audit/producers"
LINEAGE_QUERY: Final = "audit/lineage"
FETCHES: Final = "audit_fetches"  # the lineage's name in the statement, which the page rules read


@dataclass(frozen=True)
class Finding:
    """One rule firing on one page (or span, process, unreadable line).

    `fields` maps each field involved to its values (`{"fetched": ..., "stored": ...,
    "consumer": ...}`, as the rule has them), or is the list of missing fields (KVA001).
    """

    code: str
    rule: str
    severity: str  # "critical" | "warning" | "info"
    replica: str | None
    key: str | None
    trace_id: str | None
    span_id: str | None
    fields: dict[str, Any] | list[str]
    message: str
    producer: str | None = None
    file: str | None = None
    line: int | None = None


def rule_queries() -> list[str]:
    """Names of the rule queries (`audit/kva001_incomplete_metadata`, ...), in code order."""
    folder = files("kvaudit.queries").joinpath("audit")
    names = (entry.name for entry in folder.iterdir())
    return [f"audit/{name.removesuffix('.sql')}" for name in sorted(names) if name.startswith("kva")]


def page_rules() -> list[str]:
    """The rules over fetched pages (they read `audit_fetches`): those an audit by partition runs per partition."""
    return [name for name in rule_queries() if FETCHES in tables_read(_statement(name))]


def trace_rules() -> list[str]:
    """The rules over the traces as a whole (spans, unreadable lines): those an audit by partition runs once."""
    return [name for name in rule_queries() if name not in page_rules()]


@lru_cache(maxsize=64)
def tables_read(sql: str) -> frozenset[str]:
    """The tables and views a kvaudit SQL query reads (its own CTEs left out).

    DuckDB's own parser: kvaudit SQL is DuckDB's dialect, and DuckDB is what the analysis
    extra brings (sqlglot comes with ClickHouse's, which translates the SQL for it).
    """
    return frozenset(duckdb.get_table_names(sql))


def run_audit(source: Source, *, skew_s: float = 1.0) -> list[Finding]:
    """Every finding of every rule, critical first.

    Args:
        source: the traces (a store, or a backend such as ClickHouse).
        skew_s: clock skew allowed when deciding that a store preceded a fetch.
    """
    backend = as_backend(source)
    prepare(backend)
    return findings(backend, audit_statements(backend), skew_s=skew_s)


def findings(backend: Backend, statements: Sequence[str], *, skew_s: float) -> list[Finding]:
    """The findings of audit statements (`audit_statements`), critical first; `prepare` the backend first."""
    found = []
    for statement in statements:
        columns, rows = backend.query(statement, {"kvaudit_skew_s": skew_s})
        found += [finding_of(dict(zip(columns, row))) for row in rows]
    return sorted(found, key=sort_key)


def audit_statements(backend: Backend, rules: Sequence[str] | None = None, *, pages: str | None = None) -> list[str]:
    """The statements that run `rules` (default: every rule): one (`audit_query`), or one per rule where
    the backend computes a CTE once for each of its readers (`Backend.inlines_ctes`).

    There one statement of six rules holds six producer joins at once: on chdb, 2.5 times
    the memory and 1.8 times the time of the same rules one at a time (docs/scale.md).
    """
    chosen = rule_queries() if rules is None else list(rules)
    if backend.inlines_ctes:
        return [audit_query([rule], pages=pages) for rule in chosen]
    return [audit_query(chosen, pages=pages)]


def audit_query(rules: Sequence[str] | None = None, *, pages: str | None = None) -> str:
    """One statement: the producers and the lineage as CTEs, then the rules' rows.

    Args:
        rules: the rule queries to run (default: every rule).
        pages: kvaudit SQL whose rows stand for the view `pages` within the statement
            (a partition of it, `audit_partitions`); default the view itself.
    """
    chosen = rule_queries() if rules is None else list(rules)
    columns = ", ".join(field.name for field in dataclasses.fields(Finding))
    body = " UNION ALL ".join(f"SELECT {columns} FROM ({_statement(name)})" for name in chosen)
    ctes = [f"pages AS NOT MATERIALIZED ({pages})"] if pages is not None else []
    if any(FETCHES in tables_read(_statement(name)) for name in chosen):
        ctes += [
            f"audit_producers AS MATERIALIZED ({_statement(PRODUCERS_QUERY)})",
            f"{FETCHES} AS NOT MATERIALIZED ({_statement(LINEAGE_QUERY)})",
        ]
    return f"WITH {', '.join(ctes)} {body}" if ctes else body


def _statement(name: str) -> str:
    return load(name).strip().rstrip(";")


def prepare(backend: Backend) -> None:
    """What the rules read beside the views: `dtype_sizes`."""
    # KVA003 needs element sizes; the contract owns them, so the SQL gets them as a table.
    sizes = pa.table(
        {
            "dtype": [*DTYPE_BYTES, *(f"torch.{name}" for name in DTYPE_BYTES)],
            "bytes": [*DTYPE_BYTES.values(), *DTYPE_BYTES.values()],
        }
    )
    backend.temp_table("dtype_sizes", sizes)


def finding_of(record: dict[str, Any]) -> Finding:
    """A finding from a row of an audit statement (its `fields` JSON text)."""
    fields = json.loads(record.pop("fields"))
    if isinstance(fields, dict):
        # Rules list every field they compare; those that agree come back null.
        fields = {name: value for name, value in fields.items() if value is not None}
    return Finding(fields=fields, **record)


def sort_key(finding: Finding) -> tuple[Any, ...]:
    return (
        SEVERITY_ORDER.get(finding.severity, len(SEVERITY_ORDER)),
        finding.code,
        finding.replica or "",
        finding.key or "",
        finding.file or "",
        finding.line or 0,
    )


@dataclass(frozen=True)
class PageFound:
    """One fetched page that rules fired on: several rules on one page (KVA005 and KVA008 on a
    page of another geometry) are one bad page, counted once."""

    replica: str | None
    trace_id: str | None
    span_id: str | None
    key: str
    severity: str  # the most severe of its findings
    rules: tuple[str, ...]  # the codes that fired on it, in code order


class _OnAPage(Protocol):
    """What `pages_found` reads of a finding (a `Finding`, or the TUI's row of one)."""

    code: str
    severity: str
    replica: str | None
    trace_id: str | None
    span_id: str | None
    key: str | None


def pages_found(found: Iterable[_OnAPage], severity: str | None = None) -> list[PageFound]:
    """The pages the findings are about, one each (findings with no page, such as an unreadable
    line, left out), in the order of their first finding; only those of `severity` where given."""
    by_page: dict[tuple[str | None, str | None, str | None, str], list[_OnAPage]] = {}
    for finding in found:
        if finding.key is not None:
            by_page.setdefault((finding.replica, finding.trace_id, finding.span_id, finding.key), []).append(finding)
    pages = [
        PageFound(
            *page,
            severity=min((f.severity for f in on_page), key=lambda name: SEVERITY_ORDER.get(name, len(SEVERITY_ORDER))),
            rules=tuple(sorted({f.code for f in on_page})),
        )
        for page, on_page in by_page.items()
    ]
    return [page for page in pages if severity is None or page.severity == severity]
