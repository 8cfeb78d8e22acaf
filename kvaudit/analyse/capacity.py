"""The pool-capacity curve: hit rate as a function of pool bytes, from LRU stack distances.

An access to a page hits an LRU pool of C bytes exactly when the distinct pages touched
since the previous access of the same key, itself included, hold at most C bytes (its
*stack distance* in bytes); so one pass over the reference stream gives the hit rate
at every capacity at once. The pass is sequential (a Fenwick tree over access
positions, O(n log n)), which SQL cannot express efficiently, so it runs here, compiled
with numba, over numpy arrays taken from DuckDB through Arrow: nothing is handled one
Python object per access.

The stream is `queries/capacity_curve.sql`, which also does SHARDS spatial sampling
(Waldspurger et al., FAST '15): keys whose hash falls under the rate are kept with
all their accesses. The hottest keys are kept whatever the rate (`exact`): each
access then stands for 1 / (its key's rate) accesses, distances add every page
between by the same weight, and hit rates are weighted shares, which for a plain
sample is SHARDS itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numba
import numpy as np

from kvaudit.analyse.named_queries import load
from kvaudit.backends import Source, as_backend

STREAM_QUERY: Final = "capacity_curve"
# Traces up to this many accesses are computed exactly when no rate is given.
EXACT_LIMIT: Final = 2_000_000


@dataclass(frozen=True)
class CapacityCurve:
    """Hit rate at each capacity, and how it was obtained.

    `distances` are the sorted finite stack distances in bytes (estimated for the whole
    trace when sampled); `hits[k]` is how many accesses of the whole trace the first k
    of them stand for, and `total` how many all the sampled accesses stand for;
    `accesses` counts every sampled access, cold ones included; `exact_keys` counts
    the hot keys kept whatever the rate.
    """

    distances: np.ndarray
    hits: np.ndarray
    total: float
    accesses: int
    sample_rate: float
    exact_keys: int = 0

    def hit_rate(self, capacity_bytes: np.ndarray | float) -> np.ndarray:
        """Share of accesses that hit a pool of each capacity."""
        reached = np.searchsorted(self.distances, np.asarray(capacity_bytes, dtype=np.float64), side="right")
        return self.hits[reached] / self.total if self.total else np.zeros_like(reached, dtype=np.float64)

    @property
    def method(self) -> str:
        """How the curve was obtained, for captions."""
        if self.sample_rate >= 1.0:
            return "exact"
        hot = f", its {self.exact_keys:,} hottest keys in full" if self.exact_keys else ""
        return f"SHARDS, sampling rate {self.sample_rate:g}{hot}"

    @property
    def ideal_hit_rate(self) -> float:
        """The hit rate of an unbounded pool: every re-reference hits."""
        return float(self.hits[-1] / self.total) if self.total else 0.0

    def grid(self, points: int = 64) -> np.ndarray:
        """Capacities from 0 to the largest stack distance (where the curve is flat)."""
        top = float(self.distances[-1]) if len(self.distances) else 0.0
        return np.linspace(0.0, top, points)


def capacity_curve(source: Source, *, sample_rate: float | None = None) -> CapacityCurve:
    """The capacity curve of the traces' store/fetch reference stream.

    Args:
        source: the traces (a store, or a backend such as ClickHouse).
        sample_rate: SHARDS rate in (0, 1]; 1.0 is exact; None is exact up to
            `EXACT_LIMIT` accesses and sampled down to about that many above it.

    Raises:
        ValueError: a rate outside (0, 1].
    """
    backend = as_backend(source)
    if sample_rate is None:
        _, [(accesses,)] = backend.query(
            "SELECT count(*) FROM pages WHERE op IN ('store', 'fetch') AND key IS NOT NULL"
        )
        sample_rate = min(1.0, EXACT_LIMIT / accesses) if accesses else 1.0
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError(f"sample rate {sample_rate} is not in (0, 1]")
    stream = backend.arrow(load(STREAM_QUERY), {"kvaudit_sample_rate": sample_rate})
    keys = stream.column("key_hash").to_numpy()
    weights = stream.column("bytes").to_numpy().astype(np.float64)
    exact = stream.column("exact").to_numpy(zero_copy_only=False).astype(bool)
    return curve_of_stream(keys, weights, sample_rate, exact)


def curve_of_stream(
    keys: np.ndarray, sizes: np.ndarray, sample_rate: float = 1.0, exact: np.ndarray | None = None
) -> CapacityCurve:
    """The curve of a reference stream: key of each access (any integers) and its bytes.

    `exact` marks accesses of keys kept whatever `sample_rate` (default: none).
    """
    ids = dense_ids(np.ascontiguousarray(keys).astype(np.uint64))
    sizes = np.ascontiguousarray(sizes, dtype=np.float64)
    exact_keys = 0 if exact is None else len(np.unique(ids[exact]))
    # Each sampled access stands for 1 / rate accesses, its page for 1 / rate pages.
    rates = None if not exact_keys or sample_rate == 1.0 else np.where(exact, 1.0, sample_rate)
    weights = sizes / (sample_rate if rates is None else rates)
    distances = stack_distances(ids, weights)
    reused = np.isfinite(distances)
    # The distance counts the pages between at their weight, but the page itself once.
    estimated = distances[reused] + (sizes[reused] - weights[reused])
    if rates is None:  # one weight for all: plain SHARDS, or exact
        estimated.sort()
        return CapacityCurve(estimated, np.arange(len(estimated) + 1.0), float(len(keys)), len(keys), sample_rate)
    order = np.argsort(estimated)
    hits = np.concatenate([[0.0], np.cumsum((1.0 / rates[reused])[order])])
    total = float(np.sum(1.0 / rates))
    return CapacityCurve(estimated[order], hits, total, len(keys), sample_rate, exact_keys)


@numba.njit(cache=True, nogil=True)
def dense_ids(keys: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """Number distinct keys 0..k-1 in order of first appearance.

    An open-addressing hash table: linear in the accesses, where sorting them (numpy's
    `unique`) costs several times the stack-distance pass itself.
    """
    n = len(keys)
    size = 1
    while size < 2 * n:
        size *= 2
    mask = np.uint64(size - 1)
    slots = np.full(size, -1, dtype=np.int64)
    seen = np.empty(n, dtype=np.uint64)
    ids = np.empty(n, dtype=np.int64)
    count = 0
    for i in range(n):
        key = keys[i]
        # Fibonacci hashing spreads keys that differ only in high or low bits.
        slot = (key * np.uint64(11400714819323198485)) >> np.uint64(20) & mask
        while True:
            found = slots[slot]
            if found < 0:
                slots[slot] = count
                seen[count] = key
                ids[i] = count
                count += 1
                break
            if seen[found] == key:
                ids[i] = found
                break
            slot = (slot + np.uint64(1)) & mask
    return ids


@numba.njit(cache=True, nogil=True)
def stack_distances(ids: np.ndarray, weights: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """Byte stack distance of each access (inf for a first access).

    `ids` are dense key ids (0..k-1). A Fenwick tree over positions holds, at the last
    access of each key so far, that access's bytes; the distance of access i to a key
    last seen at p is the bytes held at positions after p, plus its own.
    """
    n = len(ids)
    out = np.empty(n, dtype=np.float64)
    last = np.full(ids.max() + 1 if n else 0, -1, dtype=np.int64)
    tree = np.zeros(n + 1, dtype=np.float64)
    total = 0.0
    for i in range(n):
        key = ids[i]
        p = last[key]
        if p < 0:
            out[i] = np.inf
        else:
            held = 0.0  # bytes at positions 0..p
            j = p + 1
            while j > 0:
                held += tree[j]
                j -= j & -j
            out[i] = total - held + weights[i]
            j = p + 1  # the key's old position no longer holds it
            w = -weights[p]
            while j <= n:
                tree[j] += w
                j += j & -j
            total += w
        j = i + 1
        while j <= n:
            tree[j] += weights[i]
            j += j & -j
        total += weights[i]
        last[key] = i
    return out
