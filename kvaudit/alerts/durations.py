"""Prometheus durations (`15s`, `1h30m`, `500ms`, `0`) as seconds.

Rule files use Prometheus' own syntax (compound units, `d`, `w`, `y`) so that they
read like the alerting rules operators already write.
"""

from __future__ import annotations

import re
from typing import Final

_UNITS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
# Units in descending order, each at most once, as Prometheus' own parser requires.
_PATTERN: Final = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?")
_ORDER: Final = ("y", "w", "d", "h", "m", "s", "ms")


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
