"""What a run measured, aggregated per replica, per workload or overall."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import astuple, dataclass, fields

from kvaudit.simulator.engine import RequestRecord


@dataclass(frozen=True)
class Summary:
    """Token-weighted rates over a group of requests.

    reqs: requests.
    hit: prompt tokens loaded from a tier and used, over prompt tokens.
    achievable: the hit rate the fleet could have had: the leading prompt pages of which a
        compatible copy existed anywhere in the fleet at the lookup, or that were used
        (docs/design.md section 7.3), over prompt tokens.
    found: prompt tokens the lookup found, used or rejected by the guard (and recomputed).
    cross: share of used tokens produced by another replica.
    ttft_ms: mean time to first token.
    ttft_x: mean TTFT without any reuse over mean TTFT with it (queueing included).
    idle_x: the same without queueing: full prefill time over transfer plus remaining
        prefill time (docs/boundaries.md), which also bounds the throughput gain.
    transfer: share of the service time spent moving KV rather than computing it.
    """

    group: str
    reqs: int
    hit: float
    achievable: float
    found: float
    cross: float
    ttft_ms: float
    ttft_x: float
    idle_x: float
    transfer: float

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def row(self) -> tuple[object, ...]:
        """The values as people read them: shares in percent, speedups as factors."""
        return tuple(_show(f.name, value) for f, value in zip(fields(self), astuple(self)))


def summarise(group: str, records: Sequence[RequestRecord]) -> Summary:
    tokens = sum(r.tokens for r in records)
    used = sum(r.used_tokens for r in records)
    ttft = sum(r.ttft_s for r in records)
    ttft_no_reuse = sum(r.ttft_no_reuse_s for r in records)
    transfer = sum(r.transfer_s for r in records)
    busy = transfer + sum(r.prefill_s for r in records)
    n = len(records)
    return Summary(
        group=group,
        reqs=n,
        hit=_ratio(used, tokens),
        achievable=_ratio(sum(r.achievable_tokens for r in records), tokens),
        found=_ratio(sum(r.lookup_hit_tokens for r in records), tokens),
        cross=_ratio(sum(r.cross_tokens for r in records), used),
        ttft_ms=1e3 * _ratio(ttft, n),
        ttft_x=_ratio(ttft_no_reuse, ttft),
        idle_x=_ratio(sum(r.prefill_no_reuse_s for r in records), busy),
        transfer=_ratio(transfer, busy),
    )


def summarise_by(records: Iterable[RequestRecord], key: Callable[[RequestRecord], str]) -> list[Summary]:
    """One summary per group, in group order, then one for all of them."""
    groups: dict[str, list[RequestRecord]] = {}
    everything: list[RequestRecord] = []
    for record in records:
        groups.setdefault(key(record), []).append(record)
        everything.append(record)
    return [summarise(name, groups[name]) for name in sorted(groups)] + [summarise("all", everything)]


def _show(name: str, value: object) -> object:
    if not isinstance(value, float):
        return value
    if name.endswith("_x"):
        return f"{value:.2f}×"
    if name.endswith("_ms"):
        return f"{value:.0f}"
    return f"{100 * value:.1f}%"


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0
