"""`?`: the keys and the filter syntax, in a box that fits any terminal from 80x24 (lines wrap)."""

from __future__ import annotations

from typing import ClassVar, Final

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: Final = (
    ("p", "pause or resume reading the traces"),
    ("/", "filter: replica:NAME rule:KVA004 key:PREFIX, or bare words (escape clears)"),
    ("s", "sort the focused table by its next column"),
    ("c", "the focused table's every column (a narrow terminal shows the important ones)"),
    ("z", "zoom the focused panel to the whole screen, and back"),
    (
        "enter",
        "open a finding (its fetched descriptor beside the stored one), a replica (the requests"
        " of the window that left the most reuse on the table), or one such request (its explain)",
    ),
    ("escape", "back"),
    ("1 2 3 4", "window: last minute, 5 minutes, hour, everything (every panel answers for it)"),
    ("tab", "next panel (the alerts too: the arrow keys scroll them)"),
    ("?", "this help"),
    ("q, ctrl+c", "quit"),
)


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: 84; max-width: 100%; height: auto; max-height: 100%;
        border: round $accent; background: $surface; padding: 1 2;
    }
    """
    BINDINGS: ClassVar = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for key, what in KEYS:
            table.add_row(key, what)
        with Vertical() as box:
            box.border_title = "keys"
            yield Static(table)
