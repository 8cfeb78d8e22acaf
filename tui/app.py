"""`kvaudit tui`: the live view of a fleet's shared KV cache (see `screens.main`)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import App
from textual.binding import Binding

from kvaudit.tui.screens.help import HelpScreen
from kvaudit.tui.screens.main import MainScreen
from kvaudit.tui.source import LiveSource
from kvaudit.tui.window import DEFAULT_WINDOW, Window


class KvauditApp(App[None]):
    """The live TUI over one `LiveSource`.

    Args:
        source: the traces being watched.
        watching: what to call them in the status bar (paths or the receiver's address).
        window: the initial window.
        interval_s: seconds between reads of the traces.
    """

    TITLE = "kvaudit"
    BINDINGS: ClassVar = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        # What a terminal user presses first to leave (Textual's own ctrl+c copies text).
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(
        self, source: LiveSource, *, watching: str, window: Window = DEFAULT_WINDOW, interval_s: float = 1.0
    ) -> None:
        super().__init__()
        self.main = MainScreen(source, watching=watching, window=window, interval_s=interval_s)

    def get_default_screen(self) -> MainScreen:
        return self.main

    def action_help(self) -> None:
        self.push_screen(HelpScreen())
