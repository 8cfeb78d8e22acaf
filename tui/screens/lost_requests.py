"""Enter on a replica: its requests of the window that left the most reuse; enter on one opens its explain."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Final

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Footer

from kvaudit.analyse.explain import Explanation
from kvaudit.tui import cells
from kvaudit.tui.reuse_left import SHOWN, LostRequest
from kvaudit.tui.screens.explain import ExplainScreen
from kvaudit.tui.screens.loading import LoadingScreen

COLUMNS: Final = ("request", "lost tok", "hit tok", "achievable tok", "prompt tok", "lost most to")


class LostRequestsScreen(LoadingScreen[list[LostRequest]]):
    DEFAULT_CSS = """
    LostRequestsScreen #requests { height: 1fr; border: round $accent; }
    LostRequestsScreen DataTable { height: 1fr; }
    """
    COLUMNS: ClassVar = COLUMNS

    def __init__(
        self,
        replica: str,
        window: str,
        load: Callable[[str], list[LostRequest]],
        explain: Callable[[str, str, int], Explanation | None],
    ) -> None:
        """`load` reads the replica's requests looked up in the window called `window`; `explain`
        explains one, given its replica, id and lookup time (an id may name several requests)."""
        super().__init__()
        self.replica = replica
        self.window = window
        self._load = load
        self._explain = explain
        self._requests: list[LostRequest] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="requests") as box:
            box.border_title = Text.assemble(
                "requests of ", cells.plain(self.replica), f" · {self.window} · reuse left on the table"
            )
            box.border_subtitle = "loading…"
            yield DataTable(cursor_type="row", zebra_stripes=True)
        yield Footer()

    def load(self) -> list[LostRequest]:
        return self._load(self.replica)

    def show(self, requests: list[LostRequest]) -> None:
        self._requests = requests
        self.fill(
            [
                (
                    cells.plain(request.request_id),
                    cells.count(request.lost_tokens),
                    cells.count(request.hit_tokens),
                    cells.count(request.achievable_tokens),
                    cells.plain(request.prompt_tokens),
                    cells.plain(request.main_cause, style="yellow"),
                )
                for request in requests
            ]
        )
        subtitle = f"the {SHOWN} that lost most" if len(requests) == SHOWN else f"all {len(requests)}"
        self.query_one("#requests", Vertical).border_subtitle = (
            f"{subtitle} · enter: explain" if requests else f"no request of this replica was looked up in {self.window}"
        )

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if 0 <= event.cursor_row < len(self._requests):
            request = self._requests[event.cursor_row]
            explain, lookup_ns = self._explain, request.lookup_ns
            self.app.push_screen(
                ExplainScreen(self.replica, request.request_id, lambda replica, id_: explain(replica, id_, lookup_ns))
            )
