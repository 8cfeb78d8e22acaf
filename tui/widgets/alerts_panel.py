"""The alerts panel: pending and firing alerts of the rules (a file, or the default pack), or why there are none."""

from __future__ import annotations

from typing import Final

from rich.console import Group, RenderableType
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from kvaudit.tui import cells
from kvaudit.tui.figures import Figures

_STATE_STYLE: Final = {"firing": "bold white on red", "pending": "black on yellow"}


class AlertsPanel(Static):
    """Each alert as its state and name, then its labels and summary on lines of their own,
    wrapped to the panel's width (never cut); the panel scrolls when they are more than fit."""

    DEFAULT_CSS = """
    AlertsPanel { padding: 0 1; height: auto; }
    """

    figures: reactive[Figures | None] = reactive(None, layout=True)  # its height follows the alerts

    def render(self) -> RenderableType:
        figures = self.figures
        if figures is None:
            return Text("reading…", style="dim")
        if figures.alerts is None:
            return Text(figures.alerts_note, style="dim")
        if not figures.alerts:
            return Text("✓ nothing firing or pending", style="green")
        lines: list[Text] = []
        for alert in figures.alerts:
            head = Text(f" {alert.state.upper()} ", style=_STATE_STYLE.get(alert.state, ""))
            lines.append(head + " " + cells.plain(alert.name, style="bold"))
            labels = " ".join(f"{k}={v}" for k, v in alert.labels if k != "alertname")
            if labels:
                lines.append(Text("  ") + cells.plain(labels, style="dim"))
            if alert.summary:
                lines.append(Text("  ") + cells.plain(alert.summary, style="italic"))
        return Group(*lines)
