"""Alerting keeps going when its peers and its disk misbehave: a hanging Alertmanager never
holds evaluation up, deliveries go in batches of 64, a state file that cannot be read is set
aside and one that cannot be written is a warning, and the state lives in a per-user directory.

The peers are real local servers (tests/support/servers.py); the full disk is a file-size rlimit on
a real `kvaudit alerts watch` process.
"""

from __future__ import annotations

import io
import json
import os
import resource
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvaudit.alerts.dispatch import Dispatcher
from kvaudit.alerts.http import HttpPoster
from kvaudit.alerts.instances import AlertInstance, AlertState
from kvaudit.alerts.notifiers import AlertmanagerNotifier, StreamNotifier
from kvaudit.cli import main

from ..support import alert_traces
from ..support.servers import HangingServer, RecordingServer, free_port
from ..support.signals import interruptible
from ..support.waiting import HANG_S, wait_until

T0 = 1_767_225_600.0


def _firing(n: int) -> AlertInstance:
    labels = {"alertname": "Hot", "replica": f"r{n}"}
    return AlertInstance(
        group="g", alertname="Hot", labels=labels, annotations={}, value=1.0, state=AlertState.FIRING,
        active_since=T0, last_seen=T0, fired_at=T0,
    )  # fmt: skip


def test_a_hanging_alertmanager_holds_up_neither_evaluation_nor_other_notifiers():
    with HangingServer() as hanging:
        stdout = StreamNotifier(io.StringIO())
        am = AlertmanagerNotifier(hanging.url, HttpPoster(timeout_s=30, retries=3))  # 2 minutes per batch
        dispatcher = Dispatcher([am, stdout])
        alerts = [_firing(1)]
        dispatcher.dispatch(alerts, T0)  # returns at once: the POST is on the notifier's thread
        wait_until(lambda: hanging.accepted == 1, what="the Alertmanager accepted the request")  # ... where it hangs
        wait_until(lambda: "FIRING Hot" in stdout.stream.getvalue(), what="stdout heard it")  # meanwhile
        for second in range(1, 4):  # the next evaluations queue nothing twice and wait for nothing
            dispatcher.dispatch(alerts, T0 + second)
        assert hanging.accepted == 1 and dispatcher.stats[am.name].undelivered == 1
        assert not dispatcher.flush(timeout_s=0.1)
        dispatcher.close()


def test_deliveries_go_in_batches_of_64(trace_dir: Path, tmp_path: Path):
    alert_traces.clean(trace_dir)
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n  - name: g\n    limit: 200\n    rules:\n      - alert: Many\n"
        "        expr: SELECT range::VARCHAR AS n, 1 AS value FROM range(150)\n"
    )
    with RecordingServer() as am:
        argv = ["alerts", "watch", str(trace_dir), "--rules", str(rules), "--state", str(tmp_path / "s.json")]
        assert main([*argv, "--once", "--notify", f"alertmanager:{am.url}"]) == 0
    assert sorted(len(batch) for batch in am.posts) == [22, 64, 64]
    assert am.requests == ["POST /api/v2/alerts"] * 3


WATCH_RULES = """\
groups:
  - name: g
    rules:
      - alert: Critical
        expr: SELECT replica, count(*) AS value FROM findings WHERE severity = 'critical' GROUP BY replica
      - alert: Broken
        expr: SELECT replica, CAST(replica AS INTEGER) AS value FROM pages
"""


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return {}
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_watch_keeps_its_interval_against_a_hanging_alertmanager(trace_dir: Path, tmp_path: Path):
    """End to end: 5 evaluations at 1s intervals take seconds, where one POST may hang for 20."""
    alert_traces.used_malformed_page(trace_dir)
    rules = tmp_path / "rules.yaml"
    rules.write_text(WATCH_RULES)
    port = free_port()
    with HangingServer() as hanging:
        command = [sys.executable, "-m", "kvaudit", "alerts", "watch", str(trace_dir), "--rules", str(rules)]
        command += ["--interval", "1s", "--timeout", "10s", "--retries", "1", "--notify", f"alertmanager:{hanging.url}"]
        command += ["--state", str(tmp_path / "state.json"), "--metrics", f"127.0.0.1:{port}"]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible
        )
        try:
            critical = ("kvaudit_rule_evaluations_total", (("rule", "Critical"), ("rule_group", "g")))
            wait_until(lambda: _scrape(port).get(critical, 0) >= 5, what="five evaluations scraped")
            metrics = _scrape(port)
            assert hanging.accepted >= 1  # the first POST is still hanging
            assert metrics[("kvaudit_rule_health", (("rule", "Critical"), ("rule_group", "g")))] == 1
            assert metrics[("kvaudit_rule_health", (("rule", "Broken"), ("rule_group", "g")))] == 0
            assert metrics[("kvaudit_alerts", (("alertname", "KVAuditRuleFailing"), ("state", "firing")))] == 1
        finally:
            process.send_signal(signal.SIGINT)
            # Bounded by --rule-timeout and --timeout (docs/operations.md); the wait only bounds a hang.
            _, err = process.communicate(timeout=HANG_S)
    assert process.returncode == 130
    assert "kvaudit alerts: 2 firing, 0 pending; failing rules: g/Broken" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "damage",
    [b'{"version": 1, "alerts": [{"group": "g"', b"\x00\xffgarbage", b'{"version": 99, "alerts": []}', b""],
    ids=["truncated", "garbage", "other-version", "empty"],
)
def test_a_bad_state_file_is_set_aside_and_alerting_starts_afresh(
    trace_dir: Path, tmp_path: Path, damage: bytes, caplog: pytest.LogCaptureFixture
):
    alert_traces.used_malformed_page(trace_dir)
    state = tmp_path / "state.json"
    state.write_bytes(damage)
    out = tmp_path / "notified.jsonl"
    argv = ["alerts", "watch", str(trace_dir), "--state", str(state), "--once", "--notify", f"file:{out}"]
    assert main(argv) == 0
    [aside] = tmp_path.glob("state.json.bad-*")
    assert aside.read_bytes() == damage  # kept for a person to look at
    assert "starting without it, the file set aside as state.json.bad-" in caplog.text
    assert json.loads(out.read_text())["labels"]["alertname"] == "KVAuditCriticalFinding"  # notified all the same
    assert json.loads(state.read_text())["version"] == 1  # and a good state file written in its place


