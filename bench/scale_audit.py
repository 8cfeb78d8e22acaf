"""One measured audit for bench_scale, in its own process so that its peak memory is its own.

    python -m bench.scale_audit duckdb fleet.duckdb by-day 1000000 | parquet DIR whole | chdb DIR by-day

The last argument is the fetched pages per partition of the audit by day. Prints the
seconds the audit took, the CPU seconds this process used, its peak resident memory in KiB,
the number of findings and of partitions (1 for the whole audit).
DuckDB's memory limit is KVAUDIT_BENCH_MEMORY (default 4GB), as in bench_scale.
"""

from __future__ import annotations

import os
import resource
import sys
import time

from kvaudit.analyse.audit import run_audit
from kvaudit.analyse.audit_partitions import ROWS_PER_PARTITION, plan, run_audit_by_partition
from kvaudit.backends import Backend
from kvaudit.backends.clickhouse import connect
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.read.open import open_ingested, open_parquet


def open_backend(kind: str, path: str) -> Backend:
    if kind == "chdb":
        return connect(f"chdb://{path}")
    store = open_ingested(path) if kind == "duckdb" else open_parquet(path)
    store.con.execute(f"SET memory_limit = '{os.environ.get('KVAUDIT_BENCH_MEMORY', '4GB')}'")
    return DuckDBBackend(store)


def main(kind: str, path: str, mode: str, partition_rows: str = str(ROWS_PER_PARTITION)) -> None:
    backend = open_backend(kind, path)
    rows = int(partition_rows)
    started = time.perf_counter()
    if mode == "by-day":
        findings = run_audit_by_partition(backend, rows_per_partition=rows)
        partitions = len(plan(backend, rows_per_partition=rows))
    else:
        findings, partitions = run_audit(backend), 1
    elapsed = time.perf_counter() - started
    backend.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{elapsed:.2f} {usage.ru_utime + usage.ru_stime:.2f} {peak_kib()} {len(findings)} {partitions}")


def peak_kib() -> int:
    """This process's peak resident memory: VmHWM, not ru_maxrss, which Linux carries over from the parent
    that forked it (here one holding chdb and a fleet)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


if __name__ == "__main__":
    main(*sys.argv[1:])
