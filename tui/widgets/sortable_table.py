"""A data table of typed items, re-rendered in place, with `s` cycling the sort column."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from rich.console import RenderableType
from textual.binding import Binding
from textual.reactive import reactive
from textual.widgets import DataTable

T = TypeVar("T")


@dataclass(frozen=True)
class Column(Generic[T]):
    label: str
    cell: Callable[[T], RenderableType]
    sort: Callable[[T], Any]
    descending: bool = False  # larger first: the column's worst or busiest on top


class SortableTable(DataTable[RenderableType], Generic[T]):
    """Shows `items` in the order of the current sort column; the cursor stays on its row.

    Subclasses set `COLUMNS` and `row_key`, and call `show` when their items change.
    """

    BINDINGS: ClassVar = [Binding("s", "sort", "Sort")]
    COLUMNS: ClassVar[Sequence[Column[Any]]] = ()
    sort_index: reactive[int] = reactive(0, init=False)

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self._items: list[T] = []

    def row_key(self, item: T) -> str:
        raise NotImplementedError

    def on_mount(self) -> None:
        self._add_columns()

    def show(self, items: Sequence[T]) -> None:
        column = self.COLUMNS[self.sort_index]
        ordered = sorted(items, key=column.sort, reverse=column.descending)
        if ordered == self._items and self.row_count == len(ordered):
            return  # unchanged: a rebuild would only flicker and re-measure the columns
        self._items = ordered
        current = self._current_key()
        self.clear()
        seen: dict[str, int] = {}
        for item in self._items:
            key = self.row_key(item)
            # Equal keys would make DataTable refuse the row; a repeat gets its ordinal.
            seen[key] = seen.get(key, 0) + 1
            self.add_row(*(c.cell(item) for c in self.COLUMNS), key=key if seen[key] == 1 else f"{key}#{seen[key]}")
        if current is not None and current in self.rows:
            self.move_cursor(row=self.get_row_index(current), animate=False)

    def item_at_cursor(self) -> T | None:
        return self._items[self.cursor_row] if 0 <= self.cursor_row < len(self._items) else None

    def action_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(self.COLUMNS)

    def watch_sort_index(self) -> None:
        self.clear(columns=True)
        self._add_columns()
        self.show(self._items)

    def _add_columns(self) -> None:
        for i, column in enumerate(self.COLUMNS):
            arrow = (" ▼" if column.descending else " ▲") if i == self.sort_index else ""
            self.add_column(column.label + arrow, key=column.label)

    def _current_key(self) -> str | None:
        if not self.row_count or not self.is_valid_row_index(self.cursor_row):
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
