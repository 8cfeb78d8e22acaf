"""The per-replica table: trouble, reuse and traffic first (a hit sparkline over the window), transfer speed after."""

from __future__ import annotations

from typing import ClassVar

from textual.reactive import reactive

from kvaudit.tui import cells
from kvaudit.tui.figures import Figures, ReplicaFigures
from kvaudit.tui.filtering import Filter
from kvaudit.tui.widgets.sortable_table import Column, SortableTable


def _none_last(value: float | int | None) -> float:
    return float("-inf") if value is None else float(value)


class ReplicaTable(SortableTable[ReplicaFigures]):
    # By importance: what is wrong, whether reuse pays, how busy; transfer speed after.
    COLUMNS: ClassVar = (
        Column("replica", lambda r: cells.plain(r.replica), lambda r: r.replica),
        Column(
            "critical",
            lambda r: cells.alarm(r.critical_pages, style="bold white on red", pending=r.critical_pending),
            lambda r: _none_last(r.critical_pages),
            descending=True,
        ),
        Column("hit rate", lambda r: cells.percent(r.hit_rate), lambda r: _none_last(r.hit_rate), descending=True),
        Column("hit tokens", lambda r: cells.sparkline(r.activity), lambda r: sum(r.activity), descending=True),
        Column("rejected", lambda r: cells.alarm(r.rejected_pages, style="yellow"), lambda r: r.rejected_pages, True),
        Column("requests", lambda r: cells.count(r.requests), lambda r: r.requests, descending=True),
        Column(
            "cross hit tok",
            lambda r: cells.count(r.cross_replica_hit_tokens),
            lambda r: r.cross_replica_hit_tokens,
            descending=True,
        ),
        Column(
            "p99 fetch", lambda r: cells.number(r.p99_fetch_ms, "ms", 1), lambda r: _none_last(r.p99_fetch_ms), True
        ),
        Column("fetch GB/s", lambda r: cells.number(r.fetch_gbps, "GB/s"), lambda r: _none_last(r.fetch_gbps), True),
    )

    figures: reactive[Figures | None] = reactive(None, init=False)
    view_filter: reactive[Filter] = reactive(Filter, init=False)

    def row_key(self, item: ReplicaFigures) -> str:
        return item.replica

    def watch_figures(self) -> None:
        self._update()

    def watch_view_filter(self) -> None:
        self._update()

    def _update(self) -> None:
        rows = self.figures.replicas if self.figures else ()
        self.show([r for r in rows if self.view_filter.keeps_replica(r.replica)])
