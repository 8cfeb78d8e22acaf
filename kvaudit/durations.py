"""Durations on the command line: `1s`, `250ms`, `2m`, or plain seconds."""

from __future__ import annotations

import re
from typing import Final

_UNITS: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}
_DURATION: Final = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|µs|ms|s|m|h|)\s*")


def parse_duration(text: str) -> float:
    """Seconds in a duration such as `1s`, `250ms`, `0.5` (seconds).

    Raises:
        ValueError: not a duration.
    """
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration (e.g. 1s, 250ms, 2m)")
    return float(match.group(1)) * _UNITS[match.group(2)]
