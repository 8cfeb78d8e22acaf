"""The alert state machine on a controllable clock: pending, firing, resolved, keep_firing_for, restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvaudit.alerts.engine import RuleEngine
from kvaudit.alerts.instances import AlertState
from kvaudit.alerts.rules import load_rules
from kvaudit.read.store import TraceStore

from ..support.alert_traces import Clock

RULES = """\
groups:
  - name: g
    rules:
      - alert: Hot
        expr: SELECT replica, value FROM condition
        for: 5m
        keep_firing_for: 2m
        labels: {{severity: critical, value_class: "{{{{ $value }}}}"}}
        annotations: {{summary: "{{{{ $labels.replica }}}} is at {{{{ $value }}}}"}}
  - name: slow
    interval: {interval}
    rules:
      - alert: Slow
        expr: SELECT replica, value FROM condition
"""


@pytest.fixture
def store() -> TraceStore:
    store = TraceStore()
    store.con.execute("CREATE TABLE condition (replica VARCHAR, value DOUBLE)")
    return store


def _holds(store: TraceStore, **values: float) -> None:
    store.con.execute("DELETE FROM condition")
    for replica, value in values.items():
        store.con.execute("INSERT INTO condition VALUES (?, ?)", [replica, value])


def _engine(tmp_path: Path, clock: Clock, interval: str = "1h", **kwargs: object) -> RuleEngine:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES.format(interval=interval))
    groups = [g for g in load_rules([path]) if g.name == "g"]
    return RuleEngine(groups, clock=clock, **kwargs)  # type: ignore[arg-type]


def _states(engine: RuleEngine) -> dict[str, AlertState]:
    return {a.labels["replica"]: a.state for a in engine.alerts}


def test_pending_then_firing_after_for(tmp_path: Path, store: TraceStore):
    clock = Clock()
    engine = _engine(tmp_path, clock)
    assert engine.evaluate(store) == []
    _holds(store, r1=1)
    [alert] = engine.evaluate(store)
    assert (alert.state, alert.active_since, alert.fired_at) == (AlertState.PENDING, clock.now, None)
    assert alert.labels == {"alertname": "Hot", "replica": "r1", "severity": "critical", "value_class": "1"}
    assert alert.annotations == {"summary": "r1 is at 1"}
    started = clock.now
    clock.advance(299)
    assert _states(engine) == {"r1": AlertState.PENDING} and engine.evaluate(store)[0].state is AlertState.PENDING
    clock.advance(1)
    [alert] = engine.evaluate(store)
    assert (alert.state, alert.active_since, alert.fired_at) == (AlertState.FIRING, started, clock.now)
    assert engine.firing() == [alert]


@pytest.mark.parametrize(
    ("external_url", "generator_url"),
    [
        ("", "#Hot"),
        ("https://grafana.example/d/kv", "https://grafana.example/d/kv#Hot"),
        ("https://grafana.example/d/kv#panel-2", "https://grafana.example/d/kv#Hot"),
    ],
)
def test_the_generator_url_is_the_external_url_and_the_rule(
    tmp_path: Path, store: TraceStore, external_url: str, generator_url: str
):
    """Not the rule file's path, which inside an install is a `file://.../site-packages/...` no reader can open."""
    _holds(store, r1=1)
    [alert] = _engine(tmp_path, Clock(), external_url=external_url).evaluate(store)
    assert alert.generator_url == generator_url


def test_a_pending_alert_whose_condition_stops_is_forgotten(tmp_path: Path, store: TraceStore):
    clock = Clock()
    engine = _engine(tmp_path, clock)
    _holds(store, r1=1)
    engine.evaluate(store)
    _holds(store)
    clock.advance(60)
    assert engine.evaluate(store) == []
    _holds(store, r1=1)
    clock.advance(60)
    assert engine.evaluate(store)[0].active_since == clock.now  # `for` starts again


def test_keep_firing_for_then_resolved_then_forgotten(tmp_path: Path, store: TraceStore):
    clock = Clock()
    engine = _engine(tmp_path, clock, resolved_retention_s=600)
    _holds(store, r1=1, r2=1)
    engine.evaluate(store)
    clock.advance(300)
    assert _states(engine) == {"r1": AlertState.PENDING, "r2": AlertState.PENDING}
    engine.evaluate(store)
    assert _states(engine) == {"r1": AlertState.FIRING, "r2": AlertState.FIRING}
    _holds(store, r2=1)  # r1 flaps off
    clock.advance(60)
    engine.evaluate(store)
    assert _states(engine) == {"r1": AlertState.FIRING, "r2": AlertState.FIRING}
    _holds(store, r1=1, r2=1)  # and back: it never stopped firing
    clock.advance(60)
    engine.evaluate(store)
    r1 = next(a for a in engine.alerts if a.labels["replica"] == "r1")
    assert r1.keep_firing_since is None
    _holds(store, r2=1)
    clock.advance(60)
    engine.evaluate(store)
    clock.advance(119)
    engine.evaluate(store)
    assert _states(engine)["r1"] is AlertState.FIRING
    clock.advance(1)
    engine.evaluate(store)
    r1 = next(a for a in engine.alerts if a.labels["replica"] == "r1")
    assert (r1.state, r1.resolved_at) == (AlertState.RESOLVED, clock.now)
    clock.advance(600)
    engine.evaluate(store)
    assert _states(engine) == {"r2": AlertState.FIRING}


