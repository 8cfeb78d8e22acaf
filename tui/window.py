"""The time windows the TUI can show: the last minute, five minutes, hour, or everything."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kvaudit.errors import BadValueError


@dataclass(frozen=True)
class Window:
    """A window ending at the latest operation seen in the traces (not the wall clock).

    Anchoring at the traces' own latest time keeps replayed and live traces alike and
    makes a window over old files show their last minutes rather than nothing.
    """

    name: str
    seconds: int | None  # None: everything

    def since_ns(self, earliest_ns: int, latest_ns: int) -> int:
        """Start of the window over traces spanning [earliest_ns, latest_ns]."""
        if self.seconds is None:
            return earliest_ns
        return max(earliest_ns, latest_ns - self.seconds * 1_000_000_000)


WINDOWS: Final = (Window("1m", 60), Window("5m", 300), Window("1h", 3600), Window("all", None))
DEFAULT_WINDOW: Final = WINDOWS[1]


def window_named(name: str) -> Window:
    """The window called `name` (`1m`, `5m`, `1h`, `all`).

    Raises:
        BadValueError: no such window.
    """
    for window in WINDOWS:
        if window.name == name:
            return window
    raise BadValueError(f"unknown window {name!r} (expected one of {', '.join(w.name for w in WINDOWS)})")
