"""The findings list of the window shown: critical first, one row per finding; enter opens its descriptors."""

from __future__ import annotations

from typing import ClassVar, Final

from textual.reactive import reactive

from kvaudit.tui import cells
from kvaudit.tui.figures import Figures
from kvaudit.tui.filtering import Filter
from kvaudit.tui.findings import FindingRow
from kvaudit.tui.widgets.sortable_table import Column, SortableTable

# Rendering tens of thousands of rows would stall the UI; the count says how many more there are.
MAX_ROWS: Final = 500


class FindingsTable(SortableTable[FindingRow]):
    # By importance; the message takes what is left of the width, the rule's name and the
    # producer show where there is room (or with `c`), and all of it in the drill-down.
    COLUMNS: ClassVar = (
        Column("severity", lambda f: cells.severity(f.severity), lambda f: (f.severity_rank, f.code)),
        Column("code", lambda f: cells.plain(f.code), lambda f: (f.code, f.severity_rank)),
        Column("replica", lambda f: cells.plain(f.replica), lambda f: (f.replica or "", f.severity_rank)),
        Column("key", lambda f: cells.plain(cells.short_key(f.key, 12)), lambda f: (f.key or "", f.severity_rank)),
        Column("message", lambda f: cells.plain(f.message), lambda f: (f.message, f.severity_rank), flex=True),
        Column("producer", lambda f: cells.plain(f.producer), lambda f: (f.producer or "", f.severity_rank)),
        Column("rule", lambda f: cells.plain(f.rule), lambda f: (f.rule, f.severity_rank)),
    )

    figures: reactive[Figures | None] = reactive(None, init=False)
    view_filter: reactive[Filter] = reactive(Filter, init=False)
    shown: reactive[tuple[int, int]] = reactive((0, 0))  # (rows shown, findings matching the filter)

    def row_key(self, item: FindingRow) -> str:
        return "|".join(str(part) for part in (item.code, item.span_id, item.key, item.file, item.line, item.replica))

    def watch_figures(self) -> None:
        self._update()

    def watch_view_filter(self) -> None:
        self._update()

    def _update(self) -> None:
        findings = self.figures.findings if self.figures and self.figures.findings else ()
        kept = [f for f in findings if self.view_filter.keeps_finding(f)]
        self.show(kept[:MAX_ROWS])
        self.shown = (min(len(kept), MAX_ROWS), len(kept))
