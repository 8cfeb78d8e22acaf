"""A scripted stand-in for the auditor: it reports the pages a test planted, once they are read.

The TUI shows findings, it does not compute them; these tests check the showing,
so the findings come from the test's own knowledge of what it planted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvaudit.analyse.audit import Finding
from kvaudit.backends import Backend


@dataclass
class Planted:
    """A fetched page the test made bad, and the finding the real auditor would raise for it."""

    key: str
    code: str
    rule: str
    severity: str
    fields: dict[str, Any] | list[str]
    message: str
    producer: str | None = None


@dataclass
class ScriptedAuditor:
    planted: list[Planted] = field(default_factory=list)
    calls: int = 0
    _rows: list[tuple[Any, ...]] = field(default_factory=list)  # the planted pages read, at the last update

    def update(self, backend: Backend) -> bool:
        self.calls += 1
        # One statement, so one snapshot: the store commits a refresh while an audit runs,
        # and a query per plant could find one planted page read and the other not yet.
        _, self._rows = backend.query(
            "SELECT p.key, p.replica, p.trace_id, p.span_id, s.end_ns FROM pages p"
            " JOIN spans s USING (trace_id, span_id) WHERE p.op = 'fetch' AND list_contains($keys, p.key)",
            {"keys": [plant.key for plant in self.planted]},
        )
        return True

    def findings(self, backend: Backend) -> list[tuple[Finding, int | None]]:
        findings = []
        for plant in self.planted:
            findings += [
                (
                    Finding(
                        plant.code,
                        plant.rule,
                        plant.severity,
                        replica,
                        plant.key,
                        trace_id,
                        span_id,
                        plant.fields,
                        plant.message,
                        plant.producer,
                    ),
                    end_ns,
                )
                for key, replica, trace_id, span_id, end_ns in self._rows
                if key == plant.key
            ]
        return findings
