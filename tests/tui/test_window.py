"""Every panel answers for the window it shows; what is not known yet says so; 80x24 is usable.

Driven by Textual's pilot over trace files the deterministic fleet writes (tests/support/tui_fleet.py).
"""

from __future__ import annotations

import asyncio
import math
import threading
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.widgets import DataTable

from kvaudit.alerts.rules import load_default_pack
from kvaudit.backends import Backend
from kvaudit.read.store import TraceStore
from kvaudit.tui import cells
from kvaudit.tui.alerting import DEFAULT_PACK, rule_alerting
from kvaudit.tui.app import KvauditApp
from kvaudit.tui.figures import ReplicaFigures
from kvaudit.tui.reuse_left import LostRequest
from kvaudit.tui.screens.drill import DrillScreen
from kvaudit.tui.screens.help import HelpScreen
from kvaudit.tui.screens.lost_requests import LostRequestsScreen
from kvaudit.tui.source import AUDITING, EVALUATING, LiveSource
from kvaudit.tui.widgets.findings_table import FindingsTable
from kvaudit.tui.widgets.replica_table import ReplicaTable
from kvaudit.tui.widgets.sortable_table import Column, SortableTable
from kvaudit.tui.window import window_named

from ..support.tui_app import PACKED, UNPACKED, live_app, plant_bad_fetch, planted_layout_mismatch
from ..support.tui_auditor import ScriptedAuditor
from ..support.tui_fleet import Fleet, fleet_fixture  # noqa: F401 - the fixture
from ..support.waiting import until

SMALL = (80, 24)


def old_fault_then_quiet(fleet: Fleet) -> None:
    """A critical finding on r2, then ten quiet minutes, then clean traffic: the fault is outside 5m."""
    fleet.conversation("r1", "r2", 0)
    plant_bad_fetch(fleet)
    fleet.clock.advance(600)
    fleet.conversation("r1", "r2", 1)


def r2(app: KvauditApp) -> ReplicaFigures:
    assert app.main.figures is not None
    return next(r for r in app.main.figures.replicas if r.replica == "r2")


def test_findings_and_critical_counts_follow_the_window(fleet: Fleet, trace_dir: Path):
    old_fault_then_quiet(fleet)

    async def scenario() -> None:
        app = live_app(trace_dir, ScriptedAuditor([planted_layout_mismatch()]))
        async with app.run_test(size=(150, 45)) as pilot:
            findings = app.query_one(FindingsTable)
            await until(lambda: app.main.figures is not None and app.main.figures.findings_total == 1)
            assert app.main.figures.window == "5m"
            assert app.main.figures.findings == () and r2(app).critical_pages == 0
            await until(lambda: findings.row_count == 0)
            assert "0 in 5m · 1 in all" in str(app.query_one("#findings").border_subtitle)

            await pilot.press("4")
            await until(lambda: app.main.figures.window == "all" and findings.row_count == 1)
            assert r2(app).critical_pages == 1
            assert "1 in all · 1 in all" in str(app.query_one("#findings").border_subtitle)
            assert str(app.query_one("#findings").border_title) == "findings · all"

            await pilot.press("1")
            await until(lambda: app.main.figures.window == "1m" and findings.row_count == 0)
            assert r2(app).critical_pages == 0

    asyncio.run(scenario())


def test_snapshot_json_counts_the_windows_findings(fleet: Fleet, trace_dir: Path):
    old_fault_then_quiet(fleet)
    source = LiveSource(TraceStore([trace_dir], workers=1), auditor=ScriptedAuditor([planted_layout_mismatch()]))
    source.poll(window_named("5m"), final=True)
    five = source.analyse(window_named("5m"), force=True)
    assert five is not None and five.findings == () and five.findings_total == 1
    every = source.figures(window_named("all"))
    assert [f.code for f in every.findings or ()] == ["KVA004"]
    assert {r.replica: r.critical_pages for r in every.replicas}["r2"] == 1
    assert {r.replica: r.critical_pages for r in five.replicas}["r2"] == 0


class BlockedAuditor(ScriptedAuditor):
    """The scripted auditor, held until the test lets it finish: an audit that takes a while."""

    def __init__(self) -> None:
        super().__init__([planted_layout_mismatch()])
        self.release = threading.Event()
        self.started = threading.Event()

    def update(self, backend: Backend) -> bool:
        self.started.set()
        assert self.release.wait(30), "the test never released the audit"
        return super().update(backend)


