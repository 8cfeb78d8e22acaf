"""The rule engine's own health for Prometheus: what `kvaudit alerts watch --metrics` serves on /metrics.

The series follow Prometheus' own about its rule manager and notifier
(`prometheus_rule_evaluation_failures_total`, `prometheus_notifications_errors_total`,
...), so the same dashboards and meta-alerts carry over:

- `kvaudit_rule_health{rule_group, rule}`: 1 when the rule's last evaluation worked,
  0 when it failed or timed out (absent before its first evaluation);
- `kvaudit_rule_evaluations_total`, `kvaudit_rule_evaluation_failures_total`,
  `kvaudit_rule_evaluation_duration_seconds` (the last one) and
  `kvaudit_rule_last_evaluation_timestamp_seconds`, per rule;
- `kvaudit_alerts{alertname, state}`: the alerts the engine tracks;
- `kvaudit_notifications_sent_total`, `kvaudit_notifications_errors_total` (alerts
  in failed deliveries) and `kvaudit_notifications_undelivered` (alerts due and not
  acknowledged), per notifier.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvaudit.alerts.dispatch import Dispatcher
from kvaudit.alerts.engine import RuleEngine
from kvaudit.alerts.rule_health import Health

_RULE: tuple[str, str] = ("rule_group", "rule")


class RuleMetrics(Collector):
    """A prometheus_client collector over a rule engine and its dispatcher (read as they are at each scrape)."""

    def __init__(self, engine: RuleEngine, dispatcher: Dispatcher) -> None:
        self.engine = engine
        self.dispatcher = dispatcher

    def collect(self) -> Iterator[Metric]:
        health = GaugeMetricFamily("kvaudit_rule_health", "1: the last evaluation worked; 0: it failed", labels=_RULE)
        evaluations = CounterMetricFamily("kvaudit_rule_evaluations", "Evaluations of the rule", labels=_RULE)
        failures = CounterMetricFamily("kvaudit_rule_evaluation_failures", "Failed evaluations", labels=_RULE)
        duration = GaugeMetricFamily(
            "kvaudit_rule_evaluation_duration_seconds", "How long the rule's last evaluation took", labels=_RULE
        )
        last = GaugeMetricFamily(
            "kvaudit_rule_last_evaluation_timestamp_seconds", "When the rule was last evaluated", labels=_RULE
        )
        for rule in list(self.engine.health.values()):
            names = [rule.group, rule.alert]
            evaluations.add_metric(names, rule.evaluations)
            failures.add_metric(names, rule.failures)
            if rule.health is not Health.UNKNOWN:
                health.add_metric(names, 1.0 if rule.health is Health.OK else 0.0)
                duration.add_metric(names, rule.duration_s)
            if rule.last_evaluation is not None:
                last.add_metric(names, rule.last_evaluation)
        yield from (health, evaluations, failures, duration, last)
        alerts = GaugeMetricFamily("kvaudit_alerts", "Alerts tracked, by name and state", labels=["alertname", "state"])
        for (name, state), count in sorted(Counter((a.alertname, a.state.value) for a in self.engine.alerts).items()):
            alerts.add_metric([name, state], count)
        yield alerts
        yield from self._notifications()

    def _notifications(self) -> Iterator[Metric]:
        sent = CounterMetricFamily("kvaudit_notifications_sent", "Alerts delivered", labels=["notifier"])
        errors = CounterMetricFamily("kvaudit_notifications_errors", "Alerts in failed deliveries", labels=["notifier"])
        owed = GaugeMetricFamily("kvaudit_notifications_undelivered", "Alerts due, not delivered", labels=["notifier"])
        for name, stats in self.dispatcher.stats.items():
            sent.add_metric([name], stats.delivered)
            errors.add_metric([name], stats.failed)
            owed.add_metric([name], stats.undelivered)
        yield from (sent, errors, owed)
