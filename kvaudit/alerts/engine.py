"""The rule engine: evaluates rule groups over a backend and runs Prometheus' alert state machine.

inactive → pending (condition holds, for less than `for`) → firing → resolved (the
condition stopped holding, and `keep_firing_for` has passed since). A pending alert
whose condition stops is forgotten; a resolved one is kept for a while so that
notifiers can announce it, and replaced when its condition returns.

    engine = RuleEngine(load_default_pack(), state_path="alerts-state.json")
    for alert in engine.evaluate(backend):
        print(alert.state, alert.labels, alert.annotations, alert.value, alert.active_since)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from kvaudit.alerts.evaluate import EvaluationError, Sample, evaluate_rule
from kvaudit.alerts.instances import AlertInstance, AlertState, fingerprint
from kvaudit.alerts.rules import ALERTNAME, Group, Rule
from kvaudit.alerts.state_file import load_state, save_state
from kvaudit.analyse.derived_views import prepare
from kvaudit.backends import BackendError, Source, as_backend

logger = logging.getLogger(__name__)

# How long a resolved alert stays tracked (and re-sent to Alertmanager), as in Prometheus.
RESOLVED_RETENTION_S: Final = 15 * 60.0


class RuleEngine:
    """Evaluates rule groups and keeps the state of their alerts.

    Args:
        groups: the rule groups (see `rules.load_rules`).
        state_path: where alert state lives between runs (None: in memory only). Alerts
            of rules that no longer exist are dropped when it is loaded.
        clock: the current time in Unix seconds (tests pass a controllable one).
        resolved_retention_s: how long resolved alerts stay tracked.
        skew_s: clock skew the auditor allows between replicas (for `findings`).

    Raises:
        ValueError: the state file is unreadable.
    """

    def __init__(
        self,
        groups: Sequence[Group],
        *,
        state_path: str | Path | None = None,
        clock: Callable[[], float] = time.time,
        resolved_retention_s: float = RESOLVED_RETENTION_S,
        skew_s: float = 1.0,
    ) -> None:
        self.groups = list(groups)
        self.state_path = Path(state_path) if state_path is not None else None
        self.clock = clock
        self.resolved_retention_s = resolved_retention_s
        self.skew_s = skew_s
        self.errors: dict[tuple[str, str], str] = {}  # (group, alert) -> the last evaluation's error
        self._next_due: dict[str, float] = {}
        rules = {(g.name, r.alert) for g in self.groups for r in g.rules}
        saved = load_state(self.state_path) if self.state_path is not None else []
        # Keyed by group too: two groups may hold alerts of the same name and labels.
        self._alerts: dict[tuple[str, str], AlertInstance] = {
            (a.group, a.fingerprint): a for a in saved if (a.group, a.alertname) in rules
        }

    @property
    def alerts(self) -> list[AlertInstance]:
        """Every tracked alert (pending, firing, recently resolved), firing first."""
        order = {AlertState.FIRING: 0, AlertState.PENDING: 1, AlertState.RESOLVED: 2}
        return sorted(self._alerts.values(), key=lambda a: (order[a.state], a.alertname, sorted(a.labels.items())))

    def firing(self) -> list[AlertInstance]:
        return [a for a in self.alerts if a.state is AlertState.FIRING]

    def evaluate(self, source: Source) -> list[AlertInstance]:
        """Evaluate the groups that are due, advance the state machine, save the state.

        A rule whose SQL fails keeps its alerts as they were (its error is in
        `errors`): a broken query must not resolve what it cannot see.
        """
        now = self.clock()
        backend = as_backend(source)
        prepare(backend, skew_s=self.skew_s)
        for group in self.groups:
            if now < self._next_due.get(group.name, now):
                continue
            self._next_due[group.name] = now + (group.interval_s or 0.0)
            for rule in group.rules:
                try:
                    samples = evaluate_rule(backend, rule)
                except (BackendError, EvaluationError) as exc:
                    message = " ".join(str(exc).split())
                    if self.errors.get((group.name, rule.alert)) != message:
                        logger.warning("%s:%d: alert %s: %s", rule.file, rule.line, rule.alert, message)
                    self.errors[(group.name, rule.alert)] = message
                    continue
                self.errors.pop((group.name, rule.alert), None)
                self._apply(rule, samples, now)
        self._forget_resolved(now)
        self.save()
        return self.alerts

    def save(self) -> None:
        """Write the state file (notifiers' deliveries are part of it)."""
        if self.state_path is not None:
            save_state(self.state_path, list(self._alerts.values()))

    def _apply(self, rule: Rule, samples: list[Sample], now: float) -> None:
        seen = set()
        for sample in samples:
            # Templates see the row's own labels, as Prometheus' see the series' labels.
            labels = {**sample.labels, **{k: t.render(sample.labels, sample.value) for k, t in rule.labels.items()}}
            labels = {k: v for k, v in labels.items() if v}  # an empty label is no label, as in Prometheus
            labels[ALERTNAME] = rule.alert
            key = (rule.group, fingerprint(labels))
            seen.add(key)
            alert = self._alerts.get(key)
            if alert is None or alert.state is AlertState.RESOLVED:
                alert = AlertInstance(
                    group=rule.group,
                    alertname=rule.alert,
                    labels=labels,
                    annotations={},
                    value=None,
                    state=AlertState.PENDING,
                    active_since=now,
                    last_seen=now,
                    generator_url=f"{Path(rule.file).resolve().as_uri()}#L{rule.line}",
                )
                self._alerts[key] = alert
            alert.value = sample.value
            alert.annotations = {k: t.render(sample.labels, sample.value) for k, t in rule.annotations.items()}
            alert.last_seen = now
            alert.keep_firing_since = None
            if alert.state is AlertState.PENDING and now - alert.active_since >= rule.for_s:
                alert.state = AlertState.FIRING
                alert.fired_at = now
        for key, alert in list(self._alerts.items()):
            if key in seen or (alert.group, alert.alertname) != (rule.group, rule.alert):
                continue
            if alert.state is AlertState.PENDING:
                del self._alerts[key]
            elif alert.state is AlertState.FIRING:
                if alert.keep_firing_since is None:
                    alert.keep_firing_since = now
                if now - alert.keep_firing_since < rule.keep_firing_for_s:
                    continue
                alert.state = AlertState.RESOLVED
                alert.resolved_at = now

    def _forget_resolved(self, now: float) -> None:
        for key, alert in list(self._alerts.items()):
            if alert.resolved_at is not None and now - alert.resolved_at >= self.resolved_retention_s:
                del self._alerts[key]
