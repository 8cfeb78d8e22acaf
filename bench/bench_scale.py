"""Fleet scale: page descriptors scanned from Parquet, from an ingested DuckDB database and from chdb.

The same generated fleet (16 replicas, 128 pages per operation, fetches reusing the
previous operation's pages on another replica) is materialised three ways:
`kvaudit ingest`'s DuckDB tables, `kvaudit ingest --parquet`'s partitioned dataset,
and the OpenTelemetry Collector's `otel_traces` table in chdb (rows mapped as its
ClickHouse exporter maps OTLP). Each backend then runs the same kvaudit SQL: a full
scan, a filter on replica and operation, a point lookup of one key, and the named
query `summary` (a join of every fetch to the first store of its key), then that join's
two steps alone: the first store of each key, and every fetch joined to it.

Sizes: KVAUDIT_BENCH_SCALE_PAGES (comma-separated, default 10000000).
Where: KVAUDIT_BENCH_DIR (default: a temporary directory, removed afterwards).
Audits: KVAUDIT_BENCH_SCALE_AUDITS=0 leaves them out (at 10M they take about an hour here).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import sqlglot

from bench import scale_codecs
from bench.common import env_int, machine, sized
from kvaudit.analyse.named_queries import load
from kvaudit.backends import Backend
from kvaudit.backends.clickhouse import ChdbConnection, ClickHouseBackend
from kvaudit.backends.clickhouse_load import create_table
from kvaudit.backends.clickhouse_setup import setup
from kvaudit.backends.clickhouse_tables import TYPED_TABLES
from kvaudit.backends.clickhouse_views import DEFAULT_TABLE
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.contract import EVENT_PAGE, PAGE_COLUMNS, RESOURCE_COLUMNS, SPAN_COLUMNS, Hook, Op, Outcome
from kvaudit.read import parquet
from kvaudit.read.open import open_ingested, open_parquet
from kvaudit.read.store import TraceStore

REPLICAS: Final = 16
PAGES_PER_SPAN: Final = 128
PAGE_TOKENS: Final = 256
# Gemma-2-27B pages (docs/design.md section 5): 46 layers x 16 KV heads x head size 128, bf16.
SHAPE: Final = (2, 46, PAGE_TOKENS, 16 * 128)
PAGE_BYTES: Final = 2 * 46 * PAGE_TOKENS * 16 * 128 * 2
START_NS: Final = 1_796_083_200 * 10**9  # 2026-12-01 00:00 UTC
MEMORY: Final = os.environ.get("KVAUDIT_BENCH_MEMORY", "4GB")  # DuckDB's limit: it spills beyond
WHOLE_AUDIT_UP_TO: Final = 10_000_000  # beyond, only the audit by day (the whole one outgrows the machine)
# Fetched pages per partition of the audit by day: small enough that the sizes this machine
# can hold split into several, so that its peak memory shows whether it follows a partition.
PARTITION_ROWS: Final = env_int("KVAUDIT_BENCH_PARTITION_ROWS", 500_000, 5_000)
AUDITS: Final = os.environ.get("KVAUDIT_BENCH_SCALE_AUDITS", "1") != "0"
QUERIES: Final = {
    "scan": "SELECT count(*) AS pages, sum(bytes) AS bytes, count(DISTINCT key) AS keys FROM pages",
    "filter": "SELECT count(*) AS pages, sum(bytes) AS bytes FROM pages WHERE replica = 'r3' AND op = 'fetch'",
    "point": "SELECT count(*) AS pages FROM pages WHERE key = md5('64')",
    "summary": load("summary"),
}


def _summary_parts() -> dict[str, str]:
    """`summary`'s costly part in two steps, taken from the query itself: its first store of
    each key alone, and that with every fetch joined to it (the rest is per replica)."""
    summary = sqlglot.parse_one(QUERIES["summary"], read="duckdb")
    ctes = {cte.alias: cte for cte in summary.ctes}
    first = f"WITH {ctes['first_store'].sql('duckdb')}"
    return {
        "  first store": f"{first} SELECT count(*) AS keys, max(stored_ns) AS newest FROM first_store",
        "  + the join": f"{first}, {ctes['fetched'].sql('duckdb')} SELECT * FROM fetched ORDER BY replica",
    }


PARTS: Final = _summary_parts()


def main() -> None:
    sizes = [int(n) for n in os.environ.get("KVAUDIT_BENCH_SCALE_PAGES", str(sized(10_000_000, 12_800))).split(",")]
    root = os.environ.get("KVAUDIT_BENCH_DIR")
    work = Path(root) if root else Path(tempfile.mkdtemp(prefix="kvaudit-scale-"))
    print(machine())
    try:
        for number, pages in enumerate(sizes):
            _bench(pages, work / f"{pages}", codecs=number == len(sizes) - 1)
    finally:
        if not root:
            shutil.rmtree(work, ignore_errors=True)


def _bench(pages: int, work: Path, *, codecs: bool) -> None:
    print(f"\n{pages:,} page descriptors ({pages // PAGES_PER_SPAN:,} spans, {REPLICAS} replicas)")
    database, dataset, chdb = work / "fleet.duckdb", work / "parquet", work / "chdb"
    if (work / "complete").is_file():
        print(f"  reusing the fleet in {work}")
    else:
        _materialise(pages, work, database, dataset, chdb)
    clickhouse = ClickHouseBackend(ChdbConnection(str(chdb)), typed=False)
    typed = ClickHouseBackend(ChdbConnection(str(chdb)))
    sizes = {
        "duckdb": database.stat().st_size,
        "parquet": sum(f.stat().st_size for f in dataset.rglob("*.parquet")),
        "chdb": _bytes_on_disk(clickhouse, [DEFAULT_TABLE]),
        "chdb-typed": _bytes_on_disk(clickhouse, [table.name for table in TYPED_TABLES]),
    }
    print("  on disk: " + ", ".join(f"{name} {size / 2**20:,.0f} MiB" for name, size in sizes.items()))
    backends: dict[str, Backend] = {
        "duckdb": DuckDBBackend(open_ingested(str(database))),
        "parquet": DuckDBBackend(open_parquet(str(dataset))),
        "chdb": clickhouse,
        "chdb-typed": typed,
    }
    for backend in backends.values():
        if isinstance(backend, DuckDBBackend):
            backend.query(f"SET memory_limit = '{MEMORY}'")
    assert typed.query("SELECT 1") and typed.reads_typed_tables, "chdb-typed must read the typed tables"
    print(f"  {'query':<14}" + "".join(f"{name:>12}" for name in backends) + "   (seconds, best of 2)   typed/duckdb")
    for name, sql in {**QUERIES, **PARTS}.items():
        seconds, answers = [], []
        for backend in backends.values():
            best, rows = min((_run(backend, sql) for _ in range(2)), key=lambda result: result[0])
            seconds.append(best)
            answers.append(rows)
        agree = "" if name == "summary" or all(a == answers[0] for a in answers) else "   answers differ!"
        ratio = seconds[-1] / seconds[0]
        print(
            f"  {name:<14}" + "".join(f"{s:>12.2f}" for s in seconds) + f"   {ratio:>21.2f}x"
            f"  ({seconds[-1] / pages * 1e9:.1f} ns per descriptor){agree}"
        )
    if codecs:
        print("\n".join(scale_codecs.measure(typed)))
    for backend in backends.values():
        backend.close()
    if AUDITS:
        _audit(database, dataset, chdb, pages)


def _audit(database: Path, dataset: Path, chdb: Path, pages: int) -> None:
    """The audit by day and whole on each backend, with its time and peak memory."""
    # Each audit in a process of its own (chdb's database directory admits one process at a time).
    modes = ["by-day", "whole"] if pages <= sized(WHOLE_AUDIT_UP_TO, 0) else ["by-day"]
    print(f"  {'audit':<18}{'seconds':>10}{'CPU s':>10}{'peak GiB':>10}{'findings':>10}{'partitions':>12}")
    for kind, path in (("duckdb", database), ("parquet", dataset), ("chdb", chdb)):
        for mode in modes:
            result = subprocess.run(
                [sys.executable, "-m", "bench.scale_audit", kind, str(path), mode, str(PARTITION_ROWS)],
                capture_output=True,
                text=True,
                check=True,
            )
            seconds, cpu, peak_kib, findings, partitions = result.stdout.split()
            print(
                f"  {kind + ' ' + mode:<18}{float(seconds):>10.1f}{float(cpu):>10.1f}"
                f"{int(peak_kib) / 2**20:>10.2f}{findings:>10}{partitions:>12}"
            )


def _materialise(pages: int, work: Path, database: Path, dataset: Path, chdb: Path) -> None:
    """The fleet three ways: kvaudit ingest's DuckDB tables, its Parquet, and chdb's otel_traces (with the
    typed tables `kvaudit clickhouse setup` makes, filled by their materialized views as the rows arrive)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    store = TraceStore(database=str(database))
    # Within this machine's means (2 cores, shared): DuckDB spills what exceeds this.
    store.con.execute(f"SET memory_limit = '{MEMORY}'")
    store.con.execute("SET preserve_insertion_order = false")
    _timed("generate into DuckDB (kvaudit ingest's tables)", lambda: _generate(store, pages))
    _timed("write Parquet (kvaudit ingest --parquet)", lambda: parquet.write(store, str(dataset)))
    clickhouse = ClickHouseBackend(ChdbConnection(str(chdb)))
    create_table(clickhouse)
    for _ in setup(clickhouse):
        pass
    _timed(
        "map to otel_traces in chdb (MergeTree), typed tables filled at insert",
        lambda: _load_otel_traces(store, work, clickhouse),
    )
    clickhouse.close()
    store.close()
    (work / "complete").touch()


