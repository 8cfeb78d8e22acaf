"""A request's `kvaudit explain` in the TUI: each page of its prompt with its cause (docs/design.md section 7)."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Final

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Footer, Static

from kvaudit.analyse.explain import Explanation
from kvaudit.causes import Cause
from kvaudit.tui import cells
from kvaudit.tui.screens.loading import LoadingScreen

COLUMNS: Final = ("page", "tokens", "cause", "where", "producer", "stored", "last eviction", "detail")


def cause_style(cause: Cause) -> str:
    """Hits green, a refused page red, any other miss yellow."""
    return "green" if cause.hit else "red" if cause == Cause.REJECTED else "yellow"


class ExplainScreen(LoadingScreen[Explanation | None]):
    DEFAULT_CSS = """
    ExplainScreen #request { height: auto; border: round $primary; padding: 0 1; }
    ExplainScreen #pages { height: 1fr; border: round $accent; }
    ExplainScreen DataTable { height: 1fr; }
    """
    COLUMNS: ClassVar = COLUMNS

    def __init__(self, replica: str, request_id: str, load: Callable[[str, str], Explanation | None]) -> None:
        super().__init__()
        self.replica = replica
        self.request_id = request_id
        self._load = load

    def compose(self) -> ComposeResult:
        with Vertical(id="request") as box:
            box.border_title = Text.assemble(
                "explain ", cells.plain(self.request_id), " on ", cells.plain(self.replica)
            )
            yield Static("loading…", id="summary")
        with Vertical(id="pages") as box:
            box.border_title = "pages of the prompt, in order"
            yield DataTable(cursor_type="row", zebra_stripes=True)
        yield Footer()

    def load(self) -> Explanation | None:
        return self._load(self.replica, self.request_id)

    def show(self, explanation: Explanation | None) -> None:
        summary = self.query_one("#summary", Static)
        if explanation is None:
            summary.update(Text("no such request in the traces", style="dim italic"))
            return
        summary.update(_summary(explanation))
        self.fill(
            [
                (
                    Text(str(page.page)),
                    Text(f"{page.token_start}-{page.token_end}"),
                    Text(page.cause.value, style=cause_style(page.cause)),
                    cells.plain(page.where),
                    cells.plain(page.producer),
                    Text(page.since_lookup(page.stored_ns)),
                    cells.plain(page.eviction()),
                    cells.plain(page.rule or ""),
                )
                for page in explanation.pages
            ]
        )


def _summary(explanation: Explanation) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("looked up", explanation.looked_up_at)
    grid.add_row("reuse", explanation.rates())
    by_cause = explanation.tokens_by_cause()
    missed = Text()
    for cause in Cause:
        if by_cause[cause]:
            missed.append(f"{cause.value} {by_cause[cause]:,}  ", style=cause_style(cause))
    grid.add_row("tokens by cause", missed)
    for note in explanation.notes:
        grid.add_row("note", cells.plain(note))
    return grid
