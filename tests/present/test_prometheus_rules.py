"""The Prometheus rules of examples/prometheus/: what an SRE loads beside `kvaudit exporter`.

promtool (Prometheus' own) checks them and runs their unit tests, and each metric they
name is one the exporter serves, read from a scrape of it. kvaudit's SQL rule files,
Prometheus-shaped, say what they are: promtool refuses them, kvaudit refuses other kinds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from kvaudit.alerts.rules import SQL_RULES_KIND, RuleFileError, load_default_pack, load_rules
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.cli import main
from kvaudit.present.exporter_metrics import TraceMetrics
from kvaudit.read.store import TraceStore

from ..support import ROOT
from ..support.waiting import wait_until

EXAMPLE = ROOT / "examples" / "prometheus"
RULES = EXAMPLE / "kvaudit.rules.yml"
PACK = ROOT / "kvaudit" / "alerts" / "pack" / "default.yaml"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool is not installed (scripts/install-promtool.sh installs it)"
)


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *map(str, args)], capture_output=True, text=True, timeout=120, cwd=EXAMPLE)


@needs_promtool
def test_promtool_checks_the_rules_and_their_unit_tests_pass():
    checked = _promtool("check", "rules", RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 11 rules found" in checked.stdout
    tested = _promtool("test", "rules", "kvaudit.rules.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_metric_named_is_one_the_exporter_serves(tmp_path: Path):
    assert main(["simulate", "--out", str(tmp_path), "--duration", "30", "--quiet"]) == 0
    registry = CollectorRegistry()
    metrics = TraceMetrics(DuckDBBackend(TraceStore([str(tmp_path / "traces")])), analyse_every_s=0, settle_s=0).start()
    try:
        wait_until(metrics.caught_up, what="the exporter read and analysed the traces")
        registry.register(metrics)
        text = generate_latest(registry).decode()
    finally:
        metrics.stop()
    served = set(re.findall(r"^# TYPE (\w+) (\w+)", text, re.M))
    names = {name for name, _ in served}
    histograms = [name for name, kind in served if kind == "histogram"]
    names |= {f"{name}_{suffix}" for name in histograms for suffix in ("bucket", "count", "sum")}
    groups = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    named = set()
    for group in groups:
        for rule in group["rules"]:
            expr = re.sub(r'\{[^}]*\}|"[^"]*"', "", rule["expr"])  # label matchers and strings
            named |= {word for word in re.findall(r"[a-z_:][a-z0-9_:]*", expr) if word.startswith("kvaudit_")}
            named |= {word for word in re.findall(r"[a-z_]+:[a-z0-9_:]+", expr)}
    assert named - recorded <= names, sorted(named - recorded - names)
    assert named & names and named & recorded  # the scan found both kinds


@needs_promtool
def test_kvaudit_s_sql_rules_say_what_they_are(tmp_path: Path):
    first = PACK.read_text().splitlines()[0]
    assert first.startswith("# kvaudit SQL rules") and "not Prometheus" in first
    assert yaml.safe_load(PACK.read_text())["kind"] == SQL_RULES_KIND
    refused = _promtool("check", "rules", PACK)
    assert refused.returncode != 0 and "field kind not found" in refused.stdout + refused.stderr
    assert load_default_pack()  # kvaudit reads the kind

    without = tmp_path / "without.yaml"
    without.write_text(re.sub(r"(?m)^kind: .*\n", "", PACK.read_text()))
    assert len(load_rules([without])) == len(load_default_pack())  # files without it load
    other = tmp_path / "prometheus.yaml"
    other.write_text(PACK.read_text().replace(f"kind: {SQL_RULES_KIND}", "kind: prometheus"))
    with pytest.raises(RuleFileError, match="kind 'prometheus': kvaudit reads kvaudit/sql-rules files"):
        load_rules([other])
