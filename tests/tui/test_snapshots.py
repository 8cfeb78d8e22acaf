"""Snapshots of the TUI's screens (pytest-textual-snapshot): layout regressions show as SVG diffs.

The traces come from the deterministic fleet (fixed clock, fixed ids), so every run
draws the same screen. Update after a deliberate change with `pytest --snapshot-update`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from msgspec.structs import replace
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import DataTable

from kvaudit.read.store import TraceStore
from kvaudit.tui.alerting import AlertRow
from kvaudit.tui.app import KvauditApp
from kvaudit.tui.screens.drill import DrillScreen
from kvaudit.tui.source import LiveSource
from kvaudit.tui.widgets.findings_table import FindingsTable

from ..support.pages import full_page
from ..support.tui_app import plant_bad_fetch, planted_layout_mismatch
from ..support.tui_auditor import Planted, ScriptedAuditor
from ..support.tui_fleet import Fleet, fleet_fixture  # noqa: F401 - the fixture
from ..support.waiting import until

SIZE = (150, 40)
REJECTED_KEY = "7e57" * 16
ALERTS = (
    AlertRow(
        "KvauditCriticalFinding",
        "firing",
        "page",
        (("replica", "r2"), ("severity", "page")),
        "r2 used a page that fails the audit: open the finding",
        1.0,
    ),
    AlertRow("KvauditSafeMisses", "pending", "ticket", (("replica", "r3"), ("severity", "ticket")), "", 1.0),
)


def busy_fleet(fleet: Fleet) -> ScriptedAuditor:
    """Three replicas reusing each other's pages, one misread page used, one rejected."""
    for n in range(4):
        fleet.conversation("r1", "r2", n)
        fleet.conversation("r2", "r3", 10 + n, pages=2)
    plant_bad_fetch(fleet)
    fleet.store("r2", "rej-t1", [REJECTED_KEY])
    rejected = replace(full_page(REJECTED_KEY, 0, used=False), dtype="float8_e4m3fn")
    fleet.fetch("r3", "rej-t2", [rejected], requested_pages=1)
    return ScriptedAuditor(
        [
            planted_layout_mismatch(),
            Planted(
                key=REJECTED_KEY,
                code="KVA005",
                rule="incompatible-consumer",
                severity="warning",
                fields={"dtype": {"fetched": "float8_e4m3fn", "stored": "bfloat16", "consumer": "bfloat16"}},
                message="page dtype differs from the consumer's (rejected: a safe miss)",
                producer="r2",
            ),
        ]
    )


def snapshot_app(trace_dir: Path, auditor: ScriptedAuditor | None, alerts: bool = False) -> KvauditApp:
    source = LiveSource(
        TraceStore([trace_dir], workers=1),
        auditor=auditor,
        alerting=(lambda backend: ALERTS) if alerts else None,
        audit_interval_s=0,
    )
    return KvauditApp(source, watching="traces/", interval_s=0.2)


def _measuring(app: App[object]) -> bool:
    # A DataTable measures new rows' columns when its message queue is next empty (its
    # `_on_idle`), which a loaded machine can put off past several frames.
    return any(
        getattr(table, "_require_update_dimensions", False) or getattr(table, "_updated_cells", None)
        for table in app.query(DataTable)
    )


async def settle(pilot: Pilot, frames: int = 3) -> None:
    """Rows arrive before a table re-measures its columns, later still on a loaded machine:
    wait until no table has rows left to measure, and the screen stays the same for
    `frames` frames in a row, before a shot."""
    await until(lambda: not _measuring(pilot.app))
    still, previous = 0, None
    for _ in range(200):
        await pilot.pause(0.02)
        frame = pilot.app.export_screenshot()
        still = still + 1 if frame == previous and not _measuring(pilot.app) else 0
        if still >= frames:
            return
        previous = frame


def pressing(*keys: str) -> Callable[[Pilot], Awaitable[None]]:
    """Press `keys` inside `run_before`, so that the layout settles before the shot."""

    async def press(pilot: Pilot) -> None:
        await pilot.press(*keys)

    return press


