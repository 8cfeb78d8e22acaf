"""Alert instances: what the engine tracks per label set, and what notifiers send."""

from __future__ import annotations

import hashlib
from enum import StrEnum

import msgspec


class AlertState(StrEnum):
    """Prometheus' alert states; an inactive alert is simply not tracked."""

    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


class Delivery(msgspec.Struct, frozen=True):
    """The last state one notifier was told about, and when."""

    state: AlertState
    at: float


class AlertInstance(msgspec.Struct, kw_only=True):
    """One alert of one rule for one label set.

    Times are Unix seconds. `active_since` is when the condition was first seen
    (Prometheus' ActiveAt); `keep_firing_since` when a firing alert's condition
    stopped holding while `keep_firing_for` still keeps it firing.
    """

    group: str
    alertname: str
    labels: dict[str, str]
    annotations: dict[str, str]
    value: float | None
    state: AlertState
    active_since: float
    last_seen: float
    fired_at: float | None = None
    resolved_at: float | None = None
    keep_firing_since: float | None = None
    generator_url: str = ""
    notified: dict[str, Delivery] = msgspec.field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.labels)

    @property
    def severity(self) -> str | None:
        return self.labels.get("severity")


def fingerprint(labels: dict[str, str]) -> str:
    """A stable 16-hex-digit identity of a label set (Alertmanager shows one per alert)."""
    encoded = msgspec.json.encode(sorted(labels.items()))
    return hashlib.sha256(encoded).hexdigest()[:16]
