"""Alert instances: what the engine tracks per label set, and what notifiers send."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

import msgspec

# FNV-1a, 64 bits, and the byte between label names and values that UTF-8 never contains:
# the constants of the Prometheus model's label-set fingerprint, which Alertmanager uses.
_FNV_OFFSET: Final = 14695981039346656037
_FNV_PRIME: Final = 1099511628211
_SEPARATOR: Final = 0xFF
_MASK: Final = 2**64 - 1


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
    """The label set's identity exactly as Alertmanager computes it (`model.LabelSet.Fingerprint`),
    as 16 hex digits: a receiver fed by kvaudit and by Alertmanager deduplicates across both.

    FNV-1a 64 over each label, in the order of the names' bytes: name, 0xFF, value, 0xFF.
    """
    value = _FNV_OFFSET
    for name in sorted(labels):  # code point order is the order of the UTF-8 bytes
        for part in (name, labels[name]):
            for byte in (*part.encode("utf-8", "surrogatepass"), _SEPARATOR):
                value = ((value ^ byte) * _FNV_PRIME) & _MASK
    return f"{value:016x}"
