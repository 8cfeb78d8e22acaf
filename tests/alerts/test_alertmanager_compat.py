"""Webhook payloads a receiver can put beside Alertmanager's own: the same fingerprints, the
same grouping (`--group-by`), and an `externalURL` from `--external-url`.

The fingerprints are checked two ways, neither of them kvaudit's code: values the Prometheus
model's own tests publish for `labelSetToFingerprint` (which Alertmanager's alert
fingerprint is), and the algorithm written out here again, over the label pairs' bytes.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from kvaudit.alerts.instances import AlertInstance, AlertState, fingerprint
from kvaudit.alerts.payloads import webhook_alert, webhook_payloads
from kvaudit.cli import main

from ..support import alert_traces
from ..support.servers import RecordingServer

T0 = 1_767_225_600.0

# prometheus/common model/signature_test.go: TestMetricToFingerprint and the fingerprint benchmarks.
PUBLISHED = [
    ({}, 14695981039346656037),
    ({"name": "garland, briggs", "fear": "love is not enough"}, 5799056148416392346),
    ({"first-label": "first-label-value"}, 5146282821936882169),
    ({"first-label": "first-label-value", "second-label": "second-label-value"}, 3195800080984914717),
    (
        {"first-label": "first-label-value", "second-label": "second-label-value", "third-label": "third-label-value"},
        13843036195897128121,
    ),
]


def alertmanager_fingerprint(labels: dict[str, str]) -> str:
    """FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3) over, for each label by
    name, the name's bytes, 0xFF, the value's bytes, 0xFF; printed as `%016x`."""
    data = b"".join(
        name.encode() + b"\xff" + labels[name].encode() + b"\xff" for name in sorted(labels, key=str.encode)
    )
    value = functools.reduce(lambda h, byte: ((h ^ byte) * 0x100000001B3) % 2**64, data, 0xCBF29CE484222325)
    return format(value, "016x")


@pytest.mark.parametrize(("labels", "published"), PUBLISHED)
def test_fingerprint_is_alertmanagers_on_published_values(labels: dict[str, str], published: int):
    assert fingerprint(labels) == alertmanager_fingerprint(labels) == format(published, "016x")


@pytest.mark.parametrize(
    "labels",
    [
        {"alertname": "KVAuditCriticalFinding", "replica": "r1", "severity": "critical"},
        {"alertname": "KVAuditCriticalFinding", "replica": "r2", "severity": "critical"},
        {"alertname": "A", "model": "google/gemma-3-1b-it", "layout": "NB_2_BS_NH_HS"},
        {"alertname": "A", "replica": "", "empty": ""},
        {"alertname": "A", "ключ": "значение", "Z": "日本語", "a": "é"},  # non-ASCII names sort by their bytes
        {"alertname": 'quote " and = and , and }', "x": "\x00\x1b[31m"},
    ],
)
def test_fingerprint_is_alertmanagers(labels: dict[str, str]):
    assert fingerprint(labels) == alertmanager_fingerprint(labels)
    assert webhook_alert(_alert(labels))["fingerprint"] == fingerprint(labels)


def test_fingerprint_tells_label_sets_apart():
    # The separator keeps a name's end from running into its value.
    assert fingerprint({"ab": "c"}) != fingerprint({"a": "bc"})
    assert fingerprint({"a": "b", "c": "d"}) == fingerprint({"c": "d", "a": "b"})


def _alert(labels: dict[str, str], state: AlertState = AlertState.FIRING) -> AlertInstance:
    return AlertInstance(
        group="g", alertname=labels.get("alertname", "A"), labels=labels, annotations={}, value=1.0,
        state=state, active_since=T0, last_seen=T0, fired_at=T0,
    )  # fmt: skip


def _alerts() -> list[AlertInstance]:
    return [
        _alert({"alertname": "Hot", "replica": "r1", "severity": "critical"}),
        _alert({"alertname": "Hot", "replica": "r2", "severity": "critical"}),
        _alert({"alertname": "Cold", "replica": "r1", "severity": "warning"}),
        _alert({"alertname": "Cold", "severity": "warning"}),  # no replica label
    ]


def test_webhook_groups_as_alertmanager_groups():
    by_name = webhook_payloads(_alerts(), "kvaudit", "")
    assert [p["groupKey"] for p in by_name] == ['{}:{alertname="Cold"}', '{}:{alertname="Hot"}']

    by_replica = webhook_payloads(_alerts(), "kvaudit", "", ("alertname", "replica"))
    assert [(p["groupKey"], len(p["alerts"])) for p in by_replica] == [
        ('{}:{alertname="Cold"}', 1),  # an alert without a grouping label groups without it
        ('{}:{alertname="Cold", replica="r1"}', 1),
        ('{}:{alertname="Hot", replica="r1"}', 1),
        ('{}:{alertname="Hot", replica="r2"}', 1),
    ]
    assert by_replica[3]["groupLabels"] == {"alertname": "Hot", "replica": "r2"}
    assert by_replica[3]["commonLabels"] == {"alertname": "Hot", "replica": "r2", "severity": "critical"}

    [everything] = webhook_payloads(_alerts(), "kvaudit", "", ())
    assert everything["groupKey"] == "{}:{}" and everything["groupLabels"] == {} and len(everything["alerts"]) == 4
    assert everything["commonLabels"] == {}

    each = webhook_payloads(_alerts(), "kvaudit", "", None)  # `...`: every label, one group per alert
    assert len(each) == 4 and all(p["groupLabels"] == p["alerts"][0]["labels"] for p in each)


def test_group_key_quotes_values_as_go_does():
    [payload] = webhook_payloads([_alert({"alertname": "A", "v": 'say "hi"\n\x01'})], "kvaudit", "", ("v",))
    assert payload["groupKey"] == '{}:{v="say \\"hi\\"\\n\\x01"}'


RULES = """\
groups:
  - name: g
    rules:
      - alert: Shard
        expr: SELECT (range % 2)::VARCHAR AS shard, range::VARCHAR AS n, 1 AS value FROM range(4)
"""


def test_watch_sends_group_by_and_external_url(trace_dir: Path, tmp_path: Path):
    alert_traces.clean(trace_dir)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    with RecordingServer() as hook:
        argv = ["alerts", "watch", str(trace_dir), "--rules", str(rules), "--state", str(tmp_path / "s.json")]
        argv += ["--once", "--notify", f"webhook:{hook.url}/hook", "--group-by", "alertname,shard"]
        assert main([*argv, "--external-url", "https://grafana.example/d/kv"]) == 0
    payloads = sorted(hook.posts, key=lambda p: p["groupKey"])
    assert [p["groupKey"] for p in payloads] == [
        '{}:{alertname="Shard", shard="0"}',
        '{}:{alertname="Shard", shard="1"}',
    ]
    assert all(p["externalURL"] == "https://grafana.example/d/kv" and len(p["alerts"]) == 2 for p in payloads)
    for body in (a for p in payloads for a in p["alerts"]):
        assert body["fingerprint"] == alertmanager_fingerprint(body["labels"])


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--group-by", "alertname,bad-name", "not a label name"),
        ("--external-url", "grafana/d/kv", "not an absolute http"),
        ("--external-url", "file:///etc/passwd", "not an absolute http"),
    ],
)
def test_bad_group_by_or_external_url_is_a_usage_error(
    trace_dir: Path, flag: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
):
    with pytest.raises(SystemExit) as exit_:
        main(["alerts", "watch", str(trace_dir), "--once", flag, value])
    assert exit_.value.code == 2 and said in capsys.readouterr().err
