"""Notifications to a real local HTTP server (webhook v4, Alertmanager API), a file and stdout;
an unreachable endpoint costs retries and a counted failure, never a crash or a lost alert."""

from __future__ import annotations

import io
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kvaudit.alerts.dispatch import Dispatcher
from kvaudit.alerts.http import DeliveryError, HttpPoster
from kvaudit.alerts.instances import AlertInstance, AlertState
from kvaudit.alerts.notifiers import (
    AlertmanagerNotifier,
    JsonLinesNotifier,
    StreamNotifier,
    WebhookNotifier,
    parse_notifier,
)

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class Receiver(ThreadingHTTPServer):
    """Records every POST; answers with the queued statuses first, then 200."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.posts: list[tuple[str, Any]] = []
        self.statuses: list[int] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        status = self.server.statuses.pop(0) if self.server.statuses else 200
        if status == 200:
            self.server.posts.append((self.path, body))
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _alert(replica: str, state: AlertState = AlertState.FIRING) -> AlertInstance:
    alertname = "KVAuditCriticalFinding"
    return AlertInstance(
        group="kvaudit",
        alertname=alertname,
        labels={"alertname": alertname, "replica": replica, "severity": "critical"},
        annotations={"summary": f"{replica} used 3 malformed KV pages", "runbook": "page now"},
        value=3.0,
        state=state,
        active_since=T0,
        last_seen=T0 + 60,
        fired_at=T0 + 30,
        resolved_at=T0 + 120 if state is AlertState.RESOLVED else None,
        generator_url="file:///etc/kvaudit/rules.yaml#L12",
    )


FAST = HttpPoster(timeout_s=2, retries=2, backoff_s=0.001)


def test_webhook_payload_version_4(receiver: Receiver):
    WebhookNotifier(receiver.url + "/hook", FAST).send([_alert("r1"), _alert("r2", AlertState.RESOLVED)], T0 + 120)
    [(path, payload)] = receiver.posts
    assert path == "/hook"
    assert payload["version"] == "4" and payload["status"] == "firing" and payload["receiver"] == "kvaudit"
    assert payload["groupKey"] == '{}:{alertname="KVAuditCriticalFinding"}'
    assert payload["groupLabels"] == {"alertname": "KVAuditCriticalFinding"}
    assert payload["commonLabels"] == {"alertname": "KVAuditCriticalFinding", "severity": "critical"}
    assert payload["commonAnnotations"] == {"runbook": "page now"}
    assert payload["truncatedAlerts"] == 0 and "externalURL" in payload
    firing, resolved = payload["alerts"]
    assert firing["status"] == "firing" and firing["endsAt"] == "0001-01-01T00:00:00Z"
    assert firing["startsAt"] == "2026-01-01T00:00:30.000Z" and firing["labels"]["replica"] == "r1"
    assert resolved["status"] == "resolved" and resolved["endsAt"] == "2026-01-01T00:02:00.000Z"
    assert len(firing["fingerprint"]) == 16 and firing["generatorURL"] == "file:///etc/kvaudit/rules.yaml#L12"


def test_alertmanager_api_v2(receiver: Receiver):
    notifier = AlertmanagerNotifier(receiver.url, FAST)
    notifier.send([_alert("r1"), _alert("r2", AlertState.RESOLVED)], T0 + 120)
    [(path, alerts)] = receiver.posts
    assert path == "/api/v2/alerts"
    firing, resolved = alerts
    assert set(firing) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
    assert firing["startsAt"] == "2026-01-01T00:00:30.000Z"
    assert firing["endsAt"] == "2026-01-01T00:06:00.000Z"  # a lease of 4 resends past now
    assert resolved["endsAt"] == "2026-01-01T00:02:00.000Z"


def test_retries_with_backoff_then_delivers(receiver: Receiver):
    waits: list[float] = []
    receiver.statuses = [503, 429]
    HttpPoster(retries=3, backoff_s=0.01, sleep=waits.append).post(receiver.url, {"x": 1})
    assert waits == [0.01, 0.02] and receiver.posts == [("/", {"x": 1})]
    receiver.statuses = [400]
    with pytest.raises(DeliveryError, match="HTTP 400"):
        HttpPoster(retries=3, sleep=waits.append).post(receiver.url, {})  # refused: not retried
    assert len(waits) == 2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_endpoint_is_retried_counted_and_kept_due(receiver: Receiver, caplog: pytest.LogCaptureFixture):
    waits: list[float] = []
    dead = HttpPoster(timeout_s=1, retries=2, backoff_s=0.001, sleep=waits.append)
    webhook = WebhookNotifier(f"http://127.0.0.1:{_closed_port()}/hook", dead)
    stdout = StreamNotifier(io.StringIO())
    dispatcher = Dispatcher([webhook, stdout])
    alerts = [_alert("r1"), _alert("r2")]
    dispatcher.dispatch(alerts, T0 + 60)  # must not raise
    _delivered(dispatcher, alerts)
    assert waits == [0.001, 0.002]
    assert dispatcher.stats[webhook.name].failed == 2 and dispatcher.stats[webhook.name].undelivered == 2
    assert "not delivered" in caplog.text
    assert dispatcher.stats["stdout"].delivered == 2  # other notifiers are not held up
    dispatcher.dispatch(alerts, T0 + 75)  # tried again: nothing is dropped
    _delivered(dispatcher, alerts)
    assert dispatcher.stats[webhook.name].failed == 4
    webhook.url = receiver.url + "/hook"  # the endpoint comes back
    dispatcher.dispatch(alerts, T0 + 90)
    _delivered(dispatcher, alerts)
    assert dispatcher.stats[webhook.name].undelivered == 0 and len(receiver.posts) == 1
    assert stdout.stream.getvalue().count("FIRING") == 2  # stdout heard it once


def test_dispatch_sends_changes_once_and_resends_to_alertmanager(receiver: Receiver):
    am = AlertmanagerNotifier(receiver.url, FAST)
    hook = WebhookNotifier(receiver.url + "/hook", FAST)
    dispatcher = Dispatcher([am, hook])
    alert = _alert("r1")
    pending = _alert("r2", AlertState.PENDING)

    def dispatch(alerts: list[AlertInstance], now: float) -> list[str]:
        dispatcher.dispatch(alerts, now)
        _delivered(dispatcher, alerts)
        return sorted(path for path, _ in receiver.posts)

    assert dispatch([alert, pending], T0 + 30) == ["/api/v2/alerts", "/hook"]
    assert len(dispatch([alert, pending], T0 + 60)) == 2  # nothing new; not yet time to resend
    assert dispatch([alert], T0 + 90) == ["/api/v2/alerts"] * 2 + ["/hook"]  # the lease needs renewing
    alert.state, alert.resolved_at = AlertState.RESOLVED, T0 + 100
    assert dispatch([alert], T0 + 100) == ["/api/v2/alerts"] * 3 + ["/hook"] * 2
    assert all(body["status"] == "resolved" for path, body in receiver.posts[-2:] if path == "/hook")
    never_told = _alert("r3", AlertState.RESOLVED)
    assert len(dispatch([never_told], T0 + 101)) == 5  # a resolution nobody heard fire is not news


def _delivered(dispatcher: Dispatcher, alerts: list[AlertInstance]) -> None:
    """Wait for the notifiers' threads to send what was queued, and record it on the alerts."""
    assert dispatcher.flush(timeout_s=30)
    dispatcher.acknowledge(alerts)


def test_json_lines_file_and_stdout(tmp_path: Path):
    path = tmp_path / "out" / "alerts.jsonl"
    notifier = parse_notifier(f"file:{path}", FAST)
    notifier.send([_alert("r1")], T0)
    notifier.send([_alert("r1", AlertState.RESOLVED)], T0 + 120)
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert (first["status"], second["status"], first["value"]) == ("firing", "resolved", "3")
    stream = io.StringIO()
    StreamNotifier(stream).send([_alert("r1")], T0)
    assert stream.getvalue() == (
        'FIRING KVAuditCriticalFinding{replica="r1",severity="critical"} value=3 r1 used 3 malformed KV pages\n'
    )
    with pytest.raises(DeliveryError):
        JsonLinesNotifier(tmp_path).send([_alert("r1")], T0)  # a directory cannot be appended to
    with pytest.raises(ValueError, match="bad notifier"):
        parse_notifier("pagerduty:x", FAST)
