"""Reading a named preset or a JSON file of the same shape (model geometries, GPU profiles)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import msgspec

T = TypeVar("T")


def load_spec(spec: str, presets: Mapping[str, T], kind: type[T], noun: str) -> T:
    """`presets[spec]`, else the JSON file at `spec` converted to `kind`.

    Raises:
        ValueError: neither a preset nor a readable, valid file (the message names which).
    """
    if spec in presets:
        return presets[spec]
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"{noun} {spec!r}: not a preset ({', '.join(presets)}) nor a JSON file")
    try:
        return msgspec.convert(json.loads(path.read_text()), kind)
    except (json.JSONDecodeError, UnicodeDecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"{spec}: bad {noun} ({exc})") from None
