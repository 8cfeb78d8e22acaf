"""A data table of typed items, re-rendered in place: `s` cycles the sort column, `c` shows every column.

Columns are listed by importance. The table shows as many of them as fit its width, in
that order, so a narrow terminal (80 columns) keeps the ones that matter and drops the
rest rather than scrolling them out of sight; `c` shows them all (scrolling sideways). A
`flex` column (a message) takes the width that is left, cut with an ellipsis, when its
whole text does not fit; the drill-down shows it whole.

Every column is added at the width measured here (`cells.column_width`), never left for
DataTable to measure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Generic, TypeVar

from rich.console import RenderableType
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.reactive import reactive
from textual.widgets import DataTable

from kvaudit.tui import cells

T = TypeVar("T")

FLEX_MIN: Final = 12  # the least width a flex column is shown at


@dataclass(frozen=True)
class Column(Generic[T]):
    label: str
    cell: Callable[[T], RenderableType]
    sort: Callable[[T], Any]
    descending: bool = False  # larger first: the column's worst or busiest on top
    flex: bool = False  # takes the width left over, cut with an ellipsis


class SortableTable(DataTable[RenderableType], Generic[T]):
    """Shows `items` in the order of the current sort column; the cursor stays on its row.

    Subclasses set `COLUMNS` (by importance) and `row_key`, and call `show` when their items change.
    """

    BINDINGS: ClassVar = [Binding("s", "sort", "Sort"), Binding("c", "columns", "Columns")]
    COLUMNS: ClassVar[Sequence[Column[Any]]] = ()
    sort_index: reactive[int] = reactive(0, init=False)
    all_columns: reactive[bool] = reactive(False, init=False)

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self._items: list[T] = []
        self._layout: tuple[tuple[int, int], ...] = ()  # (column index, width) shown

    def row_key(self, item: T) -> str:
        raise NotImplementedError

    @property
    def shown_columns(self) -> list[str]:
        """The labels of the columns shown now, in order."""
        return [self.COLUMNS[i].label for i, _ in self._layout]

    def on_mount(self) -> None:
        self._rebuild()

    def on_resize(self, _: events.Resize) -> None:
        if self._fit() != self._layout:
            self._rebuild()

    def show(self, items: Sequence[T]) -> None:
        column = self.COLUMNS[self.sort_index]
        ordered = sorted(items, key=column.sort, reverse=column.descending)
        if ordered == self._items and self.row_count == len(ordered):
            return  # unchanged: a rebuild would only flicker
        self._items = ordered
        if self._fit() != self._layout:
            self._rebuild()
            return
        current = self._current_key()
        self.clear()
        self._add_rows()
        if current is not None and current in self.rows:
            self.move_cursor(row=self.get_row_index(current), animate=False)

    def item_at_cursor(self) -> T | None:
        return self._items[self.cursor_row] if 0 <= self.cursor_row < len(self._items) else None

    def action_sort(self) -> None:
        shown = [i for i, _ in self._layout] or list(range(len(self.COLUMNS)))
        later = [i for i in shown if i > self.sort_index]
        self.sort_index = later[0] if later else shown[0]

    def action_columns(self) -> None:
        self.all_columns = not self.all_columns

    def watch_sort_index(self) -> None:
        column = self.COLUMNS[self.sort_index]
        self._items = sorted(self._items, key=column.sort, reverse=column.descending)
        self._rebuild()

    def watch_all_columns(self) -> None:
        self._rebuild()

    def _rebuild(self) -> None:
        current = self._current_key()
        self._layout = self._fit()
        self.clear(columns=True)
        for i, width in self._layout:
            column = self.COLUMNS[i]
            arrow = (" ▼" if column.descending else " ▲") if i == self.sort_index else ""
            self.add_column(column.label + arrow, key=column.label, width=width)
        self._add_rows()
        if current is not None and current in self.rows:
            self.move_cursor(row=self.get_row_index(current), animate=False)

    def _add_rows(self) -> None:
        seen: dict[str, int] = {}
        for item in self._items:
            key = self.row_key(item)
            # Equal keys would make DataTable refuse the row; a repeat gets its ordinal.
            seen[key] = seen.get(key, 0) + 1
            row = [self._cell(item, i, width) for i, width in self._layout]
            self.add_row(*row, key=key if seen[key] == 1 else f"{key}#{seen[key]}")

    def _cell(self, item: T, index: int, width: int) -> RenderableType:
        cell = self.COLUMNS[index].cell(item)
        if isinstance(cell, Text) and cell.cell_len > width:  # a flex column's cut
            cell = cell.copy()
            cell.no_wrap, cell.overflow = True, "ellipsis"
        return cell

    def _fit(self) -> tuple[tuple[int, int], ...]:
        """The columns that fit the width, most important first, with their widths; all when asked or not yet sized.

        A width that changes (a longer key, the sort arrow moving) changes the layout: the
        table is rebuilt with the new widths.
        """
        room = self.scrollable_content_region.width
        if self.all_columns or room <= 0:
            return tuple((i, self._natural_width(i)) for i in range(len(self.COLUMNS)))
        padding = 2 * self.cell_padding
        layout: list[tuple[int, int]] = []
        used = 0
        for i, column in enumerate(self.COLUMNS):
            natural = self._natural_width(i)
            if used + natural + padding <= room:
                layout.append((i, natural))
                used += natural + padding
                continue
            if column.flex and room - used >= FLEX_MIN + padding:
                layout.append((i, room - used - padding))
            break
        return tuple(layout) or ((0, self._natural_width(0)),)

    def _natural_width(self, index: int) -> int:
        column = self.COLUMNS[index]
        label = len(column.label) + (2 if index == self.sort_index else 0)
        return cells.column_width(self.app.console, label, map(column.cell, self._items))

    def _current_key(self) -> str | None:
        if not self.row_count or not self.is_valid_row_index(self.cursor_row):
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
