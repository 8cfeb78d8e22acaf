"""The figures behind the panels, over traces written by a deterministic fleet."""

from __future__ import annotations

from pathlib import Path

from msgspec.structs import replace

from kvaudit.read.store import TraceStore
from kvaudit.tui.source import LiveSource
from kvaudit.tui.window import window_named

from ..support.pages import full_page
from ..support.tui_fleet import Fleet, fleet_fixture  # noqa: F401 - the fixture


def test_replica_and_reuse_figures(fleet: Fleet, trace_dir: Path):
    for n in range(3):
        fleet.conversation("r1", "r2", n)
    rejected = replace(full_page("ab" * 32, 0, used=False), layout="NB_2_BS_NH_HS")
    fleet.fetch("r2", "c9-t2", [rejected], requested_pages=1)
    figures = LiveSource(TraceStore([trace_dir], workers=1), auditor=None).poll(window_named("all"))
    by_name = {r.replica: r for r in figures.replicas}
    assert set(by_name) == {"r1", "r2"}
    r2 = by_name["r2"]
    assert r2.requests == 4
    assert r2.cross_replica_hit_tokens == 3 * 3 * 32
    assert r2.rejected_pages == 1
    assert r2.hit_rate == 9 / 10
    assert r2.critical_pages is None
    assert sum(r2.activity) == 9 * 32
    assert by_name["r1"].hit_rate == 0
    cells = {(c.producer, c.consumer): c for c in figures.reuse}
    assert cells[("r1", "r2")].used_pages == 9
    assert cells[(None, "r2")].rejected_pages == 1
    assert figures.pages_loaded == 9 + 9 + 1


def test_store_read_after_its_fetch_still_names_the_producer(fleet: Fleet, trace_dir: Path):
    key = "5e" * 32
    fleet.fetch("r2", "late-t2", [full_page(key, 0, used=True)], requested_pages=1)
    source = LiveSource(TraceStore([trace_dir], workers=1), auditor=None, skew_s=1.0)
    cells = {(c.producer, c.consumer) for c in source.poll(window_named("all")).reuse}
    assert cells == {(None, "r2")}
    # r1's clock runs half a second ahead: its store lands after the fetch, within the skew.
    fleet.clock.advance(0.5)
    fleet.store("r1", "late-t1", [key])
    cells = {(c.producer, c.consumer) for c in source.poll(window_named("all")).reuse}
    assert cells == {("r1", "r2")}


def test_the_pages_prevention_kept_apart_are_counted_by_the_analysis_not_each_refresh(fleet: Fleet, trace_dir: Path):
    """A prevented key carries its geometry's tag (docs/design.md section 4.5): two geometries
    storing the same tokens are one page prevention kept apart. Counting them reads every
    store, so the analysis does, beside the audit; a refresh shows the last count."""
    clock = [0.0]
    tokens = "7a" * 32
    fleet.store("r1", "p-t1", [f"{tokens}@kvaudit_geometry%aaaa"])
    fleet.store("r2", "p-t2", [f"{tokens}@kvaudit_geometry%bbbb"])
    source = LiveSource(TraceStore([trace_dir], workers=1), auditor=None, clock=lambda: clock[0])
    assert source.poll(window_named("all")).prevented_pages == 0  # not counted yet
    analysed = source.analyse(window_named("all"))
    assert analysed is not None and analysed.prevented_pages == 1
    fleet.store("r3", "p-t3", [f"{tokens}@kvaudit_geometry%cccc"])
    assert source.poll(window_named("all")).prevented_pages == 1  # the last count, until the next analysis
    assert source.analyse(window_named("all")) is None  # its interval has not passed
    clock[0] += 5.0
    analysed = source.analyse(window_named("all"))
    assert analysed is not None and analysed.prevented_pages == 2
