"""The exporter's reuse left: each request counted once it settled, the counts ending at the whole history's."""

from __future__ import annotations

import json
from pathlib import Path

from kvaudit.analyse.derived_views import prepare
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.present.exporter_reuse import SETTLED, ReuseCounts
from kvaudit.read.open import open_store
from kvaudit.read.store import TraceStore
from kvaudit.simulator.engine import GIB, SimConfig, simulate

SETTLE_S = 10.0
# Per request: what ReuseCounts sums (the columns of SETTLED after the replica).
_PER_REQUEST = """
    SELECT replica, lookup_ns, prompt_tokens, hit_tokens, achievable_tokens, rejected, prefix_broken, routed_away,
           incompatible_producer, evicted, stored_after_lookup, never_stored
    FROM query_reuse_left_requests"""


def _sums(rows: list[tuple], before_ns: float = float("inf")) -> dict[str, list[int]]:
    sums: dict[str, list[int]] = {}
    for replica, lookup_ns, *columns in rows:
        if lookup_ns < before_ns:
            totals = sums.setdefault(replica, [0] * len(columns))
            for k, value in enumerate(columns):
                totals[k] += value or 0
    return sums


def _append(files: list[Path], live: Path, low: int, high: int) -> None:
    """The lines of the files whose first span starts in [low, high), appended to the same files in `live`."""
    for path in files:
        for line in path.read_bytes().splitlines(keepends=True):
            spans = json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]
            if low <= int(spans[0]["startTimeUnixNano"]) < high:
                with (live / path.name).open("ab") as f:
                    f.write(line)


def test_requests_are_counted_once_settled_and_end_at_the_whole_history(tmp_path: Path):
    # Small private pools: pages are evicted, routed away, and stored after lookups.
    config = SimConfig(duration_s=90, rate=0.5, seed=3, shared=False, pool_bytes=16 * GIB)
    files = simulate(config, tmp_path / "sim").files
    whole = DuckDBBackend(open_store([str(f) for f in files]))
    prepare(whole, [_PER_REQUEST], audit=None)
    requests = whole.query(_PER_REQUEST)[1]
    start = min(lookup_ns for _, lookup_ns, *_ in requests)
    cut = start + 60 * 10**9
    live = tmp_path / "live"
    live.mkdir()
    backend = DuckDBBackend(TraceStore([live], ":memory:"))
    counts = ReuseCounts(settle_s=SETTLE_S)

    _append(files, live, 0, cut)  # the first minute of every replica
    backend.refresh(final=False)
    prepare(backend, [SETTLED], audit=None)
    counts.add_settled(backend, quiet=False)
    [(newest,)] = backend.query("SELECT max(end_ns) FROM spans")[1]
    assert counts.counted_until == newest - int(SETTLE_S * 1e9) and not counts.settled
    # Those looked up long enough before the newest span are counted as the whole history tells them.
    assert counts.totals == _sums(requests, before_ns=counts.counted_until)

    _append(files, live, cut, 2**63 - 1)  # the rest, then a quiet fleet
    backend.refresh(final=False)
    counts.add_settled(backend, quiet=True)
    assert counts.settled
    assert counts.totals == _sums(requests)
    assert {replica for replica, *_ in counts.rows()} == {"r1", "r2"}

    counted = {replica: list(totals) for replica, totals in counts.totals.items()}
    counts.add_settled(backend, quiet=True)  # nothing arrived: nothing counted twice
    assert counts.totals == counted


def test_nothing_to_count_before_the_first_span(tmp_path: Path):
    backend = DuckDBBackend(TraceStore([tmp_path], ":memory:"))
    backend.refresh(final=False)
    counts = ReuseCounts(settle_s=0)
    prepare(backend, [SETTLED], audit=None)
    counts.add_settled(backend, quiet=True)
    assert counts.rows() == [] and counts.counted_until is None and counts.settled
