"""Firing alerts from a rule file, through the alerting engine (`kvaudit.alerts`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kvaudit.alerts.engine import RuleEngine
from kvaudit.alerts.rules import load_rules
from kvaudit.backends import Backend

# Evaluates the rules over a backend (at the engine's own group intervals) and returns its alerts.
Alerting = Callable[[Backend], tuple["AlertRow", ...]]


@dataclass(frozen=True)
class AlertRow:
    name: str
    state: str  # pending, firing or resolved
    severity: str | None
    labels: tuple[tuple[str, str], ...]
    summary: str
    value: float | None

    @classmethod
    def of(cls, alert: Any) -> AlertRow:
        """A row from an engine's alert instance (read by attribute)."""
        annotations = dict(alert.annotations or {})
        labels = dict(alert.labels or {})
        return cls(
            name=str(alert.alertname),
            state=str(alert.state),
            severity=labels.get("severity"),
            labels=tuple(sorted(labels.items())),
            summary=annotations.get("summary") or annotations.get("description") or "",
            value=alert.value,
        )


def alert_rows(alerts: Iterable[Any]) -> tuple[AlertRow, ...]:
    """Rows of the engine's pending and firing alerts, firing first (resolved ones are not shown)."""
    rows = [AlertRow.of(a) for a in alerts]
    return tuple(sorted((r for r in rows if r.state != "resolved"), key=lambda r: (r.state != "firing", r.name)))


def rule_alerting(rules: str, *, skew_s: float = 1.0) -> Alerting:
    """The engine of `kvaudit.alerts` over a rule file.

    Raises:
        ValueError: the rule file is invalid (the engine says where).
    """
    engine = RuleEngine(load_rules([rules]), skew_s=skew_s)
    return lambda backend: alert_rows(engine.evaluate(backend))
