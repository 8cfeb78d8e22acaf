"""An alert rule evaluation of a live store while a fleet writes: its cost follows what arrived, not the history.

`kvaudit alerts watch` reads what was appended, then evaluates the rules; the audit's
findings, which rules read, are brought up to date by auditing what arrived (`LiveAudit`).
The history (KVAUDIT_BENCH_ALERTS_PAGES page descriptors, default 10M: four replicas over
ten hours, `live_fleet`) is generated into the live store `alerts watch` makes; then, each
run, what the fleet emits in an evaluation interval of 15 s is appended and the default
rule pack evaluated: its windows (30 minutes at most) hold a twentieth of the history.
Baseline, same run: the same evaluation auditing the whole history, as every evaluation
did before.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from bench.common import env_int, sized
from bench.live_fleet import PAGES_PER_SPAN, generate, span_ns_for
from kvaudit.alerts.engine import RuleEngine
from kvaudit.alerts.rules import load_default_pack
from kvaudit.analyse.live_audit import LiveAudit
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.read.store_file import open_bounded_store

PAGES: Final = env_int("KVAUDIT_BENCH_ALERTS_PAGES", 10_000_000, 20_000)
HOURS: Final = 10
INTERVAL_S: Final = 15
ARRIVING_SPANS: Final = max(PAGES * INTERVAL_S // (HOURS * 3600 * PAGES_PER_SPAN), 2)  # an interval's spans
RUNS: Final = sized(3, 2)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        live = Path(tmp) / "live.jsonl"
        live.touch()
        store = open_bounded_store([live], None, workers=1)  # as `kvaudit alerts watch` makes one
        backend = DuckDBBackend(store)
        span_ns, spans = span_ns_for(PAGES, hours=HOURS), PAGES // PAGES_PER_SPAN
        started = time.perf_counter()
        generate(store, 0, spans, span_ns=span_ns)
        print(f"generated {PAGES:,} page descriptors in {time.perf_counter() - started:.1f} s")
        engine = RuleEngine(load_default_pack())
        first = _timed(lambda: engine.evaluate(backend))
        print(f"first evaluation (audits the history): {first:.2f} s")
        kept, whole, audits = [], [], []
        for _ in range(RUNS):
            generate(store, spans, ARRIVING_SPANS, span_ns=span_ns)
            spans += ARRIVING_SPANS
            kept.append(_timed(lambda: engine.evaluate(backend)))
            audits.append(sum(h.duration_s for h in engine.health.values()))
            with backend.cursor() as fresh:
                whole.append(_timed(lambda: RuleEngine(load_default_pack(), audit=LiveAudit()).evaluate(fresh)))
        arrived = ARRIVING_SPANS * PAGES_PER_SPAN
        print(
            f"evaluation after {arrived:,} page descriptors arrived (the fleet's {INTERVAL_S} s): median"
            f" {statistics.median(kept):.2f} s (rules {statistics.median(audits):.2f} s, the audit of what"
            f" arrived the rest); auditing the history, same run: {statistics.median(whole):.2f} s"
            f" ({statistics.median(whole) / statistics.median(kept):.1f}x)"
        )
        for (group, alert), health in sorted(engine.health.items()):
            print(f"  rule {group}/{alert}: {health.duration_s * 1000:.0f} ms")
        backend.close()


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started
