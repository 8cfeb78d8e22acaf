"""The live app, driven by Textual's pilot over trace files that grow while it runs."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from pathlib import Path

import pytest

from kvaudit.read.store import TraceStore
from kvaudit.simulator.engine import GIB, SimConfig, simulate
from kvaudit.tui.screens.drill import DrillScreen
from kvaudit.tui.screens.explain import ExplainScreen
from kvaudit.tui.screens.lost_requests import LostRequestsScreen
from kvaudit.tui.widgets.findings_table import FindingsTable
from kvaudit.tui.widgets.replica_table import ReplicaTable

from ..support.tui_app import (
    PACKED,
    UNPACKED,
    live_app,
    plant_bad_fetch,
    planted_layout_mismatch,
    replicas_shown,
)
from ..support.tui_auditor import ScriptedAuditor
from ..support.tui_fleet import Fleet, fleet_fixture  # noqa: F401 - the fixture
from ..support.waiting import until


def test_rows_appear_as_the_files_grow(fleet: Fleet, trace_dir: Path):
    async def scenario() -> None:
        fleet.conversation("r1", "r2", 0)
        app = live_app(trace_dir, ScriptedAuditor())
        async with app.run_test(size=(150, 45)):
            await until(lambda: replicas_shown(app) == ["r1", "r2"])
            fleet.conversation("r1", "r3", 1)
            await until(lambda: "r3" in replicas_shown(app))
            assert app.main.figures is not None
            r3 = next(r for r in app.main.figures.replicas if r.replica == "r3")
            assert r3.cross_replica_hit_tokens == 3 * 32

    asyncio.run(scenario())


def test_critical_finding_shows_and_drills_down(fleet: Fleet, trace_dir: Path):
    async def scenario() -> None:
        fleet.conversation("r1", "r2", 0)
        app = live_app(trace_dir, ScriptedAuditor([planted_layout_mismatch()]))
        async with app.run_test(size=(150, 45)) as pilot:
            await until(lambda: app.main.figures is not None and app.main.figures.findings == ())
            plant_bad_fetch(fleet)
            findings = app.query_one(FindingsTable)
            await until(lambda: findings.row_count == 1)
            r2 = next(r for r in app.main.figures.replicas if r.replica == "r2")
            assert r2.critical_pages == 1
            assert "CRITICAL" in str(findings.get_row_at(0)[0])

            await pilot.press("enter")
            await until(lambda: isinstance(app.screen, DrillScreen))
            drill = app.screen
            await until(lambda: drill.query_one("DataTable").row_count > 0)
            table = drill.query_one("DataTable")
            layout = table.get_row("layout")
            assert [str(c) for c in layout] == ["layout", "▶ finding", UNPACKED, PACKED]
            assert [str(c) for c in table.get_row("model")] == ["model", "", "tiny-llama", "tiny-llama"]

            await pilot.press("escape")
            await until(lambda: not isinstance(app.screen, DrillScreen))

    asyncio.run(scenario())


def test_a_replica_drills_down_to_its_worst_requests_and_one_requests_explain(tmp_path: Path):
    # Small private pools split by round-robin routing: requests lose reuse to routing and eviction.
    config = SimConfig(duration_s=60, rate=0.5, seed=3, shared=False, pool_bytes=16 * GIB)
    result = simulate(config, tmp_path / "sim")
    r1 = [r for r in result.requests if r.replica == "r1"]
    most_lost = max(r.achievable_tokens - r.used_tokens for r in r1)
    assert most_lost > 0

    async def scenario() -> None:
        app = live_app(result.files[0].parent, None)
        async with app.run_test(size=(150, 45)) as pilot:
            await until(lambda: replicas_shown(app) == ["r1", "r2"])
            replicas = app.query_one(ReplicaTable)
            replicas.focus()
            replicas.move_cursor(row=0)
            await pilot.press("enter")
            await until(lambda: isinstance(app.screen, LostRequestsScreen))
            assert app.screen.window == "5m"  # the main screen's: it holds the whole minute simulated
            requests = app.screen.query_one("DataTable")
            await until(lambda: requests.row_count > 0)
            assert requests.row_count == len(r1)  # fewer than the screen's 100
            worst = str(requests.get_row_at(0)[0])
            [record] = [r for r in r1 if r.request_id == worst]
            assert record.achievable_tokens - record.used_tokens == most_lost
            assert str(requests.get_row_at(0)[1]) == str(most_lost)

            await pilot.press("enter")
            await until(lambda: isinstance(app.screen, ExplainScreen))
            pages = app.screen.query_one("DataTable")
            await until(lambda: pages.row_count > 0)
            truth = [p.cause.value for p in result.pages if p.request_id == worst]
            assert [str(pages.get_row_at(i)[2]) for i in range(pages.row_count)] == truth
            shown = app.export_screenshot().replace("&#160;", " ")
            assert "left on the table" in shown and f"explain {worst} on r1" in shown

            await pilot.press("escape")
            await until(lambda: isinstance(app.screen, LostRequestsScreen))
            await pilot.press("escape")
            await until(lambda: app.screen is app.main)

    asyncio.run(scenario())


def test_figures_older_than_those_shown_are_dropped(fleet: Fleet, trace_dir: Path):
    """The reading and the analysing workers hand their figures to the screen in either
    order: figures computed before the findings arrived must not take them away again."""

    async def scenario() -> None:
        fleet.conversation("r1", "r2", 0)
        plant_bad_fetch(fleet)
        app = live_app(trace_dir, ScriptedAuditor([planted_layout_mismatch()]))
        async with app.run_test(size=(150, 45)) as pilot:
            findings = app.query_one(FindingsTable)
            await until(lambda: findings.row_count == 1)
            shown = app.main.figures
            assert shown is not None and shown.serial > 0
            app.main.paused = True  # no newer figures meanwhile
            app.main._show(dataclasses.replace(shown, serial=shown.serial - 1, findings=()))
            await pilot.pause()
            assert app.main.figures is shown and findings.row_count == 1

    asyncio.run(scenario())


def test_filter_narrows_every_panel(fleet: Fleet, trace_dir: Path):
    async def scenario() -> None:
        fleet.conversation("r1", "r2", 0)
        fleet.conversation("r1", "r3", 1)
        plant_bad_fetch(fleet)
        app = live_app(trace_dir, ScriptedAuditor([planted_layout_mismatch()]))
        async with app.run_test(size=(150, 45)) as pilot:
            findings = app.query_one(FindingsTable)
            await until(lambda: replicas_shown(app) == ["r1", "r2", "r3"] and findings.row_count == 1)

            await pilot.press("slash", *"replica:r3", "enter")
            await until(lambda: replicas_shown(app) == ["r3"])
            assert findings.row_count == 0

            await pilot.press("slash", *"rule:KVA004", "enter")
            await until(lambda: replicas_shown(app) == ["r1", "r2", "r3"] and findings.row_count == 1)
            await pilot.press("slash", *"rule:KVA001", "enter")
            await until(lambda: findings.row_count == 0)

            await pilot.press("escape")
            await until(lambda: findings.row_count == 1 and not app.main.view_filter)

    asyncio.run(scenario())


def test_pause_freezes_the_view_until_resumed(fleet: Fleet, trace_dir: Path):
    async def scenario() -> None:
        fleet.conversation("r1", "r2", 0)
        app = live_app(trace_dir, ScriptedAuditor())
        async with app.run_test(size=(150, 45)) as pilot:
            await until(lambda: replicas_shown(app) == ["r1", "r2"])
            await pilot.press("p")
            fleet.conversation("r1", "r4", 1)
            await asyncio.sleep(0.5)
            assert replicas_shown(app) == ["r1", "r2"]
            assert "PAUSED" in str(app.query_one("StatusBar").render())
            await pilot.press("p")
            await until(lambda: "r4" in replicas_shown(app))

    asyncio.run(scenario())


def test_window_and_sort_keys(fleet: Fleet, trace_dir: Path):
    async def scenario() -> None:
        for n in range(3):
            fleet.conversation("r1", "r2", n)
        fleet.clock.advance(600)  # ten quiet minutes, then one more conversation
        fleet.conversation("r3", "r1", 3)
        app = live_app(trace_dir, None)
        async with app.run_test(size=(150, 45)) as pilot:
            await until(lambda: app.main.figures is not None and app.main.figures.window == "5m")
            assert next(r for r in app.main.figures.replicas if r.replica == "r2").requests == 0
            await pilot.press("4")
            await until(lambda: app.main.figures.window == "all")
            assert next(r for r in app.main.figures.replicas if r.replica == "r2").requests == 3
            assert "not audited" in str(app.query_one("#findings").border_title)

            table = app.query_one(ReplicaTable)
            table.focus()
            await pilot.press("s")  # replica name → requests, busiest first
            await until(lambda: replicas_shown(app)[0] in ("r1", "r2") and table.sort_index == 1)
            assert replicas_shown(app)[-1] == "r3"

    asyncio.run(scenario())


@pytest.mark.parametrize("key", ["question_mark"])
def test_help_opens_and_closes(fleet: Fleet, trace_dir: Path, key: str):
    async def scenario() -> None:
        fleet.conversation("r1", "r2", 0)
        app = live_app(trace_dir, None)
        async with app.run_test(size=(150, 45)) as pilot:
            await pilot.press(key)
            await until(lambda: type(app.screen).__name__ == "HelpScreen")
            await pilot.press("escape")
            await until(lambda: app.screen is app.main)
            await pilot.press("q")

    asyncio.run(scenario())


def test_a_replicas_lost_requests_are_those_looked_up_in_the_window(tmp_path: Path):
    from kvaudit.backends.duckdb_backend import DuckDBBackend
    from kvaudit.tui.reuse_left import lost_requests

    config = SimConfig(duration_s=60, rate=0.5, seed=3, shared=False, pool_bytes=16 * GIB)
    result = simulate(config, tmp_path / "sim")
    store = TraceStore(result.files)
    store.refresh()
    try:
        backend = DuckDBBackend(store)
        every = lost_requests(backend, "r1")
        since = sorted(request.lookup_ns for request in every)[len(every) // 2]
        later = lost_requests(backend, "r1", since)
    finally:
        store.close()
    assert 0 < len(later) < len(every)
    # The same requests with the same figures: each is still explained over all the traces.
    assert sorted(later, key=lambda r: r.request_id) == sorted(
        (request for request in every if request.lookup_ns >= since), key=lambda r: r.request_id
    )


def test_at_80x24_every_key_shows_ctrl_c_quits_and_the_alerts_panel_scrolls(fleet: Fleet, trace_dir: Path):
    from textual.containers import VerticalScroll
    from textual.widgets._footer import FooterKey

    from kvaudit.tui.alerting import AlertRow
    from kvaudit.tui.app import KvauditApp
    from kvaudit.tui.source import LiveSource

    alerts = tuple(
        AlertRow(f"KVAuditAlert{i}", "firing", "warning", (("replica", f"r{i}"),), "a summary of a line", 1.0)
        for i in range(8)
    )

    async def scenario() -> None:
        fleet.conversation("r1", "r2", 0)
        store = TraceStore([trace_dir], workers=1)
        source = LiveSource(store, auditor=None, alerting=lambda backend: alerts, audit_interval_s=0)
        app = KvauditApp(source, watching=str(trace_dir), interval_s=0.25)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(lambda: app.main.figures is not None and app.main.figures.alerts == alerts)
            await pilot.pause()
            keys = sorted((key.region for key in app.screen.query(FooterKey)), key=lambda region: region.x)
            assert {key.key_display for key in app.screen.query(FooterKey)} >= {"q", "?", "p", "/", "z", "1-4"}
            assert all(region.width > 0 and region.right <= 80 for region in keys)  # none cut
            assert all(a.right <= b.x for a, b in itertools.pairwise(keys))  # none covering another

            panel = app.query_one("#alerts", VerticalScroll)
            for _ in range(6):
                if app.focused is panel:
                    break
                await pilot.press("tab")
            assert app.focused is panel
            assert panel.max_scroll_y > 0  # 8 alerts are more than fit
            await pilot.press("end")
            await until(lambda: panel.scroll_y == panel.max_scroll_y)

            await pilot.press("ctrl+c")
            await until(lambda: not app.is_running)

    asyncio.run(scenario())
