"""How a figure reads for a person: bytes in IEC units, durations in ms or s, shares in %.

A report column's unit follows from its name (the named queries' conventions: `*_bytes`,
`*_ms`, `*_s`, `gb_per_s`, `*_share`, `hit_rate`, ...), so a new column gets its unit
without a table of its own here.
"""

from __future__ import annotations

import math
from typing import Any, Final

_IEC: Final = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
# Columns holding a share (0 to 1), shown in %.
_PERCENT: Final = ("hit_rate", "share", "locality", "slower_than_recompute")


def byte_size(value: float) -> str:
    """`322785247232` → `300.6 GiB`."""
    if value == 0:
        return "0 B"
    power = min(len(_IEC) - 1, max(0, int(math.log(abs(value), 1024))))
    scaled = value / 1024**power
    return f"{value:.0f} B" if power == 0 else f"{scaled:.1f} {_IEC[power]}"


def duration_s(seconds: float) -> str:
    """`130.2` → `2m 10s`; under a minute in seconds, under a second in ms."""
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {rest:02d}s"


def percent(value: float) -> str:
    return f"{value:.1%}"


def count(value: int) -> str:
    return f"{value:,}"


def column_value(column: str, value: Any) -> str:
    """A value of the column `column` with its unit; text and None as they are (None: empty)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, int | float):
        return str(value)
    if column == "bytes" or column.endswith("_bytes") or column.startswith("bytes_"):
        return byte_size(value)
    if column.endswith("gb_per_s"):
        return f"{value:.3g} GB/s"
    if any(part in column for part in _PERCENT):
        return percent(value)
    if column.endswith(("_ms", "ms_per_token")):
        return f"{value:.3g} ms"
    if column.endswith("_s"):
        return duration_s(value)
    if column.endswith("_gib"):
        return f"{value:.3g} GiB"
    if isinstance(value, float):
        return f"{value:.4g}"
    return count(value)


def column_header(column: str) -> str:
    """`reuse_p50_s` → `reuse p50 s`: spaces let a narrow table wrap its headers between words."""
    return column.replace("gb_per_s", "GB/s").replace("_", " ")