def _bytes_on_disk(clickhouse: ClickHouseBackend, tables: list[str]) -> int:
    names = ", ".join(f"'{name}'" for name in tables)
    [(size,)] = clickhouse.query(f"SELECT sum(bytes_on_disk) FROM system.parts WHERE active AND table IN ({names})")[1]
    return int(size)


def _run(backend: Backend, sql: str) -> tuple[float, Any]:
    started = time.perf_counter()
    rows = backend.query(sql)[1]
    return time.perf_counter() - started, rows


def _timed(what: str, action: Callable[[], object]) -> None:
    started = time.perf_counter()
    action()
    print(f"  {what}: {time.perf_counter() - started:.1f} s")


def _generate(store: TraceStore, pages: int) -> None:
    """A fleet in kvaudit's tables: span i is a store when even, else a fetch of span i-1's keys."""
    spans = pages // PAGES_PER_SPAN
    op = f"CASE WHEN i % 2 = 0 THEN '{Op.STORE}' ELSE '{Op.FETCH}' END"
    common = f"""
        'bench' AS file, i AS line, i % {REPLICAS} AS resource_id, 'r' || (i % {REPLICAS}) AS replica,
        md5('t' || i) AS trace_id, substr(md5('s' || i), 1, 16) AS span_id, {op} AS op,
        '{Hook.LMCACHE_ENGINE}' AS hook, 'lmcache.remote' AS backend, 'q' || i AS request_id,
        '{Outcome.HIT}' AS outcome"""
    con = store.con
    con.execute(f"""
        INSERT INTO kv_resources BY NAME
        SELECT k AS resource_id, 'r' || k AS replica, 'vllm' AS service, 1000 + k AS pid, 1 AS schema,
               'vllm' AS engine, '0.11' AS engine_version, 'google/gemma-2-27b' AS model, 'bfloat16' AS dtype,
               'NB_2_BS_NH_HS' AS layout, {PAGE_TOKENS} AS block_size, 1 AS world_size, 0 AS rank,
               'sha256_cbor' AS hash_algo, 46 AS layers, 16 AS kv_heads, 128 AS head_size
        FROM range({REPLICAS}) r(k)""")
    con.execute(f"""
        INSERT INTO kv_spans BY NAME
        SELECT {common}, NULL AS parent_span_id, 'kvaudit.' || {op} AS name,
               {START_NS} + i * 1000000000 AS start_ns, {START_NS} + i * 1000000000 + 2000000 AS end_ns,
               0 AS status_code, 0 AS dropped_attributes, 0 AS dropped_events,
               {PAGES_PER_SPAN * PAGE_TOKENS} AS tokens_requested,
               CASE WHEN i % 2 = 1 THEN {PAGES_PER_SPAN * PAGE_TOKENS} END AS tokens_hit,
               CASE WHEN i % 2 = 0 THEN {PAGES_PER_SPAN * PAGE_TOKENS} END AS tokens_stored,
               {PAGES_PER_SPAN} AS pages, {PAGES_PER_SPAN * PAGE_BYTES} AS bytes
        FROM range({spans}) s(i)""")
    con.execute(f"""
        INSERT INTO kv_pages BY NAME
        SELECT {common}, {START_NS} + i * 1000000000 + j * 1000 AS time_ns,
               md5(((i - i % 2) * {PAGES_PER_SPAN} + j)::VARCHAR) AS key, 'sha256_cbor' AS hash_algo,
               j * {PAGE_TOKENS} AS token_start, (j + 1) * {PAGE_TOKENS} AS token_end,
               'google/gemma-2-27b' AS model, 'bfloat16' AS dtype, {list(SHAPE)} AS shape,
               'NB_2_BS_NH_HS' AS layout, {PAGE_BYTES} AS bytes, 1 AS world_size, 0 AS rank,
               46 AS layers, 16 AS kv_heads, 128 AS head_size,
               CASE WHEN i % 2 = 1 THEN true END AS used, 'copy' AS transfer, 'cpu' AS tier
        FROM (SELECT g // {PAGES_PER_SPAN} AS i, g % {PAGES_PER_SPAN} AS j
              FROM range({spans * PAGES_PER_SPAN}) t(g))""")


