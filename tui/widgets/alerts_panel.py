"""The alerts panel: firing alerts from the rule file, or why there are none to show."""

from __future__ import annotations

from typing import Final

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from kvaudit.tui import cells
from kvaudit.tui.figures import Figures

_STATE_STYLE: Final = {"firing": "bold white on red", "pending": "black on yellow"}


class AlertsPanel(Static):
    DEFAULT_CSS = """
    AlertsPanel { padding: 0 1; height: 1fr; }
    """

    figures: reactive[Figures | None] = reactive(None)

    def render(self) -> RenderableType:
        figures = self.figures
        if figures is None:
            return Text("loading…", style="dim")
        if figures.alerts is None:
            return Text(figures.alerts_note, style="dim")
        if not figures.alerts:
            return Text("✓ nothing firing or pending", style="green")
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True, min_width=9)
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="ellipsis")
        for alert in figures.alerts:
            grid.add_row(
                Text(f" {alert.state.upper()} ", style=_STATE_STYLE.get(alert.state, "")),
                cells.plain(alert.name, style="bold"),
                cells.plain(" ".join(f"{k}={v}" for k, v in alert.labels if k != "alertname"), style="dim"),
            )
            if alert.summary:
                grid.add_row("", cells.plain(alert.summary, style="italic"), "")
        return grid