def test_a_resolved_alert_that_returns_starts_over(tmp_path: Path, store: TraceStore):
    clock = Clock()
    engine = _engine(tmp_path, clock)
    _holds(store, r1=1)
    engine.evaluate(store)
    clock.advance(300)
    engine.evaluate(store)
    _holds(store)
    clock.advance(1)
    engine.evaluate(store)  # kept firing from here, for 2 minutes
    clock.advance(120)
    assert engine.evaluate(store)[0].state is AlertState.RESOLVED
    _holds(store, r1=1)
    clock.advance(1)
    [alert] = engine.evaluate(store)
    assert (alert.state, alert.active_since, alert.fired_at) == (AlertState.PENDING, clock.now, None)


def test_restart_from_disk_neither_refires_nor_forgets(tmp_path: Path, store: TraceStore):
    clock = Clock()
    state = tmp_path / "state" / "alerts.json"
    engine = _engine(tmp_path, clock, state_path=state)
    _holds(store, r1=1, r2=1)
    engine.evaluate(store)
    clock.advance(300)
    engine.evaluate(store)
    _holds(store, r1=1, r2=1, r3=1)
    clock.advance(60)
    before = {a.fingerprint: a for a in engine.evaluate(store)}
    # A new process: the firing alerts keep their start, the pending one its progress.
    clock.advance(300)
    restarted = _engine(tmp_path, clock, state_path=state)
    assert {a.fingerprint: a for a in restarted.alerts} == before
    after = {a.labels["replica"]: a for a in restarted.evaluate(store)}
    assert after["r1"].fired_at == before[after["r1"].fingerprint].fired_at
    assert after["r3"].state is AlertState.FIRING  # 5 minutes since it became pending, across the restart


def test_rules_that_are_gone_drop_their_state(tmp_path: Path, store: TraceStore):
    clock = Clock()
    state = tmp_path / "alerts.json"
    engine = _engine(tmp_path, clock, state_path=state)
    _holds(store, r1=1)
    engine.evaluate(store)
    assert RuleEngine([], state_path=state, clock=clock).alerts == []


def test_a_failing_rule_keeps_its_alerts_and_reports_why(tmp_path: Path, store: TraceStore):
    clock = Clock()
    engine = _engine(tmp_path, clock)
    _holds(store, r1=1, r2=1)
    engine.evaluate(store)
    store.con.execute("ALTER TABLE condition RENAME COLUMN value TO v")
    clock.advance(60)
    alerts = engine.evaluate(store)
    assert sorted(a.alertname for a in alerts) == ["Hot", "Hot", "KVAuditRuleFailing"]
    assert "value" in engine.errors[("g", "Hot")]
    store.con.execute("ALTER TABLE condition RENAME COLUMN v TO value")
    store.con.execute("INSERT INTO condition VALUES ('r1', 2)")
    engine.evaluate(store)
    assert "same labels" in engine.errors[("g", "Hot")]


def test_a_group_interval_spaces_its_evaluations(tmp_path: Path, store: TraceStore):
    clock = Clock()
    path = tmp_path / "rules.yaml"
    path.write_text(RULES.format(interval="1m"))
    engine = RuleEngine([g for g in load_rules([path]) if g.name == "slow"], clock=clock)
    _holds(store, r1=1)
    assert len(engine.evaluate(store)) == 1
    _holds(store)
    clock.advance(30)
    assert len(engine.evaluate(store)) == 1  # not due: unchanged
    clock.advance(30)
    assert engine.evaluate(store)[0].state is AlertState.RESOLVED


def test_views_that_cannot_be_made_fail_every_rule_and_stop_nothing(
    tmp_path: Path, store: TraceStore, monkeypatch: pytest.MonkeyPatch
):
    clock = Clock()
    engine = _engine(tmp_path, clock)
    _holds(store, r1=1)
    engine.evaluate(store)

    # A stand-in for the auditor failing on data it cannot handle (no such data is at hand).
    def overflowing(*_: object, **__: object) -> None:
        raise OverflowError("int too big to convert")

    monkeypatch.setattr("kvaudit.alerts.engine.prepare", overflowing)
    clock.advance(60)
    alerts = engine.evaluate(store)
    assert engine.errors == {
        ("g", "Hot"): "the views rules read could not be made: OverflowError: int too big to convert"
    }
    assert {a.alertname: a.state for a in alerts} == {
        "Hot": AlertState.PENDING,
        "KVAuditRuleFailing": AlertState.FIRING,
    }


def test_an_evaluation_audits_what_arrived_since_the_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The findings are kept (`LiveAudit`): the first evaluation audits the history, a later one
    what arrived since, and one after a read that added nothing audits nothing."""
    import kvaudit.analyse.live_audit as live_audit

    audited = []
    real_query = live_audit.audit_query

    def counted(rules: list[str] | None = None, **kwargs: object) -> str:
        audited.append("all" if rules is None else "pages" if "pages" in kwargs else "traces")
        return real_query(rules, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(live_audit, "audit_query", counted)
    clock, store = Clock(), TraceStore(database=":memory:")
    store.con.execute("CREATE TABLE condition (replica VARCHAR, value DOUBLE)")
    engine = _engine(tmp_path, clock)
    engine.evaluate(store)
    clock.advance(3600)
    engine.evaluate(store)
    assert audited == ["traces"]  # the history: the trace rules, and the page rules of each partition (none)
    store.con.execute(
        "INSERT INTO kv_pages BY NAME SELECT 'fetch' AS op, 'k' AS key, 1 AS time_ns, 't' AS trace_id, 's' AS span_id"
    )
    clock.advance(3600)
    engine.evaluate(store)
    assert audited == ["traces", "pages"]
    # A page without its metadata, fetched and never stored.
    assert store.query("SELECT code FROM findings ORDER BY code")[1] == [("KVA001",), ("KVA006",)]
