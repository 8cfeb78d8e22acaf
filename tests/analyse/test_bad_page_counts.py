"""One bad page, one critical: the report's headline, the TUI's critical column and the
`KVAuditCriticalFinding` alert count the demo fleet's bad pages, as many as the simulator injected.

The demo fleet (`kvaudit demo`'s) injects raw-pointer pages (rules KVA001 and KVA002 both
fire on each) and a rolling upgrade whose old pages the new layout cannot read (KVA005
and KVA008 on each): rule hits outnumber pages, and every count a person is shown is of pages.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvaudit.alerts.engine import RuleEngine
from kvaudit.alerts.instances import AlertState
from kvaudit.alerts.rules import load_default_pack
from kvaudit.analyse.audit import Finding, pages_found, run_audit
from kvaudit.backends import as_backend
from kvaudit.commands.demo import demo_config
from kvaudit.present.report import gather, headline
from kvaudit.read.store import TraceStore
from kvaudit.simulator.engine import TRACES_DIR, SimResult, simulate
from kvaudit.tui.figures import Analysis, compute_figures
from kvaudit.tui.findings import FindingRow
from kvaudit.tui.window import window_named


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimResult, TraceStore, list[Finding]]]:
    out: Path = tmp_path_factory.mktemp("demo")
    result = simulate(demo_config(), out)
    store = TraceStore([out / TRACES_DIR])
    store.refresh()
    yield result, store, run_audit(store)
    store.close()


def _bad_pages(result: SimResult) -> dict[str, int]:
    """The used faulty pages the simulator injected, per replica."""
    pages: dict[str, set[tuple[str, str]]] = {}
    for truth in result.ground_truth:
        if truth.used:
            pages.setdefault(truth.replica, set()).add((truth.trace_id, truth.key))
    return {replica: len(keys) for replica, keys in pages.items()}


def test_rules_fire_more_often_than_there_are_bad_pages(demo):
    result, _, findings = demo
    critical = [f for f in findings if f.severity == "critical"]
    pages = pages_found(findings, "critical")
    assert len(pages) == sum(_bad_pages(result).values()) > 0
    assert len(critical) > len(pages)
    assert {page.rules for page in pages} >= {("KVA001", "KVA002"), ("KVA005", "KVA008")}


def test_the_report_headline_counts_critical_pages(demo):
    result, store, _ = demo
    figures = {figure.name: figure for figure in headline(gather(store))}
    critical = figures["critical_pages"]
    assert critical.label == "critical pages"
    assert critical.value == sum(_bad_pages(result).values())
    assert "KVA001, KVA002, KVA005, KVA008" in critical.note


def test_the_tui_critical_column_counts_pages(demo):
    result, store, findings = demo
    analysis = Analysis(findings=tuple(FindingRow.of(finding) for finding in findings))
    figures = compute_figures(as_backend(store), window_named("all"), analysis=analysis, indexed=False)
    assert {r.replica: r.critical_pages for r in figures.replicas if r.critical_pages} == _bad_pages(result)


def test_the_alert_fires_once_per_replica_counting_pages(demo):
    result, store, _ = demo
    alerts = RuleEngine(load_default_pack()).evaluate(store)
    critical = [a for a in alerts if a.alertname == "KVAuditCriticalFinding" and a.state is AlertState.FIRING]
    assert {a.labels["replica"]: a.value for a in critical} == _bad_pages(result)
    assert {a.labels["rule"] for a in critical} <= {"KVA001,KVA002", "KVA001,KVA002,KVA005,KVA008", "KVA005,KVA008"}
