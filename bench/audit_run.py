"""One measured run for bench_audit, in its own process so its peak memory is its own.

    python -m bench.audit_run ingested traces.duckdb | files traces/

Prints the seconds taken to open the traces, run the audit and every named query, the
CPU seconds this process used for it, and its peak resident memory in KiB. DuckDB's memory limit is KVAUDIT_BENCH_MEMORY
(default 3GB), so that it stays inside the 4 GiB goal by spilling rather than by luck.
"""

from __future__ import annotations

import os
import resource
import sys
import time

from bench.bench_audit import QUERIES
from kvaudit.analyse.audit import run_audit
from kvaudit.analyse.named_queries import run_named
from kvaudit.read.open import open_ingested, open_store


def main(kind: str, path: str) -> None:
    started = time.perf_counter()
    store = open_ingested(path) if kind == "ingested" else open_store([path])
    # DuckDB would otherwise take most of the machine's memory and spill only beyond it.
    store.con.execute(f"SET memory_limit = '{os.environ.get('KVAUDIT_BENCH_MEMORY', '3GB')}'")
    run_audit(store)
    for name in QUERIES:
        run_named(store, name)
    store.close()
    elapsed = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)  # the reader's decoding processes
    cpu = usage.ru_utime + usage.ru_stime + workers.ru_utime + workers.ru_stime
    # CPU seconds beside wall seconds: on a shared machine the wall clock also measures the neighbours.
    print(f"{elapsed:.2f} {cpu:.2f} {max(usage.ru_maxrss, workers.ru_maxrss)}")


if __name__ == "__main__":
    main(*sys.argv[1:])
