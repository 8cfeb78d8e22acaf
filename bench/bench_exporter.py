"""`kvaudit exporter` at fleet scale: time to listen, a scrape's latency, memory; a full recompute beside them.

Goals (issue 50): listening within 1 s of start, serving what it has while it catches up;
a scrape under 100 ms and independent of the history; memory bounded by a documented
budget. The exporter runs as the command a person starts (`kvaudit exporter DIR`), in a
process of its own, over trace files of 100k and 1M page rows; the baseline is what a
scrape cost before it read in the background: every figure recomputed over the whole
history (counters, findings, reuse left), timed in this process over the same files.

The traces are one simulated fleet's, copied until they hold the rows asked for
(`bench.copied_fleet`).

Sizes: KVAUDIT_BENCH_EXPORTER_PAGES (default "100000,1000000": page rows of each run).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Final

from bench.common import machine, smoke
from bench.copied_fleet import copied_fleet
from kvaudit.analyse.derived_views import prepare
from kvaudit.analyse.live_audit import LiveAudit
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.present.exporter_counts import ExporterCounts
from kvaudit.read.open import open_store

SIZES: Final = [int(n) for n in os.environ.get("KVAUDIT_BENCH_EXPORTER_PAGES", "100000,1000000").split(",")]
SCRAPES: Final = 5 if smoke() else 50


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120) as reply:
        return reply.read().decode()


def _behind(text: str) -> float:
    [line] = [line for line in text.splitlines() if line.startswith("kvaudit_exporter_behind_bytes")]
    return float(line.split()[-1])


def _memory_mib(pid: int, field: str) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split(f"{field}:")[1].split()[0]) / 1024


def _full_recompute(traces: Path) -> tuple[float, float]:
    """Seconds to read the files, and to figure every series over the whole history (what a scrape cost before)."""
    started = time.perf_counter()
    backend = DuckDBBackend(open_store([str(traces)]))
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    ExporterCounts.of_history(backend)
    reuse = "SELECT replica, sum(prompt_tokens) FROM query_reuse_left GROUP BY replica"
    prepare(backend, [reuse], audit=LiveAudit())
    backend.query("SELECT code, count(*) FROM findings GROUP BY code")
    backend.query(reuse)
    recompute_s = time.perf_counter() - started
    backend.close()
    return read_s, recompute_s


def _run(pages: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        started = time.perf_counter()
        fleet = copied_fleet(directory, pages)
        rows, traces = fleet.rows, fleet.traces
        size = sum(f.stat().st_size for f in traces.iterdir())
        print(f"{rows:,} page rows ({size / 2**20:,.0f} MiB) generated in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        exporter = subprocess.Popen(
            [sys.executable, "-m", "kvaudit", "exporter", str(traces), "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            line = exporter.stdout.readline() if exporter.stdout else ""
            port = int(line.rsplit(":", 1)[1].split("/")[0])
            first = _scrape(port)
            listening_s = time.perf_counter() - started
            print(
                f"listening and answering {listening_s:.2f} s after start (behind by {_behind(first) / 2**20:,.0f} MiB)"
            )
            during = []
            while _behind(_scrape(port)) > 0:
                began = time.perf_counter()
                _scrape(port)
                during.append(time.perf_counter() - began)
                time.sleep(0.2)
            caught_up_s = time.perf_counter() - started
            timings = []
            for _ in range(SCRAPES):
                began = time.perf_counter()
                _scrape(port)
                timings.append(time.perf_counter() - began)
            timings.sort()
            rss, peak = _memory_mib(exporter.pid, "VmRSS"), _memory_mib(exporter.pid, "VmHWM")
        finally:
            exporter.terminate()
            exporter.wait()
        read_s, recompute_s = _full_recompute(traces)
        median = timings[len(timings) // 2]
        while_reading = f", {max(during) * 1e3:.1f} ms at most while it read" if during else ""
        print(f"caught up (behind by 0 bytes) {caught_up_s:.1f} s after start")
        print(
            f"scrape, {rows:,} page rows: median {median * 1e3:.1f} ms,"
            f" fastest {timings[0] * 1e3:.1f} ms{while_reading};"
            f" full recompute, same run: {recompute_s * 1e3:,.0f} ms ({recompute_s / median:,.0f}x),"
            f" after a read of {read_s:.1f} s"
        )
        print(f"exporter memory: {rss:,.0f} MiB resident when caught up, {peak:,.0f} MiB at its peak")


def main() -> None:
    print(machine())
    for pages in SIZES[:1] if smoke() else SIZES:
        _run(2_000 if smoke() else pages)


if __name__ == "__main__":
    main()
