"""The drill-down screens' common shape: a table filled from a query run off the UI thread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Generic, TypeVar

from rich.console import RenderableType
from textual import work
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable

from kvaudit.tui import cells

Loaded = TypeVar("Loaded")


class LoadingScreen(Screen[None], Generic[Loaded]):
    """A screen around one `DataTable`, shown as soon as it is composed and filled when `load` returns.

    `load` runs in a worker thread, since a query over the traces can take seconds and the
    UI must stay live meanwhile; `show` then runs on the UI thread with what it returned.
    Escape goes back. `COLUMNS`, where the table's columns are fixed, are added at mount,
    and again at the widths their cells need when `fill` puts the rows in.
    """

    BINDINGS: ClassVar = [Binding("escape", "app.pop_screen", "Back")]
    COLUMNS: ClassVar[tuple[str, ...]] = ()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns(*self.COLUMNS)
        table.focus()
        self._fetch()

    @work(thread=True, exit_on_error=False)
    def _fetch(self) -> None:
        loaded = self.load()
        self.app.call_from_thread(self.show, loaded)

    def load(self) -> Loaded:
        """What the screen shows, read in a worker thread."""
        raise NotImplementedError

    def show(self, loaded: Loaded) -> None:
        """Fill the screen with what `load` returned (on the UI thread)."""
        raise NotImplementedError

    def fill(self, rows: Sequence[Sequence[RenderableType]]) -> None:
        """Put `rows` in the table, under `COLUMNS` each at the width its cells need (`cells.column_width`)."""
        table = self.query_one(DataTable)
        table.clear(columns=True)
        for i, label in enumerate(self.COLUMNS):
            table.add_column(label, width=cells.column_width(self.app.console, len(label), (row[i] for row in rows)))
        table.add_rows(rows)
