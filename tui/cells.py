"""How figures read in a cell: numbers with units, sparklines, severities, trace text (Rich text).

Text from traces (replica names, keys, messages that quote them) goes into a cell
through `plain`: a `Text`, which Textual never reads as markup (a str cell it would, and
a replica named `[/]` would crash the table), with control characters as escapes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.text import Text

from kvaudit.safe_text import visible

_BARS: Final = "▁▂▃▄▅▆▇█"
SEVERITY_STYLE: Final = {"critical": "bold white on red", "warning": "black on yellow", "info": "black on grey70"}
NONE: Final = Text("–", style="dim")


def plain(value: object, *, style: str = "") -> Text:
    """Text from a trace as a cell: shown as written (no markup), control characters as escapes; None as –."""
    if value is None:
        return NONE
    return Text(visible(str(value)), style=style)


def sparkline(values: Sequence[int]) -> Text:
    """One bar per value, scaled to the largest; zero is a blank bar, so idleness shows."""
    top = max(values, default=0)
    if top <= 0:
        return Text(" " * len(values), style="on grey15")
    bars = "".join(" " if v <= 0 else _BARS[min(len(_BARS) - 1, v * len(_BARS) // (top + 1))] for v in values)
    return Text(bars, style="green on grey15")


def count(value: int) -> Text:
    """An integer with a k/M/G suffix past four digits."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= 10 * factor:
            return Text(f"{value / factor:.1f}{suffix}")
    return Text(str(value), style="dim" if value == 0 else "")


def percent(value: float | None) -> Text:
    if value is None:
        return NONE
    style = "green" if value >= 0.5 else "yellow" if value >= 0.2 else "red"
    return Text(f"{value:.1%}", style=style)


def number(value: float | None, unit: str, digits: int = 2) -> Text:
    if value is None:
        return NONE
    return Text(f"{value:.{digits}f} {unit}")


PENDING: Final = Text("…", style="dim italic")  # not known yet (being computed), never shown as 0


def alarm(value: int | None, *, style: str, pending: bool = False) -> Text:
    """A count that should be zero: styled when it is not; `…` while it is being computed, `n/a` when unknown."""
    if value is None:
        return PENDING if pending else Text("n/a", style="dim")
    return Text(str(value), style=style if value else "dim")


def severity(name: str) -> Text:
    return Text(f" {name.upper():<8} ", style=SEVERITY_STYLE.get(name, ""))


def short_key(key: str | None, width: int = 16) -> str:
    if key is None:
        return "–"
    key = visible(key)
    return key if len(key) <= width else key[: width - 1] + "…"


def column_width(console: Console, label_width: int, column: Iterable[RenderableType]) -> int:
    """The width a table column needs: its label's or its widest cell's, as Rich measures it.

    Tables add their columns at this width rather than leave DataTable to measure them: it
    measures new rows only when its message queue is next empty, and lines drawn before
    that, at the labels' widths, stay in its render cache (keyed on an update count the
    measuring does not change), so a busy machine could show `KVA0` for `KVA004`.
    """
    return max(label_width, *(Measurement.get(console, console.options, cell).maximum for cell in column), 1)
