"""Scale of the analysis side: audit, named queries and capacity curve over generated traces.

Figures, each beside its goal (issue 5):
- 10M page descriptors materialised as `kvaudit ingest` tables: audit + every named
  query, total time and peak memory (goal: < 30 s, < 4 GiB on the 2-core machine);
- 1M page descriptors as OTLP JSON written by the real exporter, read in place;
- the capacity curve over 10M accesses: SHARDS at 1% (goal: < 5 s, mean absolute
  error < 0.01 against the exact curve, whose time is shown as the baseline).

Sizes come from the environment, so a quick run is `KVAUDIT_BENCH_PAGES=200000
KVAUDIT_BENCH_JSON_PAGES=20000 python -m bench audit`:
- KVAUDIT_BENCH_PAGES (default 10,000,000): descriptors in the ingested database;
- KVAUDIT_BENCH_JSON_PAGES (default 1,000,000): descriptors in the OTLP JSON files;
- KVAUDIT_BENCH_DIR (default: a temporary directory): where the data goes and stays; a
  later run with the same sizes reuses it (generating takes longer than measuring).

The generator writes the contract's tables directly with DuckDB (hash-derived columns,
no Python object per row): requests of 8 pages over 4 replicas, page keys drawn with a
power-law popularity so early requests store and later ones fetch, often from another
replica, and about 0.1% of fetched pages carrying a wrong layout or missing fields so
that every audit path has work to do.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import msgspec
import numpy as np

from bench.common import KV, MODEL, PAGE_BYTES, PAGE_TOKENS, env_int
from bench.common import page as common_page
from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
from kvaudit.emit.setup import setup_emitter
from kvaudit.read.open import open_ingested
from kvaudit.read.store import TraceStore

PAGES_PER_REQUEST: Final = 8
REPLICAS: Final = 4
SHAPE: Final = MODEL.page_shape(KV.layout, PAGE_TOKENS)
QUERIES: Final = (
    "hit_rate",
    "cross_replica_reuse",
    "transfer_overhead",
    "prefix_locality",
    "reuse",
    "latency_histogram",
)

# One row per page: request r = i / 8 runs on replica r % 4 at 10 ms per request; the
# key is drawn with popularity ~ u^3 over keys/4 distinct keys (hot prefixes, long tail)
# and always covers the same tokens.
_GENERATE_PAGES: Final = """
INSERT INTO kv_pages (file, line, resource_id, replica, trace_id, span_id, op, hook, backend, request_id, outcome,
                      time_ns, key, hash_algo, token_start, token_end, model, dtype, shape, layout, bytes,
                      world_size, rank, layers, kv_heads, head_size, used, checksum, transfer, address, tier)
WITH drawn AS (
    SELECT i, i // {ppr} AS request, (i // {ppr}) % {replicas} AS replica,
           CAST(floor(pow((hash(i) % 1000003) / 1000003.0, 3) * {keys}) AS BIGINT) AS key_id
    FROM range({pages}) t(i)
),
ordered AS (
    SELECT *, row_number() OVER (PARTITION BY key_id ORDER BY i) = 1 AS first
    FROM drawn
)
SELECT 'bench.jsonl', request + 1, {resource_ids}[replica + 1], 'r' || replica,
       printf('%032x', request), printf('%016x', request * 2 + CAST(first AS INT)),
       CASE WHEN first THEN 'store' ELSE 'fetch' END, '{hook}', 'lmcache.remote', 'q' || request,
       CASE WHEN first THEN 'hit' ELSE 'partial' END,
       1700000000000000000 + request * 10000000 + i % {ppr},
       md5(CAST(key_id AS VARCHAR)), '{hash_algo}',
       (key_id % {ppr}) * {tokens}, (key_id % {ppr} + 1) * {tokens},
       CASE WHEN NOT first AND hash(i) % 2000 = 0 THEN NULL ELSE '{model}' END,
       'bfloat16', {shape}, CASE WHEN NOT first AND hash(i) % 2000 = 1 THEN 'NB_NH_BS_2HS' ELSE '{layout}' END,
       {page_bytes}, {world_size}, {rank}, {layers}, {kv_heads}, {head_size},
       CASE WHEN first THEN NULL ELSE hash(i) % 3 <> 0 END, NULL, 'copy', NULL, 'cpu'
