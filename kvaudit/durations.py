"""Durations, in Prometheus' syntax wherever kvaudit reads one: rule files and command-line flags.

`15s`, `1h30m`, `250ms`, `0`: units `ms`, `s`, `m`, `h`, `d`, `w`, `y`, each at most
once and in descending order, as Prometheus' own parser requires. One grammar, so that
a duration copied from a rule file works on the command line and back.
"""

from __future__ import annotations

import re
from typing import Final

_UNITS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_ORDER: Final = ("y", "w", "d", "h", "m", "s", "ms")
DAY_NS: Final = int(_UNITS["d"]) * 10**9  # the UTC day partitions of traces (Parquet, the audit by day)
_PATTERN: Final = re.compile("".join(rf"(?:(\d+){unit})?" for unit in _ORDER))


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration.

    Raises:
        ValueError: not a duration.
    """
    text = text.strip()
    if text == "0":
        return 0.0
    match = _PATTERN.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"bad duration {text!r} (expected e.g. 30s, 5m, 1h30m)")
    return float(sum(int(n) * _UNITS[unit] for n, unit in zip(match.groups(), _ORDER) if n))
