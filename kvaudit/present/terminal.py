"""Printing Rich tables where people read them: a terminal, or a pipe into a pager or a file.

On a terminal a table folds its cells to the terminal's width. Anywhere else there is
no width to fit (Rich would assume 80 columns and fold `SELECT * FROM replicas` into a
header of one letter per line), so a table is printed at the width it needs.
Values in cells are `Text` objects made with `cell`, never markup: a trace's `[/]` is
shown as written, and its control characters as escapes (`kvaudit.safe_text`).
"""

from __future__ import annotations

from typing import Any, Final, TextIO

from rich.console import Console, RenderableType
from rich.text import Text

from kvaudit.safe_text import visible

# Wider than any table: off a terminal, a table is laid out at its natural width within it
# (and not padded to it), in the one pass that prints it.
_UNBOUNDED_WIDTH: Final = 1 << 20
NULL: Final = Text("∅", style="dim")


def cell(value: Any) -> Text:
    """A value as a table cell: numbers short, NULL as a dim ∅, text as text (never markup)."""
    if value is None:
        return NULL
    if isinstance(value, float):
        return Text(f"{value:.4g}")
    return Text(visible(str(value)))


class _Console(Console):
    """Rich's console, leaving a closed pipe to `kvaudit`'s one handling of it (exit 141).

    Rich's own exits with status 1, where the shell and docs/operations.md say 141.
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def console(stream: TextIO) -> Console:
    """A console writing to `stream`, without soft wrapping (a table's rows stay rows)."""
    return _Console(file=stream, soft_wrap=False)


def print_wide(out: Console, renderable: RenderableType) -> None:
    """Print `renderable` folded to a terminal's width, or at its natural width when `out` is not a terminal."""
    if out.is_terminal:
        out.print(renderable)
    else:
        _Console(file=out.file, width=_UNBOUNDED_WIDTH, soft_wrap=False).print(renderable)
