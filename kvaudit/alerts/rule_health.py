"""Rule health, as Prometheus' rule manager keeps it: whether each rule's last evaluation worked.

A rule whose query fails, times out or produces more alerts than its limit is
unhealthy (`err`) until an evaluation works again; the others keep evaluating. Its
alerts stay as they were (what a broken query cannot see, it must not resolve), and it
raises an alert of its own, `KVAuditRuleFailing`, one per failing rule, through the
same state machine and notifiers as every other alert. Health is shown on the
`alerts watch` status line and as `kvaudit_rule_health` on its `/metrics`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

from kvaudit.alerts.evaluate import Sample
from kvaudit.alerts.rules import HEALTH_GROUP, Rule
from kvaudit.alerts.templates import parse_template


class Health(StrEnum):
    """Prometheus' rule health values."""

    UNKNOWN = "unknown"  # not evaluated yet
    OK = "ok"
    ERR = "err"


@dataclass
class RuleHealth:
    """One rule's last evaluation: its health, error, when, and how long it took; counts since start."""

    group: str
    alert: str
    file: str
    line: int
    health: Health = Health.UNKNOWN
    last_error: str = ""
    last_evaluation: float | None = None  # the engine's clock (Unix seconds)
    duration_s: float = 0.0
    evaluations: int = 0
    failures: int = 0

    @classmethod
    def of(cls, rule: Rule) -> RuleHealth:
        return cls(rule.group, rule.alert, rule.file, rule.line)


RULE_FAILING: Final = Rule(
    alert="KVAuditRuleFailing",
    expr="",  # not a query: its samples are the failing rules (`failing_samples`)
    for_s=0.0,
    keep_firing_for_s=0.0,
    labels={"severity": parse_template("warning")},
    annotations={
        "summary": parse_template("alert rule {{ $labels.rule }} of group {{ $labels.rule_group }} is failing"),
        "description": parse_template(
            "Its alerts stay as they were until it evaluates again; the other rules keep evaluating."
        ),
        "runbook": parse_template(
            "Open a ticket. The error is in `error`, the rule at `source`; run `kvaudit alerts check` on"
            " its rule file. A rule that times out or exceeds its limit needs a narrower query"
            " (`recent(...)` windows, fewer groups) or a larger --rule-timeout or group `limit`."
        ),
    },
    group=HEALTH_GROUP,
    file=str(Path(__file__)),
    line=1,
    expr_line=1,
    expr_literal=False,
)


def failing_samples(health: Iterable[RuleHealth]) -> list[Sample]:
    """One sample of `RULE_FAILING` per rule whose last evaluation failed."""
    return [
        Sample(
            {"rule_group": h.group, "rule": h.alert},
            1.0,
            annotations={"error": h.last_error, "source": f"{h.file}:{h.line}"},
        )
        for h in health
        if h.health is Health.ERR
    ]
