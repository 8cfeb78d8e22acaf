"""Installing and starting kvaudit (issue 18): both installs' time and size, the startup of
`kvaudit --help` beside `python -c pass`, and a first `kvaudit sql` beside a warm one.

The plain install (`pip install kvaudit`, the serving side) and `kvaudit[all]` are made
from the wheel of this checkout into fresh environments, their dependencies from the
package index as a user's would come. The first `kvaudit sql` runs with an empty cache
directory: the page scanner is built in the background while msgspec reads.
`KVAUDIT_BENCH_INSTALL_ALL=0` leaves out the `[all]` install (about 1.4 GB).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

from bench.common import env_int, machine, report, sized, smoke
from kvaudit.read.reader import SCAN_MIN_BYTES

ROOT = Path(__file__).resolve().parent.parent
STARTUP_RATIO = 10  # `kvaudit --help` against `python -c pass` (issue 52)


def _timed(argv: list[str], **kwargs: object) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, **kwargs)  # type: ignore[call-overload]
    return time.perf_counter() - started


def _size_mib(environment: Path) -> float:
    total = sum(f.stat().st_size for f in environment.rglob("*") if f.is_file() and not f.is_symlink())
    return total / (1 << 20)


def _install(wheel: Path, where: Path, extra: str) -> tuple[float, float]:
    """Seconds and MiB of a fresh environment with the wheel (and `extra`) installed."""
    venv.create(where, with_pip=True)
    baseline = _size_mib(where)
    python = str(where / "bin" / "python")
    seconds = _timed([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{wheel}{extra}"])
    return seconds, _size_mib(where) - baseline


def _median_start(argv: list[str]) -> float:
    return statistics.median(_timed(argv) for _ in range(sized(7, 1)))


def main() -> None:
    print(machine())
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(work),
                str(ROOT),
            ],
            check=True,
            capture_output=True,
        )
        [wheel] = work.glob("kvaudit-*.whl")
        plain_s, plain_mib = _install(wheel, work / "plain", "")
        rows.append(["install: pip install kvaudit (s)", f"{plain_s:.1f}", "", "", ""])
        rows.append(["install size: plain (MiB)", f"{plain_mib:.0f}", "", "", "the serving side only"])
        if env_int("KVAUDIT_BENCH_INSTALL_ALL", 1, 0):
            all_s, all_mib = _install(wheel, work / "all", "[all]")
            rows.append(["install: kvaudit[all] (s)", f"{all_s:.1f}", f"{plain_s:.1f}", f"{all_s / plain_s:.1f}", ""])
            rows.append(
                ["install size: [all] (MiB)", f"{all_mib:.0f}", f"{plain_mib:.0f}", f"{all_mib / plain_mib:.0f}", ""]
            )

        kvaudit = str(Path(sys.executable).parent / "kvaudit")
        python_s = _median_start([sys.executable, "-c", "pass"])
        help_s = _median_start([kvaudit, "--help"])
        sql_help_s = _median_start([kvaudit, "sql", "--help"])
        goal = f"< {STARTUP_RATIO}x"
        rows.append(["kvaudit --help (s)", f"{help_s:.2f}", f"{python_s:.2f}", f"{help_s / python_s:.1f}", goal])
        rows.append(
            ["kvaudit sql --help (s)", f"{sql_help_s:.2f}", f"{python_s:.2f}", f"{sql_help_s / python_s:.1f}", ""]
        )

        # A file large enough for the page scanner: the simulator's traces, repeated.
        subprocess.run(
            [kvaudit, "simulate", "--out", str(work / "sim"), "--duration", str(sized(60, 10)), "--quiet"],
            check=True,
            capture_output=True,
        )
        lines = b"".join(p.read_bytes() for p in sorted((work / "sim" / "traces").glob("*.jsonl")))
        traces = work / "traces"
        traces.mkdir()
        size = env_int("KVAUDIT_BENCH_INSTALL_SQL_BYTES", 5 << 20, SCAN_MIN_BYTES)
        (traces / "r1.jsonl").write_bytes(lines * max(1, size // len(lines)))
        query = [kvaudit, "sql", str(traces), "SELECT count(*) FROM pages", "--format", "csv"]
        # An empty scanner cache, as after an install; a smoke run keeps the built one (a
        # build takes about a minute).
        fresh = dict(os.environ)
        if not smoke():
            fresh["KVAUDIT_CACHE_DIR"] = str(work / "cache")
            fresh.pop("NUMBA_CACHE_DIR", None)
        started = time.perf_counter()
        first_s = _timed(query, env=fresh)
        version = [kvaudit, "--version"]
        while b"page scanner: built" not in subprocess.run(version, env=fresh, capture_output=True).stdout:
            time.sleep(1.0)
        built_s = time.perf_counter() - started
        warm_s = min(_timed(query) for _ in range(sized(3, 1)))
        rows.append(
            [
                f"kvaudit sql, first run, {size >> 20} MiB (s)",
                f"{first_s:.1f}",
                f"{warm_s:.1f}",
                f"{first_s / warm_s:.1f}",
                "no silent minute",
            ]
        )
        rows.append(["page scanner built in the background after (s)", f"{built_s:.0f}", "", "", ""])
        rows.append(["(reads with the scanner from)", f"{SCAN_MIN_BYTES >> 20} MiB", "", "", ""])
    report(rows)
    # The goal held as a ratio measured in the same run: only the command named is imported (kvaudit.cli).
    if help_s / python_s >= STARTUP_RATIO:
        ratio = help_s / python_s
        raise SystemExit(f"kvaudit --help took {ratio:.1f}x a bare interpreter (goal: under {STARTUP_RATIO}x)")
