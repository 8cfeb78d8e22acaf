"""Audit findings as the TUI shows them, from the auditor (`kvaudit.analyse.audit`).

The TUI never decides what is wrong with a page itself: findings come from the
auditor's rules (docs/design.md section 4), kept up to date as the traces grow
(`kvaudit.analyse.live_audit`). With the auditor off the findings panel says so instead
of showing an empty, reassuring list. Each finding carries the end of its span, so that
the panels count only the findings of the window they show.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from kvaudit.analyse.audit import Finding
from kvaudit.backends import Backend

SEVERITIES: Final = ("critical", "warning", "info")
CRITICAL: Final = SEVERITIES[0]


class Auditor(Protocol):
    """What the TUI asks of the auditor (`kvaudit.analyse.live_audit.LiveAudit`)."""

    def update(self, backend: Backend) -> bool:
        """Audit what arrived on `backend` since the last update; whether the findings may have changed."""
        ...

    def findings(self, backend: Backend) -> list[tuple[Finding, int | None]]:
        """The findings, each with its span's end (None: no span)."""
        ...


@dataclass(frozen=True)
class FindingRow:
    """One finding, reduced to plain values the panels and `--snapshot` can use.

    `fields` maps a field name to its values per side (`fetched`, `stored`,
    `consumer`); a finding about absent fields names them with empty sides.
    """

    code: str
    rule: str
    severity: str
    replica: str | None
    producer: str | None
    key: str | None
    trace_id: str | None
    span_id: str | None
    fields: Mapping[str, Mapping[str, Any]]
    message: str
    file: str | None
    line: int | None
    time_ns: int | None = None  # when its span ended; None: no span (an unreadable line), in every window

    @classmethod
    def of(cls, finding: Any, time_ns: int | None = None) -> FindingRow:
        """A row from an auditor's finding object (read by attribute)."""
        return cls(
            code=str(finding.code),
            rule=str(finding.rule),
            severity=str(finding.severity),
            replica=finding.replica,
            producer=getattr(finding, "producer", None),
            key=finding.key,
            trace_id=finding.trace_id,
            span_id=finding.span_id,
            fields=_fields(finding.fields),
            message=str(finding.message),
            file=getattr(finding, "file", None),
            line=getattr(finding, "line", None),
            time_ns=time_ns,
        )

    @property
    def severity_rank(self) -> int:
        return SEVERITIES.index(self.severity) if self.severity in SEVERITIES else len(SEVERITIES)

    def in_window(self, since_ns: int | None) -> bool:
        """Its span ended in the window starting at `since_ns` (as the panels' spans: `end_ns >= since`)."""
        return since_ns is None or self.time_ns is None or self.time_ns >= since_ns


def _fields(fields: Mapping[str, Any] | Iterable[str] | None) -> dict[str, dict[str, Any]]:
    # The auditor names absent fields as a list and differing ones as a mapping of sides.
    if fields is None:
        return {}
    if isinstance(fields, Mapping):
        return {name: dict(sides) if isinstance(sides, Mapping) else {} for name, sides in fields.items()}
    return {name: {} for name in fields}


def finding_rows(findings: Iterable[tuple[Any, int | None]]) -> tuple[FindingRow, ...]:
    """Rows of findings, each with its span's end, critical first, then by rule, replica and key."""
    rows = [FindingRow.of(finding, time_ns) for finding, time_ns in findings]
    return tuple(sorted(rows, key=lambda r: (r.severity_rank, r.code, r.replica or "", r.key or "")))
