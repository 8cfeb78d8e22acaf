"""Where notifications go: stdout, a JSON lines file, a webhook, Alertmanager's API.

A notifier's `send` delivers a batch or raises `DeliveryError`; deciding what to send
and counting what could not be delivered is `dispatch`'s job.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol, TextIO

from kvaudit.alerts.http import DeliveryError, HttpPoster
from kvaudit.alerts.instances import AlertInstance
from kvaudit.alerts.labels import ALERTNAME
from kvaudit.alerts.payloads import DEFAULT_GROUP_BY, GroupBy, api_alert, webhook_alert, webhook_payloads
from kvaudit.alerts.templates import format_value
from kvaudit.errors import BadValueError
from kvaudit.safe_text import visible

RECEIVER: Final = "kvaudit"
API_PATH: Final = "/api/v2/alerts"
# Alertmanager forgets an alert that is not re-sent before its endsAt: re-send every
# minute, with a lease of four times that (Prometheus' own resend delay and lease).
AM_RESEND_S: Final = 60.0
AM_LEASE_FACTOR: Final = 4


class Notifier(Protocol):
    """Delivers alerts. `resend_s`: also re-send unchanged alerts this often (None: only changes)."""

    name: str
    resend_s: float | None

    def send(self, alerts: Sequence[AlertInstance], now: float) -> None:
        """Raises DeliveryError when the batch did not get through."""


@dataclass
class StreamNotifier:
    """One readable line per alert, e.g. on stdout; control characters in labels and annotations
    (which come from traces) are written as escapes (`kvaudit.safe_text`)."""

    stream: TextIO = field(default_factory=lambda: sys.stdout)
    name: str = "stdout"
    resend_s: float | None = None

    def send(self, alerts: Sequence[AlertInstance], now: float) -> None:
        lines = []
        for alert in alerts:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(alert.labels.items()) if k != ALERTNAME)
            value = "" if alert.value is None else f" value={format_value(alert.value)}"
            summary = alert.annotations.get("summary", "")
            line = f"{alert.state.upper()} {alert.alertname}{{{labels}}}{value} {summary}".rstrip()
            lines.append(visible(line) + "\n")
        try:
            self.stream.write("".join(lines))
            self.stream.flush()
        except OSError as exc:  # a closed pipe, a full disk
            raise DeliveryError(f"{self.name}: {exc.strerror or exc}") from None


@dataclass
class JsonLinesNotifier:
    """One JSON object per alert per line (the webhook's alert object), appended to a file."""

    path: Path
    name: str = ""
    resend_s: float | None = None

    def __post_init__(self) -> None:
        self.name = self.name or f"file:{self.path}"

    def send(self, alerts: Sequence[AlertInstance], now: float) -> None:
        text = "".join(json.dumps(webhook_alert(a)) + "\n" for a in alerts)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as out:
                out.write(text)
        except OSError as exc:
            raise DeliveryError(f"{self.path}: {exc.strerror or exc}") from None


@dataclass
class WebhookNotifier:
    """Alertmanager's webhook payload (version 4) to any URL, one POST per group of `group_by`.

    `external_url` is the payload's `externalURL`: where a person reading the notification
    goes for more (Alertmanager links back to itself; kvaudit has no UI of its own to link).
    """

    url: str
    http: HttpPoster = field(default_factory=HttpPoster)
    external_url: str = ""
    group_by: GroupBy = DEFAULT_GROUP_BY
    name: str = ""
    resend_s: float | None = None

    def __post_init__(self) -> None:
        self.name = self.name or f"webhook:{self.url}"

    def send(self, alerts: Sequence[AlertInstance], now: float) -> None:
        for payload in webhook_payloads(alerts, RECEIVER, self.external_url, self.group_by):
            self.http.post(self.url, payload)


@dataclass
class AlertmanagerNotifier:
    """Alertmanager's own API: `POST /api/v2/alerts`, re-sent while firing so its lease never runs out."""

    url: str
    http: HttpPoster = field(default_factory=HttpPoster)
    name: str = ""
    resend_s: float | None = AM_RESEND_S

    def __post_init__(self) -> None:
        base = self.url.rstrip("/")
        self.url = base if base.endswith(API_PATH) else base + API_PATH
        self.name = self.name or f"alertmanager:{self.url}"

    def send(self, alerts: Sequence[AlertInstance], now: float) -> None:
        lease = now + AM_LEASE_FACTOR * (self.resend_s or AM_RESEND_S)
        self.http.post(self.url, [api_alert(a, lease) for a in alerts])


def parse_notifier(
    spec: str, http: HttpPoster, *, external_url: str = "", group_by: GroupBy = DEFAULT_GROUP_BY
) -> Notifier:
    """`stdout`, `file:PATH`, `webhook:URL` or `alertmanager:URL`; a webhook's payloads carry
    `external_url` and group alerts by `group_by`.

    Raises:
        BadValueError: an unknown kind.
    """
    kind, _, target = spec.partition(":")
    if spec == "stdout":
        return StreamNotifier()
    if kind == "file" and target:
        return JsonLinesNotifier(Path(target))
    if kind == "webhook" and target:
        return WebhookNotifier(target, http, external_url, group_by)
    if kind == "alertmanager" and target:
        return AlertmanagerNotifier(target, http)
    raise BadValueError(f"bad notifier {spec!r}: expected stdout, file:PATH, webhook:URL or alertmanager:URL")
