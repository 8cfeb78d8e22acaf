"""The main screen: replicas, reuse matrix, alerts and findings over the chosen window.

The screen holds the view state (window, pause, filter, the latest `Figures`) as
reactive attributes bound into the panels; all reading and querying happens in
worker threads through `LiveSource`, so the UI never waits on DuckDB. While the traces
are first read, and while an audit runs, the panels say so ("reading…", "auditing…"):
a count not yet known is never shown as 0.

The layout is for any terminal from 80x24 up: the tables show their most important
columns first (`c` shows the rest), a short terminal gives the findings the height it
can, and `z` zooms the focused panel to the whole screen. Enter on a finding opens its
descriptors (`screens.drill`), on a replica the requests that left the most reuse on the
table (`screens.lost_requests`), and from there one request's explain (`screens.explain`).
"""

from __future__ import annotations

from typing import ClassVar

import duckdb
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input

from kvaudit.errors import InputError
from kvaudit.safe_text import visible
from kvaudit.tui.figures import Figures
from kvaudit.tui.filtering import Filter
from kvaudit.tui.screens.drill import DrillScreen
from kvaudit.tui.screens.lost_requests import LostRequestsScreen
from kvaudit.tui.source import LiveSource
from kvaudit.tui.widgets.alerts_panel import AlertsPanel
from kvaudit.tui.widgets.findings_table import FindingsTable
from kvaudit.tui.widgets.replica_table import ReplicaTable
from kvaudit.tui.widgets.reuse_matrix import ReuseMatrix
from kvaudit.tui.widgets.status_bar import StatusBar
from kvaudit.tui.window import WINDOWS, Window, window_named