def test_a_state_path_that_cannot_be_read_or_written_is_a_warning(
    trace_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    alert_traces.used_malformed_page(trace_dir)
    state = tmp_path / "state.json"
    state.mkdir()  # neither readable nor replaceable as a file (permissions do not stop root)
    out = tmp_path / "notified.jsonl"
    argv = ["alerts", "watch", str(trace_dir), "--state", str(state), "--once", "--notify", f"file:{out}"]
    assert main(argv) == 0
    assert "alert state not readable (Is a directory); starting without it" in caplog.text
    assert "alert state not saved (Is a directory); kept in memory, retrying" in caplog.text
    names = [json.loads(line)["labels"]["alertname"] for line in out.read_text().splitlines()]
    assert names.count("KVAuditCriticalFinding") == 1


def _full_disk() -> None:
    """In the child: any file write beyond 512 bytes fails with EFBIG, as on a full disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))


def test_a_full_disk_under_state_does_not_stop_notification(trace_dir: Path, tmp_path: Path):
    alert_traces.used_malformed_page(trace_dir)
    state = tmp_path / "state.json"
    with RecordingServer() as hook:
        command = [sys.executable, "-m", "kvaudit", "alerts", "watch", str(trace_dir), "--state", str(state)]
        command += ["--once", "--notify", f"webhook:{hook.url}/hook"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, preexec_fn=_full_disk)
    assert result.returncode == 0, result.stderr
    assert "alert state not saved (File too large); kept in memory, retrying" in result.stderr
    [payload] = hook.posts
    assert payload["alerts"][0]["labels"]["alertname"] == "KVAuditCriticalFinding"  # 1 of 1 delivered
    assert not state.exists() and list(tmp_path.glob(".state.json.*.tmp")) == []  # no half-written file left


def test_state_lives_in_the_users_state_directory(
    trace_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    alert_traces.used_malformed_page(trace_dir)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert main(["alerts", "watch", str(trace_dir), "--once"]) == 0
    assert "FIRING KVAuditCriticalFinding" in capsys.readouterr().out
    assert list(work.iterdir()) == []  # nothing in the current directory
    state = json.loads((tmp_path / "xdg" / "kvaudit" / "alerts-state.json").read_text())
    assert [a["alertname"] for a in state["alerts"]] == ["KVAuditCriticalFinding"]
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert main(["alerts", "watch", str(trace_dir), "--once"]) == 0
    assert (tmp_path / "home" / ".local" / "state" / "kvaudit" / "alerts-state.json").is_file()


def test_watch_once_gates_on_firing_when_asked(trace_dir: Path, tmp_path: Path):
    alert_traces.used_malformed_page(trace_dir)
    argv = ["alerts", "watch", str(trace_dir), "--state", str(tmp_path / "s.json"), "--once"]
    argv += ["--notify", f"file:{os.devnull}"]
    assert main(argv) == 0  # a notifier's job: done once delivered
    assert main([*argv, "--fail-on", "firing"]) == 1


class _Flaky:
    """A notifier with a bug the first time (not a DeliveryError), fine afterwards."""

    name = "flaky"
    resend_s = None

    def __init__(self) -> None:
        self.calls = 0

    def send(self, alerts: list[AlertInstance], now: float) -> None:
        self.calls += 1
        if self.calls == 1:
            raise KeyError("a bug")


def test_a_notifier_that_breaks_is_a_failed_delivery_not_a_dead_thread(caplog: pytest.LogCaptureFixture):
    flaky = _Flaky()
    closed = io.StringIO()
    closed.close()
    stdout = StreamNotifier(closed)  # a closed pipe or file
    dispatcher = Dispatcher([flaky, stdout])
    alerts = [_firing(1)]
    for now in (T0, T0 + 1):
        dispatcher.dispatch(alerts, now)
        assert dispatcher.flush(timeout_s=30)
        dispatcher.acknowledge(alerts)
    assert (dispatcher.stats["flaky"].failed, dispatcher.stats["flaky"].delivered, flaky.calls) == (1, 1, 2)
    assert dispatcher.stats["stdout"].failed == 2 and dispatcher.stats["stdout"].undelivered == 1
    assert (
        "flaky: 1 alerts not delivered (0 more queued behind them), retrying next evaluation: KeyError" in caplog.text
    )
    dispatcher.close()
