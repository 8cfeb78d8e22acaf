"""Alerts in Alertmanager's formats: its API's alert objects and its webhook payload (version 4)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Final

from kvaudit.alerts.instances import AlertInstance, AlertState
from kvaudit.alerts.labels import ALERTNAME
from kvaudit.alerts.templates import format_value

# What Alertmanager's webhook puts in endsAt while an alert still fires (Go's zero time).
ZERO_TIME: Final = "0001-01-01T00:00:00Z"


def rfc3339(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def starts_at(alert: AlertInstance) -> float:
    """When the alert started firing; Prometheus sends FiredAt, or ActiveAt before that."""
    return alert.fired_at if alert.fired_at is not None else alert.active_since


def api_alert(alert: AlertInstance, valid_until: float) -> dict[str, Any]:
    """One alert of `POST /api/v2/alerts`.

    A firing alert's endsAt is a lease: Alertmanager resolves it by itself unless it
    is sent again before then, which is what protects against a dead evaluator.
    """
    ended = _ended_at(alert)
    return {
        "labels": alert.labels,
        "annotations": alert.annotations,
        "startsAt": rfc3339(starts_at(alert)),
        "endsAt": rfc3339(valid_until if ended is None else ended),
        "generatorURL": alert.generator_url,
    }


def webhook_alert(alert: AlertInstance) -> dict[str, Any]:
    """One alert of a webhook payload, with the value too (kvaudit's own addition)."""
    ended = _ended_at(alert)
    return {
        "status": "firing" if ended is None else "resolved",
        "labels": alert.labels,
        "annotations": alert.annotations,
        "startsAt": rfc3339(starts_at(alert)),
        "endsAt": ZERO_TIME if ended is None else rfc3339(ended),
        "generatorURL": alert.generator_url,
        "fingerprint": alert.fingerprint,
        "value": None if alert.value is None else format_value(alert.value),
    }


def _ended_at(alert: AlertInstance) -> float | None:
    return alert.resolved_at if alert.state is AlertState.RESOLVED else None


# A webhook groups alerts by these labels, as an Alertmanager route's `group_by`; None is
# Alertmanager's `...` (every label: one group per alert).
GroupBy = tuple[str, ...] | None
DEFAULT_GROUP_BY: Final = (ALERTNAME,)


def webhook_payloads(
    alerts: Sequence[AlertInstance], receiver: str, external_url: str, group_by: GroupBy = DEFAULT_GROUP_BY
) -> list[dict[str, Any]]:
    """Webhook payloads (version 4), one per group, as an Alertmanager route with `group_by` sends."""
    groups: dict[tuple[tuple[str, str], ...], list[AlertInstance]] = {}
    for alert in alerts:
        groups.setdefault(_group_labels(alert.labels, group_by), []).append(alert)
    payloads = []
    for labels, group in sorted(groups.items()):
        bodies = [webhook_alert(a) for a in group]
        payloads.append(
            {
                "version": "4",
                "groupKey": f"{{}}:{label_set_string(dict(labels))}",
                "truncatedAlerts": 0,
                "status": "firing" if any(b["status"] == "firing" for b in bodies) else "resolved",
                "receiver": receiver,
                "groupLabels": dict(labels),
                "commonLabels": _common([a.labels for a in group]),
                "commonAnnotations": _common([a.annotations for a in group]),
                "externalURL": external_url,
                "alerts": bodies,
            }
        )
    return payloads


def _group_labels(labels: dict[str, str], group_by: GroupBy) -> tuple[tuple[str, str], ...]:
    """The alert's values of the grouping labels; a label the alert lacks is left out, as Alertmanager does."""
    names = labels if group_by is None else group_by
    return tuple(sorted((name, labels[name]) for name in names if name in labels))


def label_set_string(labels: dict[str, str]) -> str:
    """A label set as Alertmanager writes it in a group key (`model.LabelSet.String`): `{a="1", b="2"}`."""
    return "{" + ", ".join(f"{name}={_go_quote(labels[name])}" for name in sorted(labels)) + "}"


_NAMED_ESCAPES: Final = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def _go_quote(value: str) -> str:
    """`value` in double quotes with Go's `strconv.Quote` escapes."""
    out = ['"']
    for char in value:
        code = ord(char)
        if char in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _common(mappings: list[dict[str, str]]) -> dict[str, str]:
    first, *rest = mappings
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in rest)}