def _text_map(columns: dict[str, tuple[str, str]], prefix: str) -> str:
    """ClickHouse SQL for a Map of attribute key to text, as the exporter stores it, of the present values."""
    text = {
        "str": "{}",
        "int": "toString({})",
        "bool": "toString({})",
        "double": "toString({})",
        "ints": "toJSONString({})",
    }
    pairs = ", ".join(f"'{key}', {text[kind].format(prefix + name)}" for name, (key, kind) in columns.items())
    return f"CAST(mapFilter((k, v) -> v IS NOT NULL, map({pairs})) AS Map(String, String))"


def _load_otel_traces(store: TraceStore, work: Path, clickhouse: ClickHouseBackend) -> None:
    """The store's spans as `otel_traces` rows, mapped as the Collector's ClickHouse exporter maps OTLP.

    The flat tables travel as Parquet and ClickHouse builds the attribute maps and
    nested events, which it does far faster than DuckDB builds maps.
    """
    files = {}
    for table in ("kv_spans", "kv_pages", "kv_resources"):
        files[table] = work / f"{table}.parquet"
        store.con.execute(f"COPY {table} TO '{files[table]}' (FORMAT parquet)")
    # In batches of spans (`line` is the span's number), so that no more than about a
    # million events are grouped in memory at once.
    [(pages,)] = store.con.execute("SELECT count(*) FROM kv_pages").fetchall()
    batches = max(1, pages // 10**6)
    for batch in range(batches):
        chosen = f"line % {batches} = {batch}"
        clickhouse.connection.command(f"""
            INSERT INTO otel_traces (Timestamp, TraceId, SpanId, SpanName, SpanKind, ServiceName, ResourceAttributes,
                                     ScopeName, SpanAttributes, Duration, StatusCode,
                                     `Events.Timestamp`, `Events.Name`, `Events.Attributes`)
            WITH events AS (
                SELECT span_id, groupArray(fromUnixTimestamp64Nano(time_ns)) AS times,
                       groupArray('{EVENT_PAGE}') AS names, groupArray({_text_map(PAGE_COLUMNS, "")}) AS attributes
                FROM file('{files["kv_pages"]}', Parquet) WHERE {chosen} GROUP BY span_id
            )
            SELECT fromUnixTimestamp64Nano(s.start_ns), s.trace_id, s.span_id, s.name, 'Internal', r.service,
                   {_text_map(RESOURCE_COLUMNS, "r.")}, 'kvaudit', {_text_map(SPAN_COLUMNS, "s.")},
                   s.end_ns - s.start_ns, 'Unset', e.times, e.names, e.attributes
            FROM (SELECT * FROM file('{files["kv_spans"]}', Parquet) WHERE {chosen}) AS s
            JOIN file('{files["kv_resources"]}', Parquet) AS r ON r.resource_id = s.resource_id
            LEFT JOIN events AS e ON e.span_id = s.span_id""")
