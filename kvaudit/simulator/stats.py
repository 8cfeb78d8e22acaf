"""What a run measured, aggregated per replica, per workload or overall."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import astuple, dataclass, fields

from kvaudit.simulator.engine import RequestRecord


@dataclass(frozen=True)
class Summary:
    """Token-weighted rates over a group of requests.

    hit_rate: prompt tokens loaded from a tier and used, over prompt tokens.
    rejected: prompt tokens fetched, rejected by the guard and recomputed.
    ttft_ms, no_reuse_ms: mean time to first token with reuse, and without any.
    lookup_hit: prompt tokens the lookup found (used or rejected).
    cross: share of used tokens produced by another replica.
    ttft_x: mean TTFT without any reuse over mean TTFT with it (queueing included).
    unloaded_x: the same without queueing: full prefill time over transfer plus
        remaining prefill time, 1 / (1 - h + h × transfer/prefill per token) at hit rate h.
    transfer: share of the service time spent moving KV rather than computing it.
    """

    group: str
    requests: int
    tokens: int
    hit_rate: float
    lookup_hit: float
    cross: float
    rejected: int
    ttft_ms: float
    no_reuse_ms: float
    ttft_x: float
    unloaded_x: float
    transfer: float

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def row(self) -> tuple[object, ...]:
        return astuple(self)


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
        requests=n,
        tokens=tokens,
        hit_rate=_ratio(used, tokens),
        lookup_hit=_ratio(sum(r.lookup_hit_tokens for r in records), tokens),
        cross=_ratio(sum(r.cross_tokens for r in records), used),
        rejected=sum(r.rejected_tokens for r in records),
        ttft_ms=1e3 * _ratio(ttft, n),
        no_reuse_ms=1e3 * _ratio(ttft_no_reuse, n),
        ttft_x=_ratio(ttft_no_reuse, ttft),
        unloaded_x=_ratio(sum(r.prefill_no_reuse_s for r in records), busy),
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


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0