def test_not_yet_audited_is_not_zero(fleet: Fleet, trace_dir: Path):
    fleet.conversation("r1", "r2", 0)
    plant_bad_fetch(fleet)
    auditor = BlockedAuditor()

    async def scenario() -> None:
        app = live_app(trace_dir, auditor)
        try:
            async with app.run_test(size=SMALL):
                await until(lambda: app.main.figures is not None and auditor.started.is_set())
                await until(lambda: app.main.auditing)
                figures = app.main.figures
                assert figures.findings is None and figures.findings_pending and figures.findings_note == AUDITING
                assert r2(app).critical_pages is None and r2(app).critical_pending
                table = app.query_one(ReplicaTable)
                critical = table.shown_columns.index("critical")
                shown = {str(table.get_row_at(i)[0]): table.get_row_at(i)[critical] for i in range(table.row_count)}
                assert isinstance(shown["r2"], Text) and shown["r2"].plain == "…"  # not 0
                assert "auditing…" in str(app.query_one("#findings").border_title)
                assert "auditing…" in str(app.query_one("StatusBar").render())

                auditor.release.set()
                await until(lambda: not app.main.auditing and app.main.figures.findings is not None)
                assert r2(app).critical_pages == 1 and not r2(app).critical_pending
                assert str(app.query_one("#findings").border_title) == "findings · 5m"
        finally:
            auditor.release.set()

    asyncio.run(scenario())


def test_alerts_use_the_default_pack_and_say_so(fleet: Fleet, trace_dir: Path):
    fleet.conversation("r1", "r2", 0)
    plant_bad_fetch(fleet)
    alerting = rule_alerting(None)
    assert alerting.name == DEFAULT_PACK
    assert [g.name for g in alerting.engine.groups] == [g.name for g in load_default_pack()]
    source = LiveSource(
        TraceStore([trace_dir], workers=1),
        auditor=ScriptedAuditor([planted_layout_mismatch()]),
        alerting=alerting,
        alerts_source=alerting.name,
        audit_interval_s=0,
    )
    before = source.poll(window_named("all"))
    assert before.alerts is None and before.alerts_note == EVALUATING  # on its way, not "nothing firing"

    async def scenario() -> None:
        app = KvauditApp(source, watching=str(trace_dir), interval_s=0.25)
        async with app.run_test(size=SMALL):
            await until(lambda: app.main.figures is not None and app.main.figures.alerts)
            assert str(app.query_one("#alerts").border_title) == "alerts: default rule pack"
            # The planted critical finding, through the pack's rule over the `findings` view.
            assert [(a.name, a.state) for a in app.main.figures.alerts] == [("KVAuditCriticalFinding", "firing")]

    asyncio.run(scenario())


def test_80x24_shows_the_columns_that_matter_and_the_rest_on_demand(fleet: Fleet, trace_dir: Path):
    for n in range(3):
        fleet.conversation("r1", "r2", n)
        fleet.conversation("r2", "r3", 10 + n)
    plant_bad_fetch(fleet)

    async def scenario() -> None:
        app = live_app(trace_dir, ScriptedAuditor([planted_layout_mismatch()]))
        async with app.run_test(size=SMALL) as pilot:
            findings = app.query_one(FindingsTable)
            replicas = app.query_one(ReplicaTable)
            await until(lambda: findings.row_count == 1 and replicas.row_count == 3)
            await pilot.pause(0.3)
            assert replicas.shown_columns[:4] == ["replica", "critical", "hit rate", "hit tokens"]
            assert len(replicas.shown_columns) < len(ReplicaTable.COLUMNS)  # the rest on demand
            for table in (replicas, findings):
                assert table.virtual_size.width <= table.scrollable_content_region.width, table.id
            assert findings.shown_columns[:5] == ["severity", "code", "replica", "key", "message"]
            assert findings.size.height >= 7  # a short screen gives the findings the height it has

            replicas.focus()
            await pilot.press("c")
            await until(lambda: replicas.shown_columns == [c.label for c in ReplicaTable.COLUMNS])
            await pilot.press("c")
            await until(lambda: len(replicas.shown_columns) < len(ReplicaTable.COLUMNS))

            findings.focus()
            height = findings.size.height
            await pilot.press("z")
            await until(lambda: findings.size.height > height + 8)
            assert not app.query_one("#replicas").display
            await pilot.press("z")
            await until(lambda: findings.size.height == height)

    asyncio.run(scenario())


