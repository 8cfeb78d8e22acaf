"""Rule files are read-only queries: a rule that writes, reads files, reaches the network, loads
extensions or changes the views is refused by `alerts check` and by evaluation, nothing is
written or fetched, and the other rules keep evaluating. A slow rule is stopped at its time
limit, a rule with too many rows at its alert limit; both are reported as rule health.

The network is a real HTTP server on 127.0.0.1 that records every request it gets.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from kvaudit.alerts.bounds import Bounds
from kvaudit.alerts.engine import RuleEngine
from kvaudit.alerts.rule_health import Health
from kvaudit.alerts.rules import load_rules
from kvaudit.backends import BackendError
from kvaudit.backends.base import QueryTimeoutError
from kvaudit.backends.clickhouse import ChdbConnection, ClickHouseBackend
from kvaudit.backends.clickhouse_load import create_table
from kvaudit.cli import main
from kvaudit.read.open import open_store

from ..support import alert_traces
from ..support.servers import RecordingServer


@pytest.fixture
def web() -> Iterator[RecordingServer]:
    with RecordingServer() as server:
        yield server


def hostile_rules(tmp: Path, url: str) -> dict[str, str]:
    """Alert name -> expr: everything a rule must not do, as the issue found rules doing it."""
    return {
        "CopyTo": f"COPY (SELECT 1 AS value) TO '{tmp}/copied.csv'",
        "AttachCreate": f"ATTACH '{tmp}/attached.duckdb' AS a; CREATE TABLE a.t AS SELECT 1 AS value",
        "InstallFromUrl": f"INSTALL httpfs FROM '{url}/extensions'",
        "LoadExtension": "LOAD httpfs",
        "ReadPasswd": "SELECT content AS secret FROM read_text('/etc/passwd')",
        "ReadUrl": f"SELECT count(*) AS value FROM read_csv('{url}/data.csv')",
        "ScanUrl": f"SELECT count(*) AS value FROM '{url}/data.parquet'",
        "DropView": "DROP VIEW pages",
        "SetConfig": "SET enable_external_access = true",
        "EnableLogging": "SELECT 1 AS value FROM enable_logging()",
    }


def _rule_file(tmp: Path, rules: dict[str, str], name: str = "rules.yaml") -> Path:
    lines = ["groups:", "  - name: hostile", "    rules:"]
    for alert, expr in rules.items():
        lines += [f"      - alert: {alert}", f"        expr: {json.dumps(expr)}"]
    # After all of them: the views are still there, and rules still evaluate.
    lines += ["      - alert: PagesSeen", "        expr: SELECT count(*) AS value FROM pages HAVING count(*) > 0"]
    path = tmp / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _written(tmp: Path, before: set[Path]) -> set[str]:
    return {p.name for p in tmp.iterdir()} - {p.name for p in before}


def test_check_refuses_each_hostile_rule_without_running_it(tmp_path: Path, web: RecordingServer, capsys):
    rules = hostile_rules(tmp_path, web.url)
    path = _rule_file(tmp_path, rules)
    before = set(tmp_path.iterdir())
    assert main(["alerts", "check", str(path)]) == 1
    problems = capsys.readouterr().out.splitlines()
    # One problem per hostile rule, at the line of its expr (rule i's is line 5 + 2i); none for PagesSeen.
    assert [p.split(": ", 1)[0] for p in problems] == [f"{path}:{5 + 2 * i}" for i in range(len(rules))]
    assert all(": expr: " in p for p in problems), problems
    assert _written(tmp_path, before) == set()  # no copied.csv, no attached.duckdb
    assert web.requests == []  # no extension, CSV or Parquet fetched
    # The recorder does see a fetch when nothing stands in the way: DuckDB itself, unsealed.
    with pytest.raises(duckdb.Error):
        duckdb.connect().execute(rules["InstallFromUrl"])
    [fetch] = web.requests
    assert fetch.startswith("GET /extensions/") and "httpfs" in fetch


def test_evaluation_refuses_them_and_the_other_rules_go_on(
    trace_dir: Path, tmp_path: Path, web: RecordingServer, caplog: pytest.LogCaptureFixture, capsys
):
    alert_traces.clean(trace_dir)
    rules = hostile_rules(tmp_path, web.url)
    path = _rule_file(tmp_path, rules)
    before = set(tmp_path.iterdir())
    status = main(["alerts", "eval", str(trace_dir), "--rules", str(path), "--format", "json"])
    assert status == 4  # incomplete: rules failed
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    failing = {r["labels"] for r in rows if r["alertname"] == "KVAuditRuleFailing"}
    assert failing == {f"rule={name}, rule_group=hostile" for name in rules}
    assert [r["value"] for r in rows if r["alertname"] == "PagesSeen"] == ["48"]  # `pages` is still there
    assert _written(tmp_path, before) == set()
    assert web.requests == []
    assert "root:" not in caplog.text + json.dumps(rows)  # /etc/passwd never became a label
    for name in ("ReadPasswd", "ReadUrl", "ScanUrl", "EnableLogging"):
        assert any(f"alert {name}: " in m and ("disabled" in m or "locked" in m) for m in caplog.messages), name


def test_a_webhook_never_hears_a_file_the_rule_read(trace_dir: Path, tmp_path: Path, web: RecordingServer):
    alert_traces.clean(trace_dir)
    path = _rule_file(tmp_path, {"ReadPasswd": "SELECT content AS secret, 1 AS value FROM read_text('/etc/passwd')"})
    argv = ["alerts", "watch", str(trace_dir), "--rules", str(path), "--state", str(tmp_path / "state.json")]
    assert main([*argv, "--once", "--notify", f"webhook:{web.url}/hook"]) == 4
    [payload] = [p for p in web.posts if isinstance(p, dict) and p["groupLabels"]["alertname"] == "KVAuditRuleFailing"]
    [alert] = payload["alerts"]
    assert alert["labels"]["rule"] == "ReadPasswd" and "disabled by configuration" in alert["annotations"]["error"]
    assert "root:" not in json.dumps(web.posts)


def _engine(tmp_path: Path, text: str, **bounds: float) -> RuleEngine:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return RuleEngine(load_rules([path]), bounds=Bounds(**bounds), state_path=tmp_path / "state.json")  # type: ignore[arg-type]


SLOW_AND_FAST = """\
groups:
  - name: g
    rules:
      - alert: Slow
        expr: SELECT sum(range) AS value FROM range(100000000000)
      - alert: Fast
        expr: SELECT count(*) AS value FROM pages
