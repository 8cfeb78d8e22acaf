"""`kvaudit tui` from the command line: `--snapshot` JSON, `--collect`, `--rules`, errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from kvaudit.cli import main
from kvaudit.contract import Hook, Op, Outcome
from kvaudit.emit.setup import setup_emitter
from kvaudit.read.store import TraceStore
from kvaudit.receive.otlp_http import CollectorServer
from kvaudit.receive.trace_sink import TraceSink
from kvaudit.tui.app import KvauditApp
from kvaudit.tui.source import LiveSource

from ..support.pages import KV, full_page
from ..support.tui_app import PACKED, UNPACKED, plant_bad_fetch, replicas_shown
from ..support.tui_fleet import Fleet, fleet_fixture  # noqa: F401 - the fixture
from ..support.waiting import until

RULES = """\
groups:
  - name: tui
    rules:
      - alert: AnyFetch
        expr: SELECT replica, count(*) AS value FROM pages WHERE op = 'fetch' GROUP BY replica
        labels: {severity: ticket}
        annotations: {summary: "{{ $labels.replica }} fetched pages"}
"""


def snapshot_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["tui", *argv, "--snapshot"]) == 0
    return json.loads(capsys.readouterr().out)


def test_snapshot_prints_the_panels_figures(fleet: Fleet, trace_dir: Path, capsys):
    for n in range(2):
        fleet.conversation("r1", "r2", n)
    figures = snapshot_json(capsys, str(trace_dir), "--window", "all")
    assert figures["window"] == "all"
    assert [r["replica"] for r in figures["replicas"]] == ["r1", "r2"]
    r2 = figures["replicas"][1]
    assert r2["requests"] == 2 and r2["cross_replica_hit_tokens"] == 2 * 3 * 32 and r2["hit_rate"] == 1.0
    assert figures["reuse"] == [
        {
            "producer": "r1",
            "consumer": "r2",
            "pages": 6,
            "used_pages": 6,
            "rejected_pages": 0,
            "used_tokens": 6 * 32,
            "used_bytes": 6 * full_page("k").bytes,
        }
    ]
    # Without --rules, the default pack, as `kvaudit alerts eval` uses it (these pages carry an address: KVA002).
    assert figures["alerts_source"] == "default rule pack"
    assert {(a["name"], a["state"]) for a in figures["alerts"]} == {("KVAuditCriticalFinding", "firing")}


def test_snapshot_has_the_auditors_findings(fleet: Fleet, trace_dir: Path, capsys):
    fleet.conversation("r1", "r2", 0)
    plant_bad_fetch(fleet)
    figures = snapshot_json(capsys, str(trace_dir))
    mismatch = [f for f in figures["findings"] if f["code"] == "KVA004" and f["replica"] == "r2"]
    assert mismatch and mismatch[0]["severity"] == "critical"
    layout = mismatch[0]["fields"]["layout"]
    assert (layout["fetched"], layout["stored"]) == (UNPACKED, PACKED)
    assert figures["findings"][0]["severity"] == "critical"


def test_snapshot_with_rules(fleet: Fleet, trace_dir: Path, tmp_path: Path, capsys):
    fleet.conversation("r1", "r2", 0)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    figures = snapshot_json(capsys, str(trace_dir), "--rules", str(rules))
    assert [(a["name"], dict(a["labels"])["replica"]) for a in figures["alerts"]] == [("AnyFetch", "r2")]
    assert figures["alerts_source"] == str(rules)


def test_collect_snapshot_starts_and_stops_the_receiver(tmp_path: Path, capsys):
    figures = snapshot_json(capsys, "--collect", "127.0.0.1:0", "--out", str(tmp_path / "received"))
    assert figures["replicas"] == [] and figures["pages_loaded"] == 0
    assert (tmp_path / "received").is_dir()


def test_collect_shows_what_arrives(tmp_path: Path):
    out = tmp_path / "received"
    server = CollectorServer(("127.0.0.1", 0), TraceSink(out, fsync=False)).start()
    emitter = setup_emitter("r7", f"otlp:{server.url}", engine="vllm", kv=KV)
    live = TraceStore([out], ":memory:", workers=1)  # as `kvaudit tui --collect` makes it
    app = KvauditApp(LiveSource(live, auditor=None), watching=server.url, interval_s=0.2)

    async def scenario() -> None:
        async with app.run_test(size=(150, 45)):
            await until(lambda: app.main.figures is not None)
            with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id="q1", tokens_requested=32) as op:
                op.add_page(full_page("ab" * 32, 0, used=True))
                op.end(Outcome.HIT, tokens_hit=32)
            emitter.flush()
            await until(lambda: replicas_shown(app) == ["r7"])

    try:
        asyncio.run(scenario())
    finally:
        emitter.shutdown()
        server.stop()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give trace PATHs, --collect [ADDR] or --backend URL"),
        (["somewhere/", "--collect"], "give trace PATHs, --collect [ADDR] or --backend URL"),
        (["nowhere/"], "nowhere/: no such file or directory"),
        ([".", "--rules", "missing.yaml"], "missing.yaml: no such rule file"),
    ],
)
def test_usage_errors_are_one_line(argv: list[str], message: str, capsys):
    assert main(["tui", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_snapshot_of_an_ingested_database(fleet: Fleet, trace_dir: Path, tmp_path: Path, capsys):
    fleet.conversation("r1", "r2", 0)
    database = str(tmp_path / "traces.duckdb")
    assert main(["ingest", str(trace_dir), "-o", database, "-q"]) == 0
    capsys.readouterr()
    figures = snapshot_json(capsys, database)
    assert [(c["producer"], c["consumer"], c["used_pages"]) for c in figures["reuse"]] == [("r1", "r2", 3)]
