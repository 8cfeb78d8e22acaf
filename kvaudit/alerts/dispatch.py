"""Deciding what each notifier must hear, and sending it apart from evaluation.

Each alert records, per notifier, the last state that notifier acknowledged. An alert
is due for a notifier when its state differs from that (it fired, or resolved), or
when the notifier wants unchanged alerts re-sent and its resend interval has passed.

As in Prometheus' notifier, delivery is queued and sent by a thread of its own, one
per notifier, in batches of at most `BATCH_SIZE` alerts: evaluation only puts what is
due in the notifier's outbox, so a receiver that hangs or refuses delays nothing but
its own deliveries, and never another notifier's. A delivered batch is acknowledged
back to the alerts at the next `dispatch` (or `acknowledge`), and so reaches the state
file. A failed batch is counted and dropped from the outbox with everything queued
behind it: those alerts are still due, and are offered again at the next evaluation,
so a receiver that is down costs one batch's retries per evaluation, and nothing
firing is lost. Delivery is at least once: a batch that failed halfway is sent whole
again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from kvaudit.alerts.http import DeliveryError
from kvaudit.alerts.instances import AlertInstance, AlertState, Delivery
from kvaudit.alerts.notifiers import Notifier

logger = logging.getLogger(__name__)

# Alerts per delivery: Prometheus sends Alertmanager batches of 64 (its maxBatchSize).
BATCH_SIZE: Final = 64

_Key = tuple[str, str]  # an alert's group and fingerprint


@dataclass
class DeliveryStats:
    """Per notifier: alerts delivered and alerts in failed deliveries (both cumulative); alerts
    due and not acknowledged at the last `dispatch` or `acknowledge`; the last delivery's error."""

    delivered: int = 0
    failed: int = 0
    undelivered: int = 0
    last_error: str | None = None  # None once a delivery works


def _key(alert: AlertInstance) -> _Key:
    return alert.group, alert.fingerprint


class _Outbox:
    """One notifier's queue of due alerts and the thread that sends them."""

    def __init__(self, notifier: Notifier, batch_size: int) -> None:
        self.notifier = notifier
        self.stats = DeliveryStats()
        self._batch_size = batch_size
        self._changed = threading.Condition()
        # Newest copy of each queued alert, in the order offered, with the evaluation time it was due at.
        self._queue: dict[_Key, tuple[AlertInstance, float]] = {}
        self._sending: dict[_Key, AlertState] = {}
        self._acknowledged: list[tuple[_Key, Delivery]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"kvaudit-notify {notifier.name}", daemon=True)
        self._thread.start()

    def offer(self, alerts: Sequence[AlertInstance], now: float) -> None:
        """Queue copies of `alerts` (an alert queued already is replaced by its newer copy)."""
        with self._changed:
            for alert in alerts:
                if self._sending.get(_key(alert)) is alert.state:
                    continue  # on its way already: its acknowledgement will come
                # A copy: evaluation goes on changing the alert while this thread sends it.
                self._queue[_key(alert)] = (msgspec.structs.replace(alert), now)
            self._changed.notify()

    def take_acknowledged(self) -> list[tuple[_Key, Delivery]]:
        with self._changed:
            acknowledged, self._acknowledged = self._acknowledged, []
            return acknowledged

    def idle(self) -> bool:
        with self._changed:
            return not self._queue and not self._sending

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                batch = [self._queue.pop(key) for key in list(self._queue)[: self._batch_size]]
                self._sending = {_key(alert): alert.state for alert, _ in batch}
            now = max(due for _, due in batch)
            try:
                self.notifier.send([alert for alert, _ in batch], now)
            except Exception as exc:  # DeliveryError; anything else is a notifier's bug, and must not end this thread
                error = str(exc) if isinstance(exc, DeliveryError) else f"{type(exc).__name__}: {exc}"
                if not isinstance(exc, DeliveryError):
                    logger.debug("%s: sending", self.notifier.name, exc_info=True)
                with self._changed:
                    # Logged before the outbox shows idle: whoever waits for it sees the warning too.
                    logger.warning(
                        "%s: %d alerts not delivered (%d more queued behind them), retrying next evaluation: %s",
                        self.notifier.name,
                        len(batch),
                        len(self._queue),
                        error,
                    )
                    self._queue.clear()  # still due: offered again at the next evaluation
                    self._sending = {}
                    self.stats.failed += len(batch)
                    self.stats.last_error = error
                    self._changed.notify_all()
            else:
                with self._changed:
                    self._acknowledged += [(_key(alert), Delivery(alert.state, due)) for alert, due in batch]
                    self._sending = {}
                    self.stats.delivered += len(batch)
                    self.stats.last_error = None
                    self._changed.notify_all()

    def wait_idle(self, deadline: float) -> bool:
        with self._changed:
            while self._queue or self._sending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True


class Dispatcher:
    """Sends each notifier what is due for it, on the notifier's own thread.

    Args:
        notifiers: where alerts go.
        batch_size: the most alerts per delivery.
    """

    def __init__(self, notifiers: Sequence[Notifier], *, batch_size: int = BATCH_SIZE) -> None:
        self.notifiers = list(notifiers)
        self._outboxes = {n.name: _Outbox(n, batch_size) for n in self.notifiers}
        self._now = 0.0  # the last dispatch's evaluation time

    @property
    def stats(self) -> dict[str, DeliveryStats]:
        return {name: outbox.stats for name, outbox in self._outboxes.items()}

    def dispatch(self, alerts: Sequence[AlertInstance], now: float) -> None:
        """Record what was delivered since the last call, and queue what is due now; never blocks on a notifier."""
        self._now = now
        for outbox, due in self._acknowledge(alerts):
            if due:
                outbox.offer(due, now)

    def acknowledge(self, alerts: Sequence[AlertInstance]) -> None:
        """Mark the alerts with the deliveries that succeeded since the last call (for the state file)."""
        self._acknowledge(alerts)

    def _acknowledge(self, alerts: Sequence[AlertInstance]) -> list[tuple[_Outbox, list[AlertInstance]]]:
        """Record deliveries on the alerts; each outbox with what is still due for it."""
        by_key = {_key(a): a for a in alerts}
        owed = []
        for name, outbox in self._outboxes.items():
            for key, delivery in outbox.take_acknowledged():
                alert = by_key.get(key)
                if alert is not None:
                    alert.notified[name] = delivery
            due = [a for a in alerts if _is_due(a, outbox.notifier, self._now)]
            outbox.stats.undelivered = len(due)
            owed.append((outbox, due))
        return owed

    def flush(self, timeout_s: float) -> bool:
        """Wait until every outbox is sent or given up (at most `timeout_s`); whether all of them were."""
        deadline = time.monotonic() + timeout_s
        return all([outbox.wait_idle(deadline) for outbox in self._outboxes.values()])

    def close(self) -> None:
        """Stop the sending threads (what is still queued is not sent)."""
        for outbox in self._outboxes.values():
            outbox.close()


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