"""


def test_a_slow_rule_is_stopped_at_its_time_limit(trace_dir: Path, tmp_path: Path):
    alert_traces.clean(trace_dir)
    engine = _engine(tmp_path, SLOW_AND_FAST, timeout_s=0.5)
    store = open_store([str(trace_dir)])
    started = time.monotonic()
    alerts = engine.evaluate(store)
    elapsed = time.monotonic() - started
    slow, fast = engine.health[("g", "Slow")], engine.health[("g", "Fast")]
    assert (slow.health, slow.last_error) == (Health.ERR, "stopped after 0.5s (the time limit)")
    assert fast.health is Health.OK and [a.value for a in alerts if a.alertname == "Fast"] == [48]
    assert elapsed < 30  # the query alone would run for hours: it was stopped, not waited for
    # The connection is usable afterwards: the interrupt hit the slow query only.
    assert store.query("SELECT count(*) FROM pages")[1] == [(48,)]


def test_a_rule_with_more_rows_than_its_limit_fails_and_writes_little(trace_dir: Path, tmp_path: Path):
    alert_traces.clean(trace_dir)
    many = "SELECT range::VARCHAR AS n, 1 AS value FROM range(200000)"
    text = f"groups:\n  - name: g\n    rules:\n      - alert: Many\n        expr: {many}\n"
    text += "  - name: small\n    limit: 5\n    rules:\n      - alert: Six\n"
    text += "        expr: SELECT range::VARCHAR AS n, 1 AS value FROM range(6)\n"
    text += "      - alert: Five\n        expr: SELECT range::VARCHAR AS n, 1 AS value FROM range(5)\n"
    engine = _engine(tmp_path, text)
    alerts = engine.evaluate(open_store([str(trace_dir)]))
    assert engine.errors == {
        ("g", "Many"): "more than 1000 alerts (the limit of its group, `limit`)",
        ("small", "Six"): "more than 5 alerts (the limit of its group, `limit`)",
    }
    assert sum(a.alertname == "Five" for a in alerts) == 5
    assert (tmp_path / "state.json").stat().st_size < 64 * 1024  # was 102 MB for 200k rows


def test_clickhouse_rules_are_read_only_and_stopped_in_time():
    backend = ClickHouseBackend(ChdbConnection())
    create_table(backend)
    try:
        for sql in ("DROP TABLE otel_traces", "SELECT * FROM url('http://127.0.0.1:9/x', 'LineAsString')"):
            with pytest.raises(BackendError):
                backend.sandboxed(sql, timeout_s=5, max_rows=10)
        with pytest.raises(QueryTimeoutError):
            backend.sandboxed("SELECT sum(number) AS value FROM numbers(100000000000)", timeout_s=0.5, max_rows=10)
        # The session is whole afterwards (chdb hands a stopped query's leftovers to the next one).
        assert backend.sandboxed("SELECT count(*) AS value FROM spans", timeout_s=5, max_rows=10).num_rows == 1
        assert backend.sandboxed("SELECT number FROM numbers(100)", timeout_s=5, max_rows=7).num_rows == 7
        assert backend.query("SELECT count(*) FROM spans")[1] == [(0,)]  # the table is still there
    finally:
        backend.close()


def test_a_parquet_dataset_stays_readable_and_nothing_else(trace_dir: Path, tmp_path: Path, capsys):
    alert_traces.used_malformed_page(trace_dir)
    dataset = tmp_path / "dataset"
    assert main(["ingest", str(trace_dir), "--parquet", str(dataset), "-q"]) == 0
    path = _rule_file(tmp_path, {"ReadPasswd": "SELECT content AS secret FROM read_text('/etc/passwd')"})
    capsys.readouterr()
    assert main(["alerts", "eval", str(dataset), "--rules", str(path), "--format", "json"]) == 4
    rows = {r["alertname"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows["PagesSeen"]["value"] == "49" and rows["KVAuditRuleFailing"]["labels"].startswith("rule=ReadPasswd")