FROM ordered
"""
_GENERATE_SPANS: Final = """
INSERT INTO kv_spans BY NAME
SELECT any_value(file) AS file, any_value(line) AS line, any_value(resource_id) AS resource_id,
       any_value(replica) AS replica, trace_id, span_id, 'kvaudit.' || any_value(op) AS name,
       min(time_ns) AS start_ns, min(time_ns) + 1000000 + hash(span_id) % 20000000 AS end_ns,
       0 AS status_code, 0 AS dropped_attributes, 0 AS dropped_events,
       any_value(op) AS op, any_value(request_id) AS request_id, any_value(hook) AS hook,
       any_value(backend) AS backend, {ppr} * {tokens} AS tokens_requested,
       sum(token_end - token_start) FILTER (WHERE op = 'fetch') AS tokens_hit,
       sum(token_end - token_start) FILTER (WHERE op = 'store') AS tokens_stored,
       count(*) AS pages, sum(bytes) AS bytes, any_value(outcome) AS outcome
FROM kv_pages
GROUP BY trace_id, span_id
"""


def main() -> None:
    pages = env_int("KVAUDIT_BENCH_PAGES", 10_000_000, 20_000)
    json_pages = env_int("KVAUDIT_BENCH_JSON_PAGES", 1_000_000, 2_000)
    base = os.environ.get("KVAUDIT_BENCH_DIR")
    with contextlib.ExitStack() as stack:
        folder = Path(base) if base else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        folder.mkdir(parents=True, exist_ok=True)
        database = folder / f"bench-{pages}.duckdb"
        _prepare(database, f"{pages:,} page descriptors", lambda path: generate_database(path, pages))
        row("audit + named queries, ingested", pages, *_measure_in_child("ingested", str(database)), "< 30 s, < 4 GiB")
        traces = folder / f"traces-{json_pages}"
        _prepare(traces, f"{json_pages:,} page descriptors as OTLP JSON", lambda path: generate_json(path, json_pages))
        row("read in place + audit + queries", json_pages, *_measure_in_child("files", str(traces)), "(none)")
        capacity(database)


def _prepare(path: Path, what: str, generate: Callable[[Path], None]) -> None:
    """Generate `path`, unless an earlier run left it there complete."""
    if path.exists():
        print(f"reusing {what} in {path}")
        return
    # Written under another name and renamed when done: an interrupted run leaves nothing to reuse.
    partial = path.with_name(f"{path.name}.partial")
    if partial.is_dir():
        shutil.rmtree(partial)
    partial.unlink(missing_ok=True)
    started = time.perf_counter()
    generate(partial)
    partial.rename(path)
    print(f"generated {what} into {path.name} in {time.perf_counter() - started:.1f} s")


def row(what: str, pages: int, seconds: float, cpu_seconds: float, peak_gib: float, goal: str) -> None:
    print(
        f"{what:<36} {pages:>12,} pages {seconds:>8.1f} s ({cpu_seconds:>6.1f} CPU s)"
        f" {peak_gib:>6.2f} GiB peak   goal {goal}"
    )


def generate_database(path: Path, pages: int) -> None:
    """A database as `kvaudit ingest` writes it, filled by DuckDB itself."""
    store = TraceStore([], str(path))
    store.con.execute("SET enable_progress_bar = false")
    store.con.execute("SET memory_limit = '4GB'")  # a shared machine
    resource_ids = [1000 + n for n in range(REPLICAS)]
    store.con.execute(
        "INSERT INTO kv_resources (resource_id, replica, service, pid, schema, engine, engine_version, model, dtype,"
        " layout, block_size, world_size, rank, hash_algo, layers, kv_heads, head_size)"
        " SELECT 1000 + r, 'r' || r, 'vllm', 1, 1, 'vllm', '0.32', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
        f" FROM range({REPLICAS}) t(r)",
        [
            KV.model,
            KV.dtype,
            KV.layout,
            KV.block_size,
            KV.world_size,
            KV.rank,
            KV.hash_algo,
            KV.layers,
            KV.kv_heads,
            KV.head_size,
        ],
    )
    values = {
        "ppr": PAGES_PER_REQUEST,
        "replicas": REPLICAS,
        "keys": max(pages // 4, 1),
        "pages": pages,
        "resource_ids": resource_ids,
        "hook": Hook.LMCACHE_ENGINE.value,
        "tokens": PAGE_TOKENS,
        "model": KV.model,
        "hash_algo": KV.hash_algo,
        "layout": KV.layout,
        "shape": list(SHAPE),
        "page_bytes": PAGE_BYTES,
        "world_size": KV.world_size,
        "rank": KV.rank,
        "layers": KV.layers,
        "kv_heads": KV.kv_heads,
        "head_size": KV.head_size,
    }
    store.con.execute(_GENERATE_PAGES.format(**values))
    store.con.execute(_GENERATE_SPANS.format(**values))
    store.close()


def generate_json(directory: Path, pages: int) -> None:
    """OTLP JSON through the real emitter and file exporter, the way hooks write it."""
    directory.mkdir(parents=True, exist_ok=True)
    emitters = [
        setup_emitter(f"r{r}", f"file:{directory}/r{r}.jsonl", engine="vllm", kv=KV, export_delay_s=0.05)
        for r in range(REPLICAS)
    ]
    rng = np.random.default_rng(0)
    key_ids = np.floor(rng.random(pages) ** 3 * max(pages // 4, 1)).astype(np.int64)
    seen: set[int] = set()
    for request in range(pages // PAGES_PER_REQUEST):
        emitter = emitters[request % REPLICAS]
        chunk = key_ids[request * PAGES_PER_REQUEST : (request + 1) * PAGES_PER_REQUEST].tolist()
        with emitter.operation(Op.FETCH, hook=Hook.LMCACHE_ENGINE, request_id=f"q{request}") as op:
            for key in chunk:
                if key in seen:
                    op.add_page(_page(key, True))
            op.end(Outcome.PARTIAL, tokens_hit=0)
        with emitter.operation(Op.STORE, hook=Hook.LMCACHE_ENGINE, request_id=f"q{request}") as op:
            for key in chunk:
                if key not in seen:
                    seen.add(key)
                    op.add_page(_page(key, None))
            op.end(Outcome.HIT)
        if request % 2000 == 0:
            emitter.flush()  # keep the export queue from dropping spans
    for emitter in emitters:
        emitter.shutdown()


def _page(key: int, used: bool | None) -> PageDescriptor:
    # A key always covers the same tokens, so stores and fetches of it agree.
    return msgspec.structs.replace(common_page(key % PAGES_PER_REQUEST, used=used), key=f"{key:064x}")


def _measure_in_child(kind: str, path: str) -> tuple[float, float, float]:
    """Seconds, CPU seconds and peak memory (GiB) of open + audit + queries, in a fresh process."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.audit_run", kind, path], check=True, capture_output=True, text=True
    )
    seconds, cpu_seconds, peak_kib = result.stdout.split()
    return float(seconds), float(cpu_seconds), int(peak_kib) / 2**20


def capacity(database: Path) -> None:
    from kvaudit.analyse.capacity import capacity_curve

    store = open_ingested(str(database))
    try:
        started = time.perf_counter()
        exact = capacity_curve(store, sample_rate=1.0)
        exact_s = time.perf_counter() - started
        started = time.perf_counter()
        sampled = capacity_curve(store, sample_rate=0.01)
        sampled_s = time.perf_counter() - started
    finally:
        store.close()
    grid = exact.grid(100)
    mae = float(np.mean(np.abs(sampled.hit_rate(grid) - exact.hit_rate(grid))))
    print(
        f"capacity curve, {exact.accesses:,} accesses: exact {exact_s:.1f} s (baseline);"
        f" SHARDS 1% {sampled_s:.1f} s ({sampled.accesses:,} sampled), MAE {mae:.4f}   goal < 5 s, MAE < 0.01"
    )
    print(f"peak memory of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
