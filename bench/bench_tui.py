"""The TUI's refresh with a million page descriptors loaded (KVAUDIT_BENCH_TUI_PAGES): goal under 250 ms.

One refresh is what the app does every second: read what was appended to the trace
files (here one new line) and recompute every panel's figures over the window. The
million descriptors are generated straight into the store's tables (`live_fleet`): four
replicas over an hour.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from bench.common import env_int, sized
from bench.live_fleet import PAGES_PER_SPAN, generate, span_ns_for
from kvaudit.analyse.live_audit import LiveAudit
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.contract import Hook, KVConfig, Op, Outcome, PageDescriptor
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter
from kvaudit.read.store import TraceStore
from kvaudit.read.store_file import open_bounded_store
from kvaudit.tui.figures import Analysis, compute_figures
from kvaudit.tui.source import LiveSource
from kvaudit.tui.window import WINDOWS

PAGES: Final = env_int("KVAUDIT_BENCH_TUI_PAGES", 1_000_000, 10_000)
GOAL_MS: Final = 250.0
RUNS: Final = sized(11, 2)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        live = Path(tmp) / "live.jsonl"
        emitter = setup_emitter("r9", f"file:{live}", engine="vllm", kv=KVConfig(model="google/gemma-2-27b"))
        _emit(emitter, 0)
        store = open_bounded_store([live], None, workers=1)  # as `kvaudit tui` makes a live one
        started = time.perf_counter()
        generate(store, 0, PAGES // PAGES_PER_SPAN, span_ns=span_ns_for(PAGES))
        _, [(pages,)] = store.query("SELECT count(*) FROM pages")
        print(f"generated {pages:,} page descriptors in {time.perf_counter() - started:.1f} s")
        # The machine is shared: wall times are only comparable at a similar load.
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        started = time.perf_counter()
        source = LiveSource(store, auditor=None)
        print(f"indexed their producers in {time.perf_counter() - started:.1f} s (once, when the TUI starts)")
        for window in WINDOWS:
            source.poll(window)  # warm: DuckDB plans and caches on first use
            timings, cpu = [], []
            for run in range(RUNS):
                _emit(emitter, run + 1)  # one appended line to read, as in a live refresh
                started, started_cpu = time.perf_counter(), time.process_time()
                source.poll(window)
                timings.append((time.perf_counter() - started) * 1000)
                cpu.append((time.process_time() - started_cpu) * 1000)
            figures_only = _median_ms(
                lambda w=window: compute_figures(source.backend, w, analysis=Analysis(), indexed=True)
            )
            median = statistics.median(timings)
            # The median, not the max, is judged: on a shared machine single runs wait for a CPU.
            verdict = "ok" if median < GOAL_MS else "OVER GOAL"
            print(
                f"refresh, window {window.name:>3}: median {median:6.1f} ms, max {max(timings):6.1f} ms,"
                f" CPU {statistics.median(cpu):6.1f} ms (figures alone {figures_only:6.1f} ms;"
                f" goal < {GOAL_MS:.0f} ms: {verdict})"
            )
        _audit(store)
        emitter.shutdown()
        source.close()


def _audit(store: TraceStore) -> None:
    """The auditor's first pass over the same store (the history): the TUI runs it in its worker."""
    backend = DuckDBBackend(store)
    started = time.perf_counter()
    LiveAudit().update(backend)
    seconds = time.perf_counter() - started
    [(findings,)] = backend.query("SELECT count(*) FROM findings")[1]
    print(f"audit: {findings:,} findings in {seconds:.1f} s (in its own worker and connection, not per refresh)")


def _emit(emitter: Emitter, n: int) -> None:
    with emitter.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id=f"live-{n}", tokens_requested=256) as op:
        op.add_page(PageDescriptor(key=f"{n:064x}", used=True))
        op.end(Outcome.HIT, tokens_hit=256)
    emitter.flush()


def _median_ms(call: Callable[[], object]) -> float:
    timings = []
    for _ in range(RUNS):
        started = time.perf_counter()
        call()
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)
