"""The engine's alerts on disk, so that a restart neither re-fires nor forgets.

Written to a temporary file and renamed over the old one: a crash mid-write leaves
the previous state, never half of one. Restoring is best effort, as in Prometheus: a
state file that cannot be read or is not one (truncated, garbage, another version) is
a warning, set aside as `<name>.bad-<time>` for a person to look at, and alerting
starts afresh; it never stops alerting. Writing is the engine's to retry (see
`RuleEngine.save`).

The default location is per user: `$XDG_STATE_HOME/kvaudit/` (`~/.local/state/kvaudit/`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Final

import msgspec

from kvaudit.alerts.instances import AlertInstance

logger = logging.getLogger(__name__)

VERSION: Final = 1
DEFAULT_NAME: Final = "alerts-state.json"


class _StateFile(msgspec.Struct):
    version: int
    alerts: list[AlertInstance]


def default_state_path() -> Path:
    """`$XDG_STATE_HOME/kvaudit/alerts-state.json`, or under `~/.local/state` (the XDG base directory default)."""
    base = os.environ.get("XDG_STATE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"  # a relative one is invalid
    return root / "kvaudit" / DEFAULT_NAME


def load_state(path: Path) -> list[AlertInstance]:
    """The alerts saved at `path`; none when there is no file yet, or when it cannot be used (a warning)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        logger.warning("%s: alert state not readable (%s); starting without it", path, exc.strerror or exc)
        return []
    try:
        state = msgspec.json.decode(data, type=_StateFile)
    except msgspec.DecodeError as exc:
        _set_aside(path, f"not a kvaudit alert state file ({exc})")
        return []
    if state.version != VERSION:
        _set_aside(path, f"alert state version {state.version}, expected {VERSION}")
        return []
    return state.alerts


def _set_aside(path: Path, reason: str) -> None:
    aside = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%dT%H%M%S')}")
    try:
        path.rename(aside)
    except OSError as exc:
        logger.warning("%s: %s; starting without it (could not set it aside: %s)", path, reason, exc.strerror or exc)
    else:
        logger.warning("%s: %s; starting without it, the file set aside as %s", path, reason, aside.name)


def save_state(path: Path, alerts: list[AlertInstance]) -> None:
    """Replace the state at `path` atomically.

    Raises:
        OSError: the directory is not writable, or the disk is full (the old state stays).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_bytes(msgspec.json.encode(_StateFile(VERSION, alerts)))
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)  # a partial write must not stay behind on a full disk
        raise
