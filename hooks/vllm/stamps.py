"""Producer stamps: what a stored page's own object does not carry, recorded beside it.

ExampleConnector's files carry dtype and shape but not the model, the tensor-parallel
world size and rank, the head geometry or the geometry fingerprint; LMCache's
multiprocess objects do not say how their payload moved (`transfer`). With `stamp_dir`
set, the producing replica writes these for every stored unit into a directory the
replicas share (never into the inner connector's own storage, whose files stay
byte-identical), one JSON file named after the unit's last page key; a fetch reads the
stamp of the pages it got. Stamps are what the producer declared, not what the payload is: a payload
that lacks dtype, shape or layout still lacks them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Final

from kvaudit.contract import KVConfig, PageDescriptor

STAMPED_FIELDS: Final = ("model", "world_size", "rank", "layers", "kv_heads", "head_size", "geometry", "transfer")


def write_stamp(stamp_dir: str, keys: list[str], kv: KVConfig, transfer: str | None = None) -> None:
    """Record the producer's identity, its `kv`, for the pages with `keys` (atomically: no half files);
    `transfer`: how its store moved the payload, where the inner connector's objects do not say."""
    if not keys:
        return
    directory = Path(stamp_dir)
    directory.mkdir(parents=True, exist_ok=True)
    stamp: dict[str, Any] = {name: getattr(kv, name, None) for name in STAMPED_FIELDS}
    stamp["transfer"] = transfer
    stamp["keys"] = keys
    target = directory / f"{keys[-1]}.json"
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    tmp.write_text(json.dumps(stamp))
    os.replace(tmp, target)


def read_stamp(stamp_dir: str | None, keys: list[str]) -> dict[str, Any]:
    """The stamped fields of a unit whose last page key is `keys[-1]`; empty when there is none."""
    if stamp_dir is None or not keys:
        return {}
    try:
        stamp = json.loads((Path(stamp_dir) / f"{keys[-1]}.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(stamp, dict):
        return {}
    return {name: stamp[name] for name in STAMPED_FIELDS if isinstance(stamp.get(name), (int, str))}


def apply_stamp(page: PageDescriptor, stamp: dict[str, Any]) -> None:
    """Fill the page's absent fields from the stamp; what the payload itself said wins."""
    for name, value in stamp.items():
        if getattr(page, name) is None:
            setattr(page, name, value)
