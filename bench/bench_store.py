"""`kvaudit explain` over a fleet's raw trace directory through `--store`: what arrived since the last look.

Goals (issue 50): `explain` on a fleet's raw trace directory in under 2 s at 10M page rows,
each command costing what arrived since the last one, not the history; a store that takes
in at least what the reader reads (`kvaudit ingest` against `kvaudit sql` reading the same
files into memory, in the same run), so that one machine keeps up with a fleet's emission
(docs/design.md section 5: 1,300 descriptors/s a replica). Each figure is
the command a person runs, in a process of its own (wall time and peak memory): the
first `explain --store` (it reads the whole history into the store: `ingest`'s cost),
the next with nothing new, the next after a replica's file grew by about 1%; the
baseline, in the same run, is `explain` over the files themselves (read whole each time).

The traces are one simulated fleet's, copied until they hold the rows asked for
(`bench.copied_fleet`).

Sizes: KVAUDIT_BENCH_STORE_PAGES (default 10,000,000 page rows).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from bench.common import env_int, machine
from bench.copied_fleet import SIM_SECONDS, copied_fleet
from kvaudit.read.open import open_store

PAGES: Final = env_int("KVAUDIT_BENCH_STORE_PAGES", 10_000_000, 2_000)


def _run(command: list[str]) -> tuple[float, float]:
    """Wall seconds and peak memory (MiB) of a kvaudit command in a process of its own."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "kvaudit", *command], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"kvaudit {' '.join(command)}: exit status {child.returncode}")
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        fleet = copied_fleet(directory, PAGES)
        traces, copies, rows, request = fleet.traces, fleet.copies, fleet.rows, fleet.request
        size = sum(f.stat().st_size for f in traces.iterdir())
        print(f"{copies} copies of a {SIM_SECONDS} s run of 4 replicas: {rows:,} page rows, {size / 2**20:,.0f} MiB")
        read = _run(["sql", str(traces), "SELECT count(*) FROM pages"])
        ingested = _run(["ingest", str(traces), "-o", str(directory / "ingested.duckdb"), "-q"])
        for name, (seconds, peak) in (("kvaudit sql, read into memory", read), ("kvaudit ingest -o", ingested)):
            print(
                f"{name}: {seconds:.1f} s, {size / 2**20 / seconds:,.0f} MiB/s,"
                f" {rows / seconds:,.0f} page rows/s ({rows / seconds / 1300:,.0f} replicas' emission),"
                f" {peak:,.0f} MiB peak"
            )
        print(f"ingest / read: {read[0] / ingested[0]:.2f}x the reader's rate")
        (directory / "ingested.duckdb").unlink()
        store = str(directory / "store.duckdb")
        with_store = ["explain", "--store", store, str(traces), request, "--format", "json"]
        first = _run(with_store)
        print(f"explain --store, first (reads the history into the store): {first[0]:.1f} s, {first[1]:,.0f} MiB peak")
        rows = open_store([store])
        [(pages,)] = rows.query("SELECT count(*) FROM pages")[1]
        rows.close()
        print(f"store: {pages:,} page rows, {Path(store).stat().st_size / 2**20:,.0f} MiB on disk")
        again = _run(with_store)
        print(f"explain --store, nothing new: {again[0]:.2f} s, {again[1]:,.0f} MiB peak")
        grown = traces / fleet.base_files[0].name
        added = fleet.copy_of(fleet.base_files[0], copies)
        with grown.open("ab") as out:
            out.write(added)
        after = _run(with_store)
        print(
            f"explain --store, after {len(added) / 2**20:,.1f} MiB more ({len(added) / size:.1%}):"
            f" {after[0]:.2f} s, {after[1]:,.0f} MiB peak"
        )
        whole = _run(["explain", str(traces), request, "--format", "json"])
        print(
            f"baseline, explain over the files read whole, same run: {whole[0]:.1f} s, {whole[1]:,.0f} MiB peak"
            f" ({whole[0] / again[0]:,.0f}x / {whole[0] / after[0]:,.0f}x the store's)"
        )


if __name__ == "__main__":
    main()
