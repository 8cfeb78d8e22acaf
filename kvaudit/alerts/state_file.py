"""The engine's alerts on disk, so that a restart neither re-fires nor forgets.

Written to a temporary file and renamed over the old one: a crash mid-write leaves
the previous state, never half of one.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from kvaudit.alerts.instances import AlertInstance

VERSION = 1


class _StateFile(msgspec.Struct):
    version: int
    alerts: list[AlertInstance]


def load_state(path: Path) -> list[AlertInstance]:
    """The alerts saved at `path`; none when there is no file yet.

    Raises:
        ValueError: the file is not a kvaudit alert state file (it is not overwritten).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        state = msgspec.json.decode(data, type=_StateFile)
    except msgspec.DecodeError as exc:
        raise ValueError(f"{path}: not a kvaudit alert state file ({exc}); move it away to start afresh") from None
    if state.version != VERSION:
        raise ValueError(f"{path}: alert state version {state.version}, expected {VERSION}")
    return state.alerts


def save_state(path: Path, alerts: list[AlertInstance]) -> None:
    """Replace the state at `path` atomically.

    Raises:
        OSError: the directory is not writable.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(msgspec.json.encode(_StateFile(VERSION, alerts)))
    os.replace(temporary, path)