class Keys(SortableTable[str]):
    COLUMNS: ClassVar = (Column("key", cells.plain, str), Column("n", lambda k: cells.plain(len(k)), len))

    def row_key(self, item: str) -> str:
        return item


def test_a_table_drawn_before_it_measures_shows_its_columns_whole():
    """The screen may draw a table between its rows arriving and its idle (a loaded machine
    does): lines drawn at the labels' widths then stayed in DataTable's render cache (`KVA0`)."""

    class Host(App[None]):
        CSS = "Keys { height: 1fr; }"  # as the findings panel's: rows arriving resize nothing

        def compose(self) -> ComposeResult:
            yield Keys()

    async def scenario() -> None:
        app = Host()
        async with app.run_test(size=(40, 6)) as pilot:
            table = app.query_one(Keys)
            await pilot.pause()
            table.show(["bad0bad0bad0", "7e577e577e577e57"])
            table.render_lines(Region(0, 0, table.size.width, table.size.height))  # drawn before the idle
            await pilot.pause()
            lines = [strip.text for strip in table.render_lines(Region(0, 0, table.size.width, 3))]
            assert [line.rstrip() for line in lines] == [
                " key ▲             n",
                " 7e577e577e577e57  16",
                " bad0bad0bad0      12",
            ]

    asyncio.run(scenario())


def test_a_loading_screens_table_drawn_before_it_measures_shows_its_columns_whole():
    """The drill-down screens' tables (`LoadingScreen.fill`: the requests that lost reuse, a
    request's explain) take their rows at once, the same way: drawn before DataTable's idle,
    their lines stayed at the labels' widths (the request id cut to `req-7e5`)."""
    requests = [LostRequest("req-7e577e577e57", 0, 1024, 256, 1024, 768, {"evicted": 768})]
    loaded: list[LostRequest] = []  # the screen's own load finds nothing; the rows come later

    class Host(App[None]):
        def on_mount(self) -> None:
            self.push_screen(LostRequestsScreen("r1", "5m", lambda _: loaded, lambda *_: None))

    async def scenario() -> None:
        app = Host()
        async with app.run_test(size=(100, 8)) as pilot:
            await until(lambda: isinstance(app.screen, LostRequestsScreen))
            screen = app.screen
            assert isinstance(screen, LostRequestsScreen)
            await until(lambda: "no request" in str(screen.query_one("#requests").border_subtitle))
            table = screen.query_one(DataTable)
            screen.show(requests)
            table.render_lines(Region(0, 0, table.size.width, table.size.height))  # drawn before the idle
            await pilot.pause()
            lines = [strip.text.rstrip() for strip in table.render_lines(Region(0, 0, table.size.width, 2))]
            assert lines == [
                " request           lost tok  hit tok  achievable tok  prompt tok  lost most to",
                " req-7e577e577e57  768       256      1024            1024        evicted",
            ]

    asyncio.run(scenario())


def test_80x24_drill_down_wraps_values_whole(fleet: Fleet, trace_dir: Path):
    fleet.conversation("r1", "r2", 0)
    plant_bad_fetch(fleet)

    async def scenario() -> None:
        app = live_app(trace_dir, ScriptedAuditor([planted_layout_mismatch()]))
        async with app.run_test(size=SMALL) as pilot:
            await until(lambda: app.query_one(FindingsTable).row_count == 1)
            await pilot.press("enter")
            await until(lambda: isinstance(app.screen, DrillScreen))
            table = app.screen.query_one("DataTable")
            await until(lambda: table.row_count > 0)
            assert [str(c) for c in table.get_row("layout")] == ["layout", "▶ finding", UNPACKED, PACKED]
            assert table.virtual_size.width <= table.size.width  # nothing beyond the right edge
            key = str(table.get_row("key")[2])
            width = table.ordered_columns[2].width
            assert len(key) == 64 and width < len(key)
            assert table.rows["key"].height == math.ceil(len(key) / width)  # wrapped onto its lines, whole

    asyncio.run(scenario())


def test_80x24_help_fits(fleet: Fleet, trace_dir: Path):
    fleet.conversation("r1", "r2", 0)

    async def scenario() -> None:
        app = live_app(trace_dir, None)
        async with app.run_test(size=SMALL) as pilot:
            await pilot.press("question_mark")
            await until(lambda: isinstance(app.screen, HelpScreen))
            await pilot.pause(0.2)
            box = app.screen.query_one("Vertical").region
            assert box.x >= 0 and box.right <= SMALL[0] and box.y >= 0 and box.bottom <= SMALL[1]

    asyncio.run(scenario())
