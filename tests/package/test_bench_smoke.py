"""Every benchmark still runs: `python -m bench --smoke <name>`, at its smallest sizes.

The figures of a smoke run mean nothing; what is checked is that the benchmark completes
and prints the line that carries its figures. A benchmark added to bench/ without a line
here fails `test_every_benchmark_is_smoked`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A line each benchmark prints with its figures.
PRINTS = {
    "alerts": "evaluation after",
    "audit": "capacity curve,",
    "emission": "µs per page descriptor",
    "explain": "explain one request",
    "exporter": "scrape, ",
    "install": "kvaudit --help (s)",
    "prevent": "prevent  after",
    "read": "pages view, desc per wall s",
    "read_formats": "small files",
    "receive": "spans/s, pre-serialised protobuf",
    "scale": "summary",
    "store": "explain --store, nothing new",
    "tui": "refresh, window all",
}
# Those that start the real vLLM or LMCache engines.
ENGINES = {
    "lmcache_hook": "goal: hook's own work",
    "mp_server": "goal: hook's share of the server's wall time",
    "topology": "the consumer fetched",
    "vllm_hook": "wrapper costs",
    "vllm_mp": "goal: the wrapper's own CPU a step",
}


def test_every_benchmark_is_smoked() -> None:
    modules = {path.stem.removeprefix("bench_") for path in (ROOT / "bench").glob("bench_*.py")}
    assert modules == PRINTS.keys() | ENGINES.keys()


def _smoke(name: str, prints: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", name], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    if "skipped:" in done.stdout:
        pytest.skip(done.stdout.strip().splitlines()[-2])
    assert prints in done.stdout, done.stdout[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "prints"), sorted(PRINTS.items()))
def test_benchmark_runs(name: str, prints: str) -> None:
    _smoke(name, prints)


@pytest.mark.e2e
@pytest.mark.parametrize(("name", "prints"), sorted(ENGINES.items()))
def test_engine_benchmark_runs(name: str, prints: str) -> None:
    _smoke(name, prints)
