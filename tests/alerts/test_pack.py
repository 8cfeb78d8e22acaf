"""The default rule pack on hand-built traffic: silent on clean reuse, firing on each fault;
`kvaudit alerts eval` and `watch` end to end, with a restart that does not re-fire."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from kvaudit.alerts.engine import RULE_WINDOW_S, RuleEngine
from kvaudit.alerts.instances import AlertState
from kvaudit.alerts.rules import load_default_pack
from kvaudit.analyse.derived_views import prepare
from kvaudit.backends import as_backend
from kvaudit.cli import main
from kvaudit.read.open import open_store

from ..support import alert_traces
from ..support.alert_traces import Clock


def _fired(trace_dir: Path, *, after_s: float = 0) -> dict[str, list[dict[str, str]]]:
    """Firing alerts of the default pack: evaluated now, and again `after_s` later (for rules with `for`)."""
    clock = Clock()
    engine = RuleEngine(load_default_pack(), clock=clock)
    store = open_store([str(trace_dir)])
    engine.evaluate(store)
    clock.now += after_s
    alerts = engine.evaluate(store)
    assert engine.errors == {}
    fired: dict[str, list[dict[str, str]]] = {}
    for alert in alerts:
        if alert.state is AlertState.FIRING:
            fired.setdefault(alert.alertname, []).append(alert.labels | alert.annotations)
    return fired


def test_silent_on_clean_traffic(trace_dir: Path):
    alert_traces.clean(trace_dir)
    assert _fired(trace_dir, after_s=3600) == {}


def test_a_used_malformed_page_pages_at_once(trace_dir: Path):
    alert_traces.used_malformed_page(trace_dir)
    [alert] = _fired(trace_dir)["KVAuditCriticalFinding"]
    assert (alert["replica"], alert["rule"], alert["severity"]) == ("r2", "KVA001", "critical")
    assert alert["summary"] == "r2 used 1 fetched KV pages that break KVA001"
    assert "rule KVA001 on replica r2" in alert["runbook"]


def test_rejected_pages_open_a_ticket(trace_dir: Path):
    alert_traces.rejected_pages(trace_dir)
    fired = _fired(trace_dir)
    assert list(fired) == ["KVAuditSafeMissesRising"]
    [alert] = fired["KVAuditSafeMissesRising"]
    assert (alert["replica"], alert["severity"]) == ("r2", "warning") and alert["runbook"]


def test_telemetry_loss(trace_dir: Path):
    alert_traces.telemetry_loss(trace_dir)
    fired = _fired(trace_dir)
    assert list(fired) == ["KVAuditTelemetryLoss"]
    [alert] = fired["KVAuditTelemetryLoss"]
    assert alert["file"].endswith("r3.jsonl") and alert["summary"].endswith(": 2 KVA007 findings")


@pytest.mark.parametrize(
    ("build", "alertname"),
    [
        (alert_traces.recomputed_prefixes, "KVAuditCrossReplicaHitRateLow"),
        (alert_traces.slow_fetches, "KVAuditLoadSlowerThanRecompute"),
        (alert_traces.evicted_then_needed, "KVAuditPoolThrash"),
    ],
)
def test_efficiency_rules_fire_after_their_for(trace_dir: Path, build: Callable[[Path], None], alertname: str):
    build(trace_dir)
    assert _fired(trace_dir, after_s=599) == {}  # pending for 10 minutes first
    fired = _fired(trace_dir, after_s=600)
    assert list(fired) == [alertname]
    [alert] = fired[alertname]
    assert alert["severity"] == "warning" and alert["runbook"] and "{{" not in alert["summary"]


@pytest.mark.parametrize(("router", "replicas"), [("round-robin", {"r1", "r2"}), ("session-affinity", set())])
def test_reuse_lost_to_routing_fires_when_the_router_splits_sessions(tmp_path: Path, router: str, replicas: set[str]):
    # Private pools and multi-turn chats only: a session's earlier turns sit in the pool of
    # the replica that served them, which a session-splitting router sends the next turn past.
    argv = ["simulate", "--out", str(tmp_path), "--private-pools", "--router", router, "--workload", "chat=1"]
    assert main([*argv, "--duration", "300", "--seed", "3", "-q"]) == 0
    assert "KVAuditReuseLostToRouting" not in _fired(tmp_path / "traces", after_s=599)  # pending for 10 minutes
    alerts = _fired(tmp_path / "traces", after_s=600).get("KVAuditReuseLostToRouting", [])
    assert {alert["replica"] for alert in alerts} == replicas
    for alert in alerts:
        assert alert["severity"] == "warning" and "of its prompt tokens that another replica held" in alert["summary"]
        assert "`kvaudit explain TRACES REQUEST_ID`" in alert["runbook"]


def test_eval_prints_firing_alerts_with_severity(trace_dir: Path, capsys: pytest.CaptureFixture[str]):
    alert_traces.used_malformed_page(trace_dir)
    assert main(["alerts", "eval", str(trace_dir), "--format", "json"]) == 1  # firing: the gate fails
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["state"], row["severity"], row["alertname"]) == ("firing", "critical", "KVAuditCriticalFinding")
    assert row["labels"] == "replica=r2, rule=KVA001" and row["value"] == "1"


def test_watch_notifies_once_across_restarts_and_resolves(trace_dir: Path, tmp_path: Path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n  - name: g\n    rules:\n      - alert: Rejected\n"
        "        expr: SELECT replica, count(*) AS value FROM pages WHERE NOT used GROUP BY replica\n"
    )
    alert_traces.clean(trace_dir)
    out = tmp_path / "notified.jsonl"
    state = tmp_path / "state.json"
    watch = ["alerts", "watch", str(trace_dir), "--rules", str(rules), "--state", str(state)]
    watch += ["--notify", f"file:{out}", "--once"]
    assert main(watch) == 0
    assert not out.exists()
    alert_traces.rejected_pages(trace_dir)
    assert main(watch) == 0
    assert main(watch) == 0  # a restart: still firing, not announced again
    [fired] = [json.loads(line) for line in out.read_text().splitlines()]
    assert (fired["status"], fired["labels"]["replica"], fired["value"]) == ("firing", "r2", "3")
    rules.write_text(rules.read_text().replace("NOT used", "NOT used AND false"))
    assert main(watch) == 0
    statuses = [json.loads(line)["status"] for line in out.read_text().splitlines()]
    assert statuses == ["firing", "resolved"]


def test_watch_shows_what_it_could_not_deliver(trace_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    alert_traces.used_malformed_page(trace_dir)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"webhook:http://127.0.0.1:{s.getsockname()[1]}/hook"  # nothing listens once closed
    argv = ["alerts", "watch", str(trace_dir), "--state", str(tmp_path / "s.json"), "--once"]
    assert main([*argv, "--notify", dead, "--notify", "stdout", "--retries", "0", "--timeout", "1s"]) == 4
    out, err = capsys.readouterr()
    assert out.startswith('FIRING KVAuditCriticalFinding{replica="r2",rule="KVA001",severity="critical"} value=1')
    assert f"kvaudit alerts: 1 firing, 0 pending; {dead}: 1 undelivered (1 failed so far)" in err


def test_eval_exits_4_when_a_rule_fails(trace_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture):
    alert_traces.rejected_pages(trace_dir)
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n  - name: g\n    rules:\n      - alert: Broken\n"
        "        expr: SELECT replica, CAST(replica AS INTEGER) AS value FROM pages\n"
    )
    assert main(["alerts", "eval", str(trace_dir), "--rules", str(rules)]) == 4
    assert f"{rules}:4: alert Broken: Conversion Error" in caplog.text


def test_rules_can_use_named_queries(trace_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    alert_traces.rejected_pages(trace_dir)
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n  - name: g\n    rules:\n      - alert: LowHitRate\n"
        "        expr: SELECT replica, hit_rate AS value FROM query_summary WHERE hit_rate < 0.5\n"
        "        labels: {severity: warning}\n"
    )
    assert main(["alerts", "check", str(rules)]) == 0
    assert main(["alerts", "eval", str(trace_dir), "--rules", str(rules), "--format", "csv"]) == 1
    assert "firing,warning,LowHitRate,replica=r2,0," in capsys.readouterr().out


def test_a_simulated_rolling_upgrade_pages_and_clean_traffic_is_silent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    for name, faults in (("clean", []), ("upgrade", ["--fault", "rolling-upgrade:20"])):
        assert main(["simulate", "--out", str(tmp_path / name), "--duration", "40", "-q", *faults]) == 0
    capsys.readouterr()
    assert main(["alerts", "eval", str(tmp_path / "clean" / "traces"), "--format", "json"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["alerts", "eval", str(tmp_path / "upgrade" / "traces"), "--format", "json"]) == 1
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows and {(r["state"], r["alertname"], r["severity"]) for r in rows} == {
        ("firing", "KVAuditCriticalFinding", "critical")
    }
    # The new layout does not fit the old pages (KVA005), nor does their geometry fingerprint (KVA008):
    # one alert per replica, whose value counts each bad page once.
    rules = {label for r in rows for label in r["labels"].split(", ") if label.startswith("rule=")}
    assert rules == {"rule=KVA005,KVA008"}
    assert len({r["labels"] for r in rows}) == len(rows)


def test_rules_read_the_reuse_left_of_their_window(tmp_path: Path):
    """Explaining a whole history outlasts a rule's time limit: the views that explain requests
    hold, for rules, the requests looked up within `RULE_WINDOW_S` before the newest span."""
    assert main(["simulate", "--out", str(tmp_path), "--duration", "9000", "--rate", "0.01", "-q"]) == 0
    backend = as_backend(open_store([str(tmp_path / "traces")]))
    buckets = "SELECT replica, epoch(bucket_start) AS start, requests, prompt_tokens FROM query_reuse_left"
    prepare(backend, [buckets], audit=None)
    everything = backend.query(buckets)[1]
    prepare(backend, [buckets], audit=None, window_s=RULE_WINDOW_S)
    windowed = backend.query(buckets)[1]
    [(newest,)] = backend.query("SELECT max(end_ns) / 1e9 FROM spans")[1]
    since = newest - RULE_WINDOW_S
    assert min(row[1] for row in everything) < since - 3600  # hours of history before the window
    assert min(row[1] for row in windowed) >= since - 60  # a bucket starts at most its width before
    whole_buckets = sorted(row for row in everything if row[1] >= since)
    assert sorted(row for row in windowed if row[1] >= since) == whole_buckets and whole_buckets
