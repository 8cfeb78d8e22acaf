"""An alert rule evaluation of a live store while a fleet writes: its cost follows what arrived, not the history.

`kvaudit alerts watch` reads what was appended, then evaluates the rules; the audit's
findings, which rules read, are brought up to date by auditing what arrived (`LiveAudit`).
The history (KVAUDIT_BENCH_ALERTS_PAGES page descriptors, default 10M: four replicas over
ten hours, `live_fleet`) is generated into the live store `alerts watch` makes; then, each
run, what the fleet emits in an evaluation interval of 15 s is appended and the default
rule pack evaluated: its windows (30 minutes at most) hold a twentieth of the history.
Baseline, same run: the same evaluation auditing the whole history, as every evaluation
did before.

`kvaudit exporter`'s analysis reads the same live store: after each interval it also counts
the reuse left of the requests that settled (`ReuseCounts`); baseline, same run: the reuse
left over the whole history, which every analysis figured before.
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
from kvaudit.analyse.derived_views import prepare
from kvaudit.analyse.live_audit import LiveAudit
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.present.exporter_reuse import SETTLED, ReuseCounts
from kvaudit.read.store_file import open_bounded_store

PAGES: Final = env_int("KVAUDIT_BENCH_ALERTS_PAGES", 10_000_000, 20_000)
HOURS: Final = 10
INTERVAL_S: Final = 15
ARRIVING_SPANS: Final = max(PAGES * INTERVAL_S // (HOURS * 3600 * PAGES_PER_SPAN), 2)  # an interval's spans
RUNS: Final = sized(3, 2)
# Per replica, the reuse left of every request: what the exporter's analysis figured before.
_WHOLE_REUSE: Final = "SELECT replica, sum(prompt_tokens), sum(routed_away) FROM query_reuse_left GROUP BY replica"


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
        reuse = ReuseCounts()
        prepare(backend, [SETTLED, _WHOLE_REUSE], audit=None)
        first = _timed(lambda: reuse.add_settled(backend, quiet=False))
        print(f"the exporter's first count of the reuse left (the history): {first:.2f} s")
        kept, whole, audits, settled, whole_reuse = [], [], [], [], []
        for _ in range(RUNS):
            generate(store, spans, ARRIVING_SPANS, span_ns=span_ns)
            spans += ARRIVING_SPANS
            kept.append(_timed(lambda: engine.evaluate(backend)))
            audits.append(sum(h.duration_s for h in engine.health.values()))
            settled.append(_timed(lambda: reuse.add_settled(backend, quiet=False)))
            with backend.cursor() as fresh:
                whole.append(_timed(lambda: RuleEngine(load_default_pack(), audit=LiveAudit()).evaluate(fresh)))
                prepare(fresh, [_WHOLE_REUSE], audit=None)
                whole_reuse.append(_timed(lambda: fresh.query(_WHOLE_REUSE)))
        arrived = ARRIVING_SPANS * PAGES_PER_SPAN
        print(
            f"evaluation after {arrived:,} page descriptors arrived (the fleet's {INTERVAL_S} s): median"
            f" {statistics.median(kept):.2f} s (rules {statistics.median(audits):.2f} s, the audit of what"
            f" arrived the rest); auditing the history, same run: {statistics.median(whole):.2f} s"
            f" ({statistics.median(whole) / statistics.median(kept):.1f}x)"
        )
        ratio = statistics.median(whole_reuse) / statistics.median(settled)
        print(
            f"exporter: the reuse left of the requests settled in the interval: median"
            f" {statistics.median(settled):.2f} s; over the whole history, same run:"
            f" {statistics.median(whole_reuse):.2f} s ({ratio:.1f}x)"
        )
        for (group, alert), health in sorted(engine.health.items()):
            print(f"  rule {group}/{alert}: {health.duration_s * 1000:.0f} ms")
        backend.close()


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started
