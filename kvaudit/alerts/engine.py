"""The rule engine: evaluates rule groups over a backend and runs Prometheus' alert state machine.

inactive → pending (condition holds, for less than `for`) → firing → resolved (the
condition stopped holding, and `keep_firing_for` has passed since). A pending alert
whose condition stops is forgotten; a resolved one is kept for a while so that
notifiers can announce it, and replaced when its condition returns.

Rules are isolated from each other, as in Prometheus' rule manager: each runs in the
backend's sandbox with a time limit and an alert limit (`bounds.Bounds`), and one
that fails is reported as rule health (`rule_health`: `health`, the `KVAuditRuleFailing`
alert) while the others keep evaluating. The state file is best effort both ways: one
that cannot be read is set aside (`state_file`), one that cannot be written is a warning
and is tried again at the next evaluation, with the alerts kept in memory meanwhile.

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
from urllib.parse import quote, urldefrag

from kvaudit.alerts.bounds import Bounds
from kvaudit.alerts.evaluate import EvaluationError, Sample, evaluate_rule
from kvaudit.alerts.instances import AlertInstance, AlertState, fingerprint
from kvaudit.alerts.labels import ALERTNAME
from kvaudit.alerts.rule_health import RULE_FAILING, Health, RuleHealth, failing_samples
from kvaudit.alerts.rules import HEALTH_GROUP, Group, Rule
from kvaudit.alerts.state_file import load_state, save_state
from kvaudit.analyse.derived_views import prepare
from kvaudit.analyse.live_audit import LiveAudit
from kvaudit.backends import Backend, BackendError, Source, as_backend

logger = logging.getLogger(__name__)

# How long a resolved alert stays tracked (and re-sent to Alertmanager), as in Prometheus.
RESOLVED_RETENTION_S: Final = 15 * 60.0
# The requests the views that explain requests (`query_reuse_left`, ...) hold for rules: those
# looked up within this long before the newest span, the default pack's window over them.
# Explaining a whole long history outlasts a rule's time limit.
RULE_WINDOW_S: Final = 1800.0


class RuleEngine:
    """Evaluates rule groups and keeps the state of their alerts.

    Args:
        groups: the rule groups (see `rules.load_rules`).
        state_path: where alert state lives between runs (None: in memory only). Alerts
            of rules that no longer exist are dropped when it is loaded.
        clock: the current time in Unix seconds (tests pass a controllable one).
        resolved_retention_s: how long resolved alerts stay tracked.
        skew_s: clock skew the auditor allows between replicas (for `findings`).
        audit: keeps the findings the rules read (`findings`), auditing what arrived since the
            last evaluation; None: one of the engine's own, with `skew_s`. The TUI shares its
            own with the engine.
        bounds: each rule's time limit and default alert limit (a group's `limit` wins).
        external_url: the start of each alert's `generatorURL` (`--external-url`), which
            ends with `#` and the rule's name (empty: the name alone).
    """

    def __init__(
        self,
        groups: Sequence[Group],
        *,
        state_path: str | Path | None = None,
        clock: Callable[[], float] = time.time,
        resolved_retention_s: float = RESOLVED_RETENTION_S,
        skew_s: float = 1.0,
        bounds: Bounds | None = None,
        external_url: str = "",
        audit: LiveAudit | None = None,
    ) -> None:
        self.groups = list(groups)
        self.external_url = urldefrag(external_url).url
        self.state_path = Path(state_path) if state_path is not None else None
        self.clock = clock
        self.resolved_retention_s = resolved_retention_s
        self.bounds = bounds or Bounds()
        # (group, alert) -> the health of that rule's last evaluation
        self.health = {(g.name, r.alert): RuleHealth.of(r) for g in self.groups for r in g.rules}
        self._next_due: dict[str, float] = {}
        self.audit = audit or LiveAudit(skew_s=skew_s)
        self._save_error: str | None = None  # the last failed save's error, until one works
        rules = set(self.health) | {(HEALTH_GROUP, RULE_FAILING.alert)}
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

    @property
    def errors(self) -> dict[tuple[str, str], str]:
        """(group, alert) -> the error of each rule whose last evaluation failed."""
        return {key: h.last_error for key, h in self.health.items() if h.health is Health.ERR}

    def evaluate(self, source: Source) -> list[AlertInstance]:
        """Evaluate the groups that are due, advance the state machine, save the state.

        A rule whose evaluation fails keeps its alerts as they were (its error is in
        `health` and `errors`, and it fires `KVAuditRuleFailing`): a broken query must
        not resolve what it cannot see. The findings are kept on the backend's connection
        (`audit`): an evaluation audits what arrived there since the last one.
        """
        now = self.clock()
        backend = as_backend(source)
        due = [group for group in self.groups if now >= self._next_due.get(group.name, now)]
        views_error = self._prepare(backend) if due else None
        for group in due:
            self._next_due[group.name] = now + (group.interval_s or 0.0)
            bounds = Bounds(self.bounds.timeout_s, group.limit or self.bounds.limit)
            for rule in group.rules:
                samples = self._evaluate_rule(backend, rule, bounds, now, views_error)
                if samples is not None:
                    self._apply(rule, samples, now)
        self._apply(RULE_FAILING, failing_samples(self.health.values()), now)
        self._forget_resolved(now)
        self.save()
        return self.alerts

    def _prepare(self, backend: Backend) -> str | None:
        """Refresh the views rules read (`findings`, `query_*`); what went wrong, if it did."""
        try:
            reads = [rule.expr for group in self.groups for rule in group.rules]
            prepare(backend, reads, audit=self.audit, window_s=RULE_WINDOW_S)
        except BackendError as exc:
            return f"the views rules read could not be made: {exc}"
        except Exception as exc:  # the auditor's own failure must not stop alerting: every rule reports it
            logger.debug("preparing the views", exc_info=True)
            return f"the views rules read could not be made: {type(exc).__name__}: {exc}"
        return None

    def _evaluate_rule(
        self, backend: Backend, rule: Rule, bounds: Bounds, now: float, views_error: str | None
    ) -> list[Sample] | None:
        """The rule's samples, or None when its evaluation failed (recorded in its health)."""
        health = self.health[(rule.group, rule.alert)]
        started = time.monotonic()
        try:
            if views_error is not None:
                raise EvaluationError(views_error)
            samples = evaluate_rule(backend, rule, bounds)
        except (BackendError, EvaluationError) as exc:
            error = " ".join(str(exc).split())
        except Exception as exc:  # a rule must not take the others down, whatever it hit
            logger.debug("%s:%d: alert %s", rule.file, rule.line, rule.alert, exc_info=True)
            error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        else:
            error = None
        health.duration_s = time.monotonic() - started
        health.last_evaluation = now
        health.evaluations += 1
        if error is None:
            health.health, health.last_error = Health.OK, ""
            return samples
        if health.last_error != error:
            logger.warning("%s:%d: alert %s: %s", rule.file, rule.line, rule.alert, error)
        health.health, health.last_error = Health.ERR, error
        health.failures += 1
        return None

    def save(self) -> None:
        """Write the state file (notifiers' deliveries are part of it).

        A failed write (a full disk, a read-only directory) is a warning, once until a
        write works again: the alerts stay in memory, and notification goes on.
        """
        if self.state_path is None:
            return
        try:
            save_state(self.state_path, list(self._alerts.values()))
        except OSError as exc:
            error = str(exc.strerror or exc)
            if error != self._save_error:
                logger.warning("%s: alert state not saved (%s); kept in memory, retrying", self.state_path, error)
            self._save_error = error
        else:
            if self._save_error is not None:
                logger.warning("%s: alert state saved again", self.state_path)
            self._save_error = None

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
                    # Where a reader goes for more, and which rule: never a path inside the install.
                    generator_url=f"{self.external_url}#{quote(rule.alert)}",
                )
                self._alerts[key] = alert
            alert.value = sample.value
            alert.annotations = {k: t.render(sample.labels, sample.value) for k, t in rule.annotations.items()}
            alert.annotations |= sample.annotations
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
