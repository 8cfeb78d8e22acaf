"""Enter on a finding: the fetched page descriptor beside the stored one, differences marked.

The values are what is being compared, so they are never cut: the value columns share
the width and a long value wraps onto more lines of its row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Footer, Static

from kvaudit.tui import cells
from kvaudit.tui.descriptors import DESCRIPTOR_FIELDS, DescriptorPair, FieldRow, Mark
from kvaudit.tui.findings import FindingRow
from kvaudit.tui.screens.loading import LoadingScreen

_MARK_STYLE: Final = {
    Mark.NAMED: "bold white on dark_red",
    Mark.DIFFERS: "bold black on yellow",
    Mark.ABSENT: "italic dim",
    Mark.SAME: "",
}
_MARK_NOTE: Final = {Mark.NAMED: "▶ finding", Mark.DIFFERS: "▶ differs", Mark.ABSENT: "one side", Mark.SAME: ""}
_CONSUMER: Final = "consumer"
_FIELD_WIDTH: Final = max(len(name) for name in DESCRIPTOR_FIELDS)
_NOTE_WIDTH: Final = max(len(note) for note in _MARK_NOTE.values())


class DrillScreen(LoadingScreen[DescriptorPair]):
    DEFAULT_CSS = """
    DrillScreen #finding { height: auto; border: round $error; padding: 0 1; }
    DrillScreen #descriptors { height: 1fr; border: round $accent; }
    DrillScreen DataTable { height: 1fr; overflow-x: hidden; }
    """

    def __init__(self, finding: FindingRow, load: Callable[[FindingRow], DescriptorPair]) -> None:
        super().__init__()
        self.finding = finding
        self._load = load
        self._pair: DescriptorPair | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="finding") as box:
            box.border_title = Text(f"{self.finding.code} {self.finding.rule}")
            yield Static(_summary(self.finding))
        with Vertical(id="descriptors") as box:
            box.border_title = "fetched descriptor ⟷ stored descriptor"
            box.border_subtitle = "loading…"
            yield DataTable(cursor_type="row", zebra_stripes=True)
        yield Footer()

    def load(self) -> DescriptorPair:
        return self._load(self.finding)

    def show(self, pair: DescriptorPair) -> None:
        self._pair = pair
        self._lay_out()
        self.query_one("#descriptors", Vertical).border_subtitle = _subtitle(pair)
        # The fields the finding is about, in view however short the screen: the cursor on the first.
        differing = [i for i, row in enumerate(pair.rows) if row.name in pair.differing]
        if differing:
            self.query_one(DataTable).move_cursor(row=differing[0], animate=False)

    def on_resize(self, _: events.Resize) -> None:
        if self._pair is not None:
            self._lay_out()

    def _lay_out(self) -> None:
        """The rows with the value columns sharing the table's width; each row as tall as its longest value."""
        pair = self._pair
        assert pair is not None
        table = self.query_one(DataTable)
        # The consumer's own values, where the finding compares against them (KVA005).
        consumer = {name: sides[_CONSUMER] for name, sides in self.finding.fields.items() if _CONSUMER in sides}
        shown = any(row.name in consumer for row in pair.rows)
        values = 3 if shown else 2
        padding = 2 * table.cell_padding
        # The rows outgrow the screen's height often enough: room for the vertical scrollbar, always.
        scrollbar = table.styles.scrollbar_size_vertical
        room = table.size.width - scrollbar - _FIELD_WIDTH - _NOTE_WIDTH - 2 * padding
        width = max(8, room // values - padding)
        table.clear(columns=True)
        table.add_column("field", width=_FIELD_WIDTH)
        table.add_column("", width=_NOTE_WIDTH)
        for label in ("fetched", "stored", *((_CONSUMER,) if shown else ())):
            table.add_column(label, width=width)
        for row in pair.rows:
            extra = (_value(consumer[row.name]) if row.name in consumer else Text(""),) if shown else ()
            table.add_row(*_cells(row), *extra, key=row.name, height=None)


def _summary(finding: FindingRow) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")  # a key or an id wraps, whole
    grid.add_row("severity", cells.severity(finding.severity))
    grid.add_row("message", cells.plain(finding.message))
    grid.add_row("consumer", cells.plain(finding.replica))
    grid.add_row("producer", cells.plain(finding.producer))
    grid.add_row("key", cells.plain(finding.key))
    grid.add_row("trace / span", cells.plain(f"{finding.trace_id or '–'} / {finding.span_id or '–'}"))
    if finding.file is not None:
        grid.add_row("file", cells.plain(f"{finding.file}:{finding.line}"))
    return grid


def _cells(row: FieldRow) -> tuple[Text, Text, Text, Text]:
    style = _MARK_STYLE[row.mark]
    note = Text(_MARK_NOTE[row.mark], style="bold red" if row.mark is Mark.NAMED else "dim")
    return Text(row.name, style="bold"), note, _value(row.fetched, style), _value(row.stored, style)


def _value(value: Any, style: str = "") -> Text:
    if value is None:
        return Text("absent", style="dim italic")
    text = cells.plain(str(list(value)) if isinstance(value, tuple) else str(value), style=style)
    text.overflow = "fold"  # a long value (a key, an address) wraps onto more lines, whole
    return text


def _subtitle(pair: DescriptorPair) -> str:
    if pair.fetched is None:
        return "no fetched page with this span and key in the traces"
    if pair.stored is None:
        return "no store of this key precedes the fetch"
    count = len(pair.differing)
    return f"{count} field{'s' if count != 1 else ''} named by the finding or differing"
