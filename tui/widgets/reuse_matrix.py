"""The producer → consumer matrix: whose pages each replica used, and how many it rejected."""

from __future__ import annotations

from typing import Final

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import DataTable

from kvaudit.tui import cells
from kvaudit.tui.figures import Figures, ReuseCell
from kvaudit.tui.filtering import Filter

NO_STORE: Final = "(no store)"
_CORNER: Final = "producer ↓ consumer →"
# Shares of the largest cell, from cold to hot; the diagonal (a replica reusing its own pages) stays neutral.
_HEAT: Final = ((0.75, "bold white on dark_orange3"), (0.4, "white on orange4"), (0.1, "white on grey30"), (0, ""))


class ReuseMatrix(DataTable[Text]):
    """Rows are producers, columns consumers; a cell is the tokens used, then rejected pages."""

    figures: reactive[Figures | None] = reactive(None, init=False)
    view_filter: reactive[Filter] = reactive(Filter, init=False)

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__(id=id, cursor_type="none", zebra_stripes=False)

    def watch_figures(self) -> None:
        self._update()

    def watch_view_filter(self) -> None:
        self._update()

    def _update(self) -> None:
        reuse = [c for c in (self.figures.reuse if self.figures else ()) if self.view_filter.keeps_cell(c)]
        consumers = sorted({c.consumer for c in reuse})
        producers = sorted({c.producer for c in reuse if c.producer is not None})
        if any(c.producer is None for c in reuse):
            producers.append(NO_STORE)
        top = max((c.used_tokens for c in reuse if c.producer not in (None, c.consumer)), default=0)
        grid = {(c.producer or NO_STORE, c.consumer): c for c in reuse}
        rows = [
            [cells.plain(producer, style="bold")]
            + [_cell(grid.get((producer, consumer)), top, diagonal=producer == consumer) for consumer in consumers]
            for producer in producers
        ]
        labels = [Text(_CORNER), *(cells.plain(consumer) for consumer in consumers)]
        self.clear(columns=True)
        # Widths set here, not measured later on idle: the matrix is whole in every frame.
        for i, (label, key) in enumerate(zip(labels, [_CORNER, *consumers])):
            width = max([label.cell_len, *(row[i].cell_len for row in rows)])
            self.add_column(label, key=key, width=width)
        for producer, row in zip(producers, rows):
            self.add_row(*row, key=producer)


def _cell(cell: ReuseCell | None, top: int, *, diagonal: bool) -> Text:
    if cell is None:
        return Text("·", style="dim")
    text = cells.count(cell.used_tokens)
    if not diagonal and top:
        share = cell.used_tokens / top
        text.stylize(next(style for floor, style in _HEAT if share >= floor))
    text.append(" tok", style="dim")
    if cell.rejected_pages:
        text.append(f"  {cell.rejected_pages}✗", style="bold yellow")
    return text
