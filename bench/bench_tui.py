"""The TUI's refresh with a million page descriptors loaded (KVAUDIT_BENCH_TUI_PAGES): goal under 250 ms.

One refresh is what the app does every second: read what was appended to the trace
files (here one new line) and recompute every panel's figures over the window. The
million descriptors are generated straight into the store's tables (decoding JSON
is the reader's benchmark, not this one): four replicas over an hour, each fetch
span reusing pages another replica stored, one in fifty pages rejected.
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
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.contract import Hook, KVConfig, Op, Outcome, PageDescriptor
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter
from kvaudit.read.store import TraceStore
from kvaudit.read.store_file import open_bounded_store
from kvaudit.tui.figures import Analysis, compute_figures
from kvaudit.tui.findings import auditor as make_auditor
from kvaudit.tui.source import LiveSource
from kvaudit.tui.window import WINDOWS

PAGES: Final = env_int("KVAUDIT_BENCH_TUI_PAGES", 1_000_000, 10_000)
PAGES_PER_SPAN: Final = 32
REPLICAS: Final = 4
HOUR_NS: Final = 3600 * 10**9
GOAL_MS: Final = 250.0
RUNS: Final = sized(11, 2)

# Half the pages are stores, half fetches of keys stored by the next replica a little earlier.
_GENERATE: Final = (
    f"""
INSERT INTO kv_resources BY NAME
SELECT r AS resource_id, 'r' || r AS replica, 'vllm' AS service, 1 AS schema, 'vllm' AS engine,
       'google/gemma-2-27b' AS model, 'bfloat16' AS dtype, 'NB_2_BS_NH_HS' AS layout
FROM range({REPLICAS}) t(r)""",
    f"""
INSERT INTO kv_spans BY NAME
SELECT 'bench' AS file, s AS line, s % {REPLICAS} AS resource_id, 'r' || (s % {REPLICAS}) AS replica,
       printf('%032x', s) AS trace_id, printf('%016x', s) AS span_id,
       CASE WHEN s % 2 = 0 THEN 'kvaudit.store' ELSE 'kvaudit.fetch' END AS name,
       1_767_225_600_000_000_000 + s * ({HOUR_NS} // $spans) AS start_ns,
       1_767_225_600_000_000_000 + s * ({HOUR_NS} // $spans) + 2_000_000 + (s % 97) * 50_000 AS end_ns,
       0 AS status_code, 0 AS dropped_attributes, 0 AS dropped_events,
       CASE WHEN s % 2 = 0 THEN 'store' ELSE 'fetch' END AS op, 'req-' || (s // 2) AS request_id,
       'vllm.connector' AS hook, 'lmcache.remote' AS backend,
       {PAGES_PER_SPAN * 256} AS tokens_requested,
       CASE WHEN s % 2 = 1 THEN {PAGES_PER_SPAN * 256} - (s % 3) * 256 END AS tokens_hit,
       CASE WHEN s % 2 = 0 THEN {PAGES_PER_SPAN * 256} END AS tokens_stored,
       {PAGES_PER_SPAN} AS pages, {PAGES_PER_SPAN} * 94_208_000::BIGINT AS bytes, 'hit' AS outcome
FROM range($spans) t(s)""",
    f"""
INSERT INTO kv_pages BY NAME
SELECT 'bench' AS file, p // {PAGES_PER_SPAN} AS line, s % {REPLICAS} AS resource_id,
       'r' || (s % {REPLICAS}) AS replica,
       printf('%032x', s) AS trace_id, printf('%016x', s) AS span_id,
       CASE WHEN s % 2 = 0 THEN 'store' ELSE 'fetch' END AS op, 'vllm.connector' AS hook,
       'lmcache.remote' AS backend, 'req-' || (s // 2) AS request_id, 'hit' AS outcome,
       1_767_225_600_000_000_000 + s * ({HOUR_NS} // $spans) + p % {PAGES_PER_SPAN} AS time_ns,
       -- a fetch span reads the pages the store span just before it wrote
       md5(((s // 2) * {PAGES_PER_SPAN} + p % {PAGES_PER_SPAN})::VARCHAR) AS key,
       'sha256_cbor' AS hash_algo, (p % {PAGES_PER_SPAN}) * 256 AS token_start,
       (p % {PAGES_PER_SPAN} + 1) * 256 AS token_end, 'google/gemma-2-27b' AS model, 'bfloat16' AS dtype,
       [2, 46, 256, 2048] AS shape, 'NB_2_BS_NH_HS' AS layout, 94_208_000 AS bytes, 1 AS world_size, 0 AS rank,
       46 AS layers, 16 AS kv_heads, 128 AS head_size,
       CASE WHEN s % 2 = 1 THEN p % 50 <> 0 END AS used, 'cpu' AS tier
FROM (SELECT p, p // {PAGES_PER_SPAN} AS s FROM range($pages) t(p))""",
)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        live = Path(tmp) / "live.jsonl"
        emitter = setup_emitter("r9", f"file:{live}", engine="vllm", kv=KVConfig(model="google/gemma-2-27b"))
        _emit(emitter, 0)
        store = open_bounded_store([live], None, workers=1)  # as `kvaudit tui` makes a live one
        started = time.perf_counter()
        for statement in _GENERATE:
            params = {"pages": PAGES, "spans": PAGES // PAGES_PER_SPAN}
            store.con.execute(statement, {k: v for k, v in params.items() if f"${k}" in statement})
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
    """The auditor's pass over the same store: the TUI runs it in its worker, at most every few seconds."""
    auditor = make_auditor(skew_s=1.0)
    started = time.perf_counter()
    findings = auditor(DuckDBBackend(store))
    seconds = time.perf_counter() - started
    print(f"audit: {len(findings):,} findings in {seconds:.1f} s (in its own worker and connection, not per refresh)")


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
