"""Deciding what each notifier must hear, and counting what it could not be told.

Each alert records, per notifier, the last state that notifier acknowledged. An alert
is due for a notifier when its state differs from that (it fired, or resolved), or
when the notifier wants unchanged alerts re-sent and its resend interval has passed.
A failed delivery leaves the record as it was, so the alert stays due and is tried
again at the next evaluation: nothing firing is dropped, and the failure is counted.
Delivery is at least once: a batch that failed halfway is sent whole again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from kvaudit.alerts.http import DeliveryError
from kvaudit.alerts.instances import AlertInstance, AlertState, Delivery
from kvaudit.alerts.notifiers import Notifier

logger = logging.getLogger(__name__)


@dataclass
class DeliveryStats:
    """Per notifier: alerts delivered, alerts in failed deliveries (cumulative), alerts still owed."""

    delivered: int = 0
    failed: int = 0
    undelivered: int = 0


class Dispatcher:
    def __init__(self, notifiers: Sequence[Notifier]) -> None:
        self.notifiers = list(notifiers)
        self.stats = {n.name: DeliveryStats() for n in self.notifiers}

    def dispatch(self, alerts: Sequence[AlertInstance], now: float) -> None:
        """Send each notifier what is due for it; never raises for a failed delivery."""
        for notifier in self.notifiers:
            stats = self.stats[notifier.name]
            due = [a for a in alerts if _is_due(a, notifier, now)]
            if due:
                try:
                    notifier.send(due, now)
                except DeliveryError as exc:
                    stats.failed += len(due)
                    logger.warning(
                        "%s: %d alerts not delivered, retrying next evaluation: %s", notifier.name, len(due), exc
                    )
                else:
                    stats.delivered += len(due)
                    for alert in due:
                        alert.notified[notifier.name] = Delivery(alert.state, now)
            stats.undelivered = sum(_is_due(a, notifier, now) for a in alerts)


def _is_due(alert: AlertInstance, notifier: Notifier, now: float) -> bool:
    if alert.state is AlertState.PENDING:
        return False
    last = alert.notified.get(notifier.name)
    if last is None:
        # A resolution is news only to whoever heard that the alert fired.
        return alert.state is AlertState.FIRING
    if last.state is not alert.state:
        return True
    return notifier.resend_s is not None and now - last.at >= notifier.resend_s