def loaded(findings: int, then: Callable[[Pilot], Awaitable[None]] | None = None) -> Callable[[Pilot], Awaitable[None]]:
    async def run_before(pilot: Pilot) -> None:
        app = pilot.app
        assert isinstance(app, KvauditApp)
        await until(lambda: app.main.figures is not None and app.query_one(FindingsTable).row_count == findings)
        await settle(pilot)
        if then is not None:
            await then(pilot)
            await settle(pilot)

    return run_before


def test_main_screen(snap_compare, fleet: Fleet, trace_dir: Path):
    app = snapshot_app(trace_dir, busy_fleet(fleet), alerts=True)
    assert snap_compare(app, terminal_size=SIZE, run_before=loaded(2))


def test_main_screen_without_auditor(snap_compare, fleet: Fleet, trace_dir: Path):
    busy_fleet(fleet)
    app = snapshot_app(trace_dir, None)
    assert snap_compare(app, terminal_size=SIZE, run_before=loaded(0, pressing("4")))


def drill_into(*keys: str) -> Callable[[Pilot], Awaitable[None]]:
    """Select a finding with `keys`, open it, and wait for its descriptors."""

    async def drill(pilot: Pilot) -> None:
        await pilot.press(*keys, "enter")
        await until(lambda: isinstance(pilot.app.screen, DrillScreen))
        await until(lambda: pilot.app.screen.query_one("DataTable").row_count > 0)

    return drill


def test_drill_down_screen(snap_compare, fleet: Fleet, trace_dir: Path):
    app = snapshot_app(trace_dir, busy_fleet(fleet))
    assert snap_compare(app, terminal_size=SIZE, run_before=loaded(2, drill_into()))


def test_drill_down_against_the_consumer(snap_compare, fleet: Fleet, trace_dir: Path):
    """The second finding compares with the consumer's own configuration: a consumer column shows."""
    app = snapshot_app(trace_dir, busy_fleet(fleet))
    assert snap_compare(app, terminal_size=SIZE, run_before=loaded(2, drill_into("down")))


def test_filtered_and_paused(snap_compare, fleet: Fleet, trace_dir: Path):
    async def filter_and_pause(pilot: Pilot) -> None:
        await pilot.press("slash", *"replica:r3", "enter", "p")
        await until(lambda: pilot.app.query_one(FindingsTable).row_count == 1)

    app = snapshot_app(trace_dir, busy_fleet(fleet))
    assert snap_compare(app, terminal_size=SIZE, run_before=loaded(2, filter_and_pause))


def test_help_screen(snap_compare, fleet: Fleet, trace_dir: Path):
    app = snapshot_app(trace_dir, busy_fleet(fleet))
    assert snap_compare(app, terminal_size=SIZE, run_before=loaded(2, pressing("question_mark")))


# The smallest terminal kvaudit is made for: the columns that matter, values wrapped, help inside.
SMALL = (80, 24)


def test_main_screen_80x24(snap_compare, fleet: Fleet, trace_dir: Path):
    app = snapshot_app(trace_dir, busy_fleet(fleet), alerts=True)
    assert snap_compare(app, terminal_size=SMALL, run_before=loaded(2))


def test_drill_down_80x24(snap_compare, fleet: Fleet, trace_dir: Path):
    app = snapshot_app(trace_dir, busy_fleet(fleet))
    assert snap_compare(app, terminal_size=SMALL, run_before=loaded(2, drill_into()))


def test_help_screen_80x24(snap_compare, fleet: Fleet, trace_dir: Path):
    app = snapshot_app(trace_dir, busy_fleet(fleet))
    assert snap_compare(app, terminal_size=SMALL, run_before=loaded(2, pressing("question_mark")))


def test_zoomed_findings_80x24(snap_compare, fleet: Fleet, trace_dir: Path):
    app = snapshot_app(trace_dir, busy_fleet(fleet))
    assert snap_compare(app, terminal_size=SMALL, run_before=loaded(2, pressing("z")))


def test_window_without_the_findings_80x24(snap_compare, fleet: Fleet, trace_dir: Path):
    """The findings happened more than a minute before the latest operation: the 1m window shows none."""
    auditor = busy_fleet(fleet)
    fleet.clock.advance(120)
    fleet.conversation("r1", "r3", 30)
    app = snapshot_app(trace_dir, auditor)
    assert snap_compare(app, terminal_size=SMALL, run_before=loaded(2, pressing("1")))
