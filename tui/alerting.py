"""Pending and firing alerts, through the alerting engine (`kvaudit.alerts`): of a rule file, or of
the default rule pack when none is given (as `kvaudit alerts eval` does)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from kvaudit.alerts.bounds import DEFAULT_TIMEOUT_S, Bounds
from kvaudit.alerts.engine import RuleEngine
from kvaudit.alerts.rules import load_default_pack, load_rules
from kvaudit.analyse.live_audit import LiveAudit
from kvaudit.backends import Backend

DEFAULT_PACK: Final = "default rule pack"

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


@dataclass(frozen=True)
class RuleAlerting:
    """The engine over a set of rules; `name` says which (a file, or the default pack)."""

    name: str
    engine: RuleEngine

    def __call__(self, backend: Backend) -> tuple[AlertRow, ...]:
        return alert_rows(self.engine.evaluate(backend))


def rule_alerting(
    rules: str | None, *, skew_s: float = 1.0, timeout_s: float = DEFAULT_TIMEOUT_S, audit: LiveAudit | None = None
) -> RuleAlerting:
    """The engine of `kvaudit.alerts` over a rule file, or over the default pack when `rules` is None.

    Args:
        timeout_s: how long each rule's query may run (as `kvaudit alerts eval --rule-timeout`).
        audit: the findings the rules read, shared with the TUI's findings panel (None: the
            engine's own).

    Raises:
        ValueError: the rule file is invalid (the engine says where).
    """
    bounds = Bounds(timeout_s=timeout_s)
    groups = load_default_pack() if rules is None else load_rules([rules])
    engine = RuleEngine(groups, skew_s=skew_s, bounds=bounds, audit=audit)
    return RuleAlerting(DEFAULT_PACK if rules is None else rules, engine)