class MainScreen(Screen[None]):
    DEFAULT_CSS = """
    MainScreen { layout: vertical; }
    MainScreen .panel { border: round $primary-darken-1; border-title-style: bold; }
    MainScreen .panel:focus-within { border: round $accent; }
    MainScreen #replicas { height: auto; max-height: 14; }
    MainScreen #middle { height: 1fr; min-height: 7; }
    MainScreen #reuse { width: 3fr; }
    MainScreen #alerts { width: 2fr; overflow-y: auto; }
    MainScreen #findings { height: 2fr; }
    MainScreen DataTable { height: auto; max-height: 100%; }
    MainScreen #findings DataTable { height: 1fr; }
    MainScreen #filter { dock: bottom; display: none; border: tall $accent; }
    MainScreen #filter.shown { display: block; }
    MainScreen.-short #replicas { max-height: 7; }
    MainScreen.-short #middle { height: 7; min-height: 5; }
    MainScreen.-short #findings { height: 1fr; }
    MainScreen.zoomed .panel { display: none; }
    MainScreen.zoomed #middle { display: none; }
    MainScreen.zoomed #middle.holds-zoom { display: block; height: 1fr; }
    MainScreen.zoomed .panel.zoom { display: block; height: 1fr; max-height: 100%; width: 1fr; }
    """
    # Below 32 lines the screen is short: the middle panels keep a fixed height, the findings the rest.
    VERTICAL_BREAKPOINTS: ClassVar = [(0, "-short"), (32, "-tall")]
    BINDINGS: ClassVar = [
        # Descriptions short enough that every key shows in the footer at 80 columns.
        Binding("p", "pause", "Pause"),
        Binding("slash", "open_filter", "Filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("z", "zoom", "Zoom"),
        *(
            Binding(str(i), f"window('{w.name}')", "Window", key_display="1-4", show=i == 1)
            for i, w in enumerate(WINDOWS, 1)
        ),
    ]

    figures: reactive[Figures | None] = reactive(None, init=False)
    paused: reactive[bool] = reactive(False, init=False)
    window: reactive[str] = reactive("", init=False)
    view_filter: reactive[Filter] = reactive(Filter, init=False)
    auditing: reactive[bool] = reactive(False, init=False)  # an audit is running now

    def __init__(self, source: LiveSource, *, watching: str, window: Window, interval_s: float) -> None:
        super().__init__()
        self.source = source
        self._watching = watching
        self._interval_s = interval_s
        self.set_reactive(MainScreen.window, window.name)

    def compose(self) -> ComposeResult:
        yield StatusBar(self._watching).data_bind(
            MainScreen.figures, MainScreen.paused, MainScreen.window, MainScreen.view_filter, MainScreen.auditing
        )
        with Vertical(id="replicas", classes="panel") as panel:
            panel.border_title = "replicas"
            yield ReplicaTable(id="replica-table").data_bind(MainScreen.figures, MainScreen.view_filter)
        with Horizontal(id="middle"):
            with Vertical(id="reuse", classes="panel") as panel:
                panel.border_title = "reuse: tokens used, producer ↓ consumer →"
                yield ReuseMatrix(id="reuse-matrix").data_bind(MainScreen.figures, MainScreen.view_filter)
            # Focusable (tab), so that alerts more than fit scroll with the arrow keys, and `z` zooms them.
            with VerticalScroll(id="alerts", classes="panel") as panel:
                panel.border_title = "alerts"
                yield AlertsPanel().data_bind(MainScreen.figures)
        with Vertical(id="findings", classes="panel") as panel:
            panel.border_title = "findings"
            yield FindingsTable(id="findings-table").data_bind(MainScreen.figures, MainScreen.view_filter)
        yield Input(placeholder="replica:r2 rule:KVA004 key:ab12 …  (enter applies, escape clears)", id="filter")
        yield Footer(show_command_palette=False)  # its ^p would cover the last keys at 80 columns; it still opens

    def on_mount(self) -> None:
        self.query_one(FindingsTable).focus()
        self.watch(self.query_one(FindingsTable), "shown", self._show_count)
        self._titles()
        self._read()
        self.set_interval(self._interval_s, self._tick)

    # --- reading ------------------------------------------------------------------

    def _tick(self) -> None:
        if self.paused:
            return
        if not self._busy("read"):
            self._read()
        if not self._busy("analyse"):
            self._analyse()

    def _busy(self, group: str) -> bool:
        return any(w.group == group and not w.is_finished for w in self.workers)

    @work(thread=True, group="read", exit_on_error=False)
    def _read(self, read: bool = True) -> None:
        window = window_named(self.window)
        try:
            self.app.call_from_thread(self._show, self.source.poll(window) if read else self.source.figures(window))
        except (duckdb.Error, OSError, ValueError, InputError) as exc:  # BackendError is an InputError
            self.app.call_from_thread(self._error, f"reading the traces failed: {exc}")

    # The audit and the alert rules may take seconds over large traces: a worker of their own.
    @work(thread=True, group="analyse", exit_on_error=False)
    def _analyse(self) -> None:
        if self.source.audit_due():
            self.app.call_from_thread(setattr, self, "auditing", True)
        try:
            analysed = self.source.analyse(window_named(self.window))
        except (duckdb.Error, OSError, ValueError, InputError) as exc:  # BackendError is an InputError
            self.app.call_from_thread(self._error, f"auditing the traces failed: {exc}")
            return
        finally:
            self.app.call_from_thread(setattr, self, "auditing", False)
        if analysed is not None:
            self.app.call_from_thread(self._show, analysed)

    def _error(self, message: str) -> None:
        # An error may quote a file name or a value from the traces: shown as text, never as markup.
        self.notify(visible(message), severity="error", markup=False)

    def _show(self, figures: Figures) -> None:
        # A result computed for a window the user has since left is dropped, not shown, and
        # so is one older than what is shown (the reading and analysing workers race).
        if figures.window == self.window and (self.figures is None or figures.serial >= self.figures.serial):
            self.figures = figures

    def watch_figures(self) -> None:
        self._titles()

    def watch_auditing(self) -> None:
        self._titles()

    def _show_count(self) -> None:
        self._titles()

    def _titles(self) -> None:
        """Panel titles and subtitles: the window each answers for, and what is still on its way."""
        figures = self.figures
        reading = "reading…" if figures is None else ""
        replicas = self.query_one("#replicas", Vertical)
        replicas.border_title = f"replicas · {self.window}"
        replicas.border_subtitle = reading
        self.query_one("#reuse", Vertical).border_subtitle = reading
        alerts = self.query_one("#alerts", VerticalScroll)
        alerts.border_title = f"alerts: {figures.alerts_source}" if figures and figures.alerts_source else "alerts"
        findings = self.query_one("#findings", Vertical)
        note = figures.findings_note if figures is not None else ""
        findings.border_title = f"findings · {self.window}" + (f": {note}" if note else "")
        findings.border_subtitle = reading or self._findings_count(figures)

    def _findings_count(self, figures: Figures | None) -> str:
        rows, matching = self.query_one(FindingsTable).shown
        count = f"{rows} of {matching}" if rows < matching else str(rows)
        if figures is not None and figures.findings_total is not None:
            count += f" in {self.window} · {figures.findings_total} in all"
        return count + (" · auditing…" if self.auditing else "")

    def watch_window(self) -> None:
        self._titles()
        self._read(read=False)

    # --- keys -------------------------------------------------------------------

    def action_pause(self) -> None:
        self.paused = not self.paused

    def action_window(self, name: str) -> None:
        self.window = name

    def action_zoom(self) -> None:
        """The focused panel on the whole screen, or back to every panel."""
        for node in self.query(".zoom, .holds-zoom"):
            node.remove_class("zoom", "holds-zoom")
        if self.has_class("zoomed") or self.focused is None:
            self.remove_class("zoomed")
            return
        panel = next((a for a in self.focused.ancestors_with_self if a.has_class("panel")), None)
        if panel is None:
            return
        panel.add_class("zoom")
        if panel.parent is not None and panel.parent.id == "middle":
            panel.parent.add_class("holds-zoom")
        self.add_class("zoomed")

    def action_open_filter(self) -> None:
        field = self.query_one("#filter", Input)
        field.add_class("shown")
        field.focus()

    def action_clear_filter(self) -> None:
        field = self.query_one("#filter", Input)
        if field.has_class("shown") or self.view_filter:
            field.value = ""
            self.view_filter = Filter()
            self._close_filter()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.view_filter = Filter.parse(event.value)
        self._close_filter()

    def _close_filter(self) -> None:
        self.query_one("#filter", Input).remove_class("shown")
        self.query_one(FindingsTable).focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if isinstance(event.data_table, FindingsTable):
            finding = event.data_table.item_at_cursor()
            if finding is not None:
                self.app.push_screen(DrillScreen(finding, self.source.descriptors))
        elif isinstance(event.data_table, ReplicaTable):
            replica = event.data_table.item_at_cursor()
            if replica is not None:
                self._drill_into(replica.replica)

    def _drill_into(self, replica: str) -> None:
        """The replica's requests of the window shown (all of them until its figures are)."""
        figures = self.figures
        if figures is not None and figures.window == self.window:
            window, since = self.window, figures.since_ns
        else:
            window, since = "all", None
        self.app.push_screen(
            LostRequestsScreen(
                replica, window, lambda name: self.source.lost_requests(name, since), self.source.explanation
            )
        )
