"""Faults injected on demand, the guard that turns bad pages into recomputes, and the ground truth.

- `raw-ptr:P`: each fetched page is served, with probability P, by a raw-pointer
  fallback that carries a process-local address and none of the portable metadata
  (model, dtype, shape, layout, TP geometry).
- `rolling-upgrade:T`: at simulated second T the last replica restarts with the packed
  KV layout. Page keys do not include the layout, so from then on pages of one
  layout are served to replicas of the other.
- `late-store:S`: a request's pages reach the pool and the local tier S seconds after
  its prefill ends (an asynchronous store falling behind), so a request that needs them
  in between misses them (`stored_after_lookup`, docs/design.md section 7).

Without the guard a bad page is used (silent corruption); with it the page is
rejected and its tokens are recomputed, which costs their prefill. With prevention
each replica's geometry fingerprint is part of its keys (docs/design.md section 4.5),
as the LMCache hook's `prevent` makes it: pages of the other layout are never found,
so no bytes move for them (raw-pointer pages are not a matter of geometry: unchanged).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from kvaudit.contract import KVConfig, PageDescriptor, Transfer
from kvaudit.guard import violations
from kvaudit.simulator.records import read_records

RAW_PTR: Final = "raw-ptr"
ROLLING_UPGRADE: Final = "rolling-upgrade"
LATE_STORE: Final = "late-store"
_EXPECTED: Final = f"{RAW_PTR}:SHARE (0..1), {ROLLING_UPGRADE}:SECONDS (>= 0) or {LATE_STORE}:SECONDS (>= 0)"


@dataclass(frozen=True)
class Faults:
    raw_ptr: float = 0.0
    upgrade_at_s: float | None = None
    guard: bool = False
    prevent: bool = False
    store_delay_s: float = 0.0


def parse_faults(specs: list[str], *, guard: bool = False, prevent: bool = False) -> Faults:
    """`raw-ptr:0.01`, `rolling-upgrade:120` and `late-store:2` (seconds of simulated time).

    Raises:
        ValueError: unknown fault or bad value.
    """
    raw_ptr, upgrade_at, store_delay = 0.0, None, 0.0
    for spec in specs:
        kind, _, value = spec.partition(":")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"fault {spec!r}: expected {_EXPECTED}") from None
        if kind == RAW_PTR and 0 <= number <= 1:
            raw_ptr = number
        elif kind == ROLLING_UPGRADE and number >= 0:
            upgrade_at = number
        elif kind == LATE_STORE and number >= 0:
            store_delay = number
        else:
            raise ValueError(f"fault {spec!r}: expected {_EXPECTED}")
    return Faults(raw_ptr, upgrade_at, guard, prevent, store_delay)


class GroundTruth(msgspec.Struct, kw_only=True):
    """One injected fault: a fetched page that was not what its consumer needed.

    The fetch span is named by `trace_id`: the simulator gives every request its own
    trace and emits one fetch span per request.
    """

    fault: str
    replica: str
    request_id: str
    trace_id: str
    key: str
    token_start: int
    time_ns: int
    used: bool
    producer: str
    page_layout: str | None
    consumer_layout: str | None


class Injector:
    """Serves fetched pages, some of them faulty, and judges them as the guard would."""

    def __init__(self, faults: Faults, seed: int) -> None:
        self.faults = faults
        self._rng = random.Random(f"{seed}:faults")

    def serve(self, stored: PageDescriptor, tier: str, consumer: KVConfig) -> tuple[PageDescriptor, str | None]:
        """The page as `consumer` receives it, and the fault it carries (if any)."""
        if self.faults.raw_ptr and self._rng.random() < self.faults.raw_ptr:
            bare = PageDescriptor(
                key=stored.key,
                hash_algo=stored.hash_algo,
                token_start=stored.token_start,
                token_end=stored.token_end,
                bytes=stored.bytes,
                transfer=Transfer.RAW_PTR,
                address=0x7F00_0000_0000 + self._rng.randrange(1 << 32) * 4096,
                tier=tier,
            )
            return bare, RAW_PTR
        served = msgspec.structs.replace(stored, transfer=Transfer.COPY, tier=tier)
        return served, ROLLING_UPGRADE if stored.layout != consumer.layout else None

    def accepts(self, page: PageDescriptor, consumer: KVConfig) -> bool:
        """The guard's verdict (`kvaudit.guard`), the same as the hooks'."""
        return not violations(page, PageDescriptor.from_config(consumer))


def read_ground_truth(path: Path) -> list[GroundTruth]:
    return read_records(path, GroundTruth)
