"""Every surface on every backend: `alerts eval`, the exporter and `tui --snapshot` on ClickHouse (chdb).

The traces of `write_fleet` (tests/support/backend_fleet.py) go to DuckDB as trace files and to chdb as the
Collector's ClickHouse exporter stores them (a `chdb:///DIR` database, with or without
the typed tables of `kvaudit clickhouse setup`); each surface must
give the same answers over both, except what the Collector's table does not keep (the
file and line of a row, `NOT_IN_CLICKHOUSE`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvaudit.backends.clickhouse import ChdbConnection, ClickHouseBackend
from kvaudit.backends.clickhouse_load import create_table, load_files
from kvaudit.backends.clickhouse_setup import setup
from kvaudit.cli import main
from kvaudit.commands.arguments import open_backend
from kvaudit.commands.metrics_server import serve

from ..support.backend_fleet import NOT_IN_CLICKHOUSE, write_fleet
from ..support.exporter import caught_up

pytestmark = pytest.mark.slow  # every surface on chdb


@pytest.fixture(scope="module", params=["views", "typed"])
def sources(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The trace directory, and the URL of a chdb database holding the same spans: in the exporter's
    `otel_traces` only, or also in the typed tables of `kvaudit clickhouse setup`."""
    traces = tmp_path_factory.mktemp("fleet")
    write_fleet(traces)
    database = tmp_path_factory.mktemp("chdb")
    clickhouse = ClickHouseBackend(ChdbConnection(str(database)))
    create_table(clickhouse)
    if request.param == "typed":
        list(setup(clickhouse))
    assert load_files(clickhouse, [str(traces)])
    clickhouse.query("SELECT 1")
    assert clickhouse.reads_typed_tables is (request.param == "typed")
    clickhouse.close()  # one chdb session at a time: the command opens its own
    yield str(traces), f"chdb://{database}"


def _json_lines(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict[str, Any]]:
    main(argv)
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_alerts_eval_on_clickhouse(sources: tuple[str, str], capsys: pytest.CaptureFixture[str]):
    traces, url = sources
    # chdb analyses the reuse-left query (explain's) for seconds on a loaded 2-core machine:
    # a time limit that this machine's load cannot reach, so that the answers are compared.
    limit = ["--rule-timeout", "120s"]
    duckdb_alerts = _json_lines(capsys, ["alerts", "eval", traces, "--format", "json", *limit])
    clickhouse_alerts = _json_lines(capsys, ["alerts", "eval", "--backend", url, "--format", "json", *limit])
    assert {a["alertname"] for a in duckdb_alerts} >= {"KVAuditCriticalFinding"}

    def same(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        kept = ("state", "alertname", "labels", "value", "summary")
        return sorted(({key: a[key] for key in kept} for a in alerts), key=lambda a: (a["alertname"], a["labels"]))

    # Every rule of the default pack runs on both, evictions/before_reuse's (KVAuditPoolThrash) included.
    assert not [a for a in clickhouse_alerts if a["alertname"] == "KVAuditRuleFailing"]
    assert_close(same(clickhouse_alerts), same(duckdb_alerts))


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _scrape(argv_paths: list[str], url: str | None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    import urllib.request

    backend = open_backend(url, argv_paths, live=True)
    server, port = serve(backend, "127.0.0.1", 0, settle_s=0)
    try:
        caught_up(server)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120) as reply:
            return _samples(reply.read().decode())
    finally:
        server.shutdown()
        backend.close()


def test_exporter_on_clickhouse(sources: tuple[str, str]):
    traces, url = sources
    on_duckdb = _scrape([traces], None)
    on_clickhouse = _scrape([], url)
    assert on_duckdb[("kvaudit_pages_total", (("op", "fetch"), ("replica", "r2")))] == 16
    assert on_clickhouse == pytest.approx(on_duckdb, rel=1e-9)


def test_tui_snapshot_on_clickhouse(sources: tuple[str, str], capsys: pytest.CaptureFixture[str]):
    traces, url = sources
    limit = ["--rule-timeout", "120s"]  # as in test_alerts_eval_on_clickhouse
    [on_duckdb] = _json_lines(capsys, ["tui", traces, "--snapshot", "--window", "all", *limit])
    [on_clickhouse] = _json_lines(capsys, ["tui", "--backend", url, "--snapshot", "--window", "all", *limit])
    assert on_duckdb["reuse"] and on_duckdb["findings"]
    assert on_duckdb["alerts_source"] == on_clickhouse["alerts_source"] == "default rule pack"
    for figures in (on_duckdb, on_clickhouse):
        for finding in figures["findings"]:
            for column in NOT_IN_CLICKHOUSE & finding.keys():
                del finding[column]
    assert_close(on_clickhouse, on_duckdb)


def assert_close(got: Any, expected: Any, where: str = "") -> None:
    """Equal JSON values, floats within the engines' rounding (sums in another order differ in the last digits)."""
    if isinstance(expected, float) and isinstance(got, float):
        assert got == pytest.approx(expected, rel=1e-9), where
    elif isinstance(expected, dict) and isinstance(got, dict):
        assert got.keys() == expected.keys(), where
        for key in expected:
            assert_close(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list) and isinstance(got, list):
        assert len(got) == len(expected), where
        for index, (one, other) in enumerate(zip(got, expected)):
            assert_close(one, other, f"{where}[{index}]")
    else:
        assert got == expected, where
