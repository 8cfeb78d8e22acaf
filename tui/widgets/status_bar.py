"""The top line: live or paused, the window, what is being watched, how much is loaded."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from kvaudit.safe_text import visible
from kvaudit.tui.figures import Figures
from kvaudit.tui.filtering import Filter
from kvaudit.tui.window import WINDOWS


class StatusBar(Static):
    """Most important first, so that a narrow terminal cuts only the tail (what is watched)."""

    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $foreground; padding: 0 1; }
    """

    figures: reactive[Figures | None] = reactive(None)
    paused: reactive[bool] = reactive(False)
    window: reactive[str] = reactive("5m")
    view_filter: reactive[Filter] = reactive(Filter)
    auditing: reactive[bool] = reactive(False)

    def __init__(self, watching: str) -> None:
        super().__init__()
        self._watching = watching

    def render(self) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(" kvaudit ", style="bold black on green")
        text.append(" ")
        text.append(*(("⏸ PAUSED", "bold black on yellow") if self.paused else ("● LIVE", "bold green")))
        text.append(" ")
        for window in WINDOWS:
            current = window.name == self.window
            text.append(f" {window.name} ", style="bold reverse" if current else "dim")
        if self.view_filter:
            text.append(f"  filter: {visible(str(self.view_filter))}", style="bold magenta")
        figures = self.figures
        if figures is None:
            text.append("  reading…", style="bold yellow")
        else:
            if self.auditing:
                text.append("  auditing…", style="bold yellow")
            text.append(f"  {figures.pages_loaded:,} pages", style="bold")
            if figures.latest_ns is not None:
                latest = datetime.fromtimestamp(figures.latest_ns / 1e9, UTC)
                text.append(f" · latest {latest:%Y-%m-%d %H:%M:%S}Z")
            if figures.read_errors:
                text.append(f" · {figures.read_errors} unreadable lines", style="bold yellow")
            if figures.prevented_pages:
                # What prevention cost: pages recomputed because the pool held them for another geometry.
                text.append(f" · {figures.prevented_pages:,} prevented")
        text.append(f"  {visible(self._watching)}", style="italic")
        return text
