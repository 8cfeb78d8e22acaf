"""Run every benchmark (`make bench`), or the ones named: `python -m bench emission reader`.

Each `bench_<name>.py` module has a `main() -> None` that measures its figures and
their baselines side by side in the same run and prints them with their ratios.
`--smoke` runs them at their smallest sizes (`bench.common.sized`), only to show that
they still run: tests/package/test_bench_smoke.py.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import time

import bench
from bench.common import SMOKE_ENV


def main(args: list[str]) -> int:
    names = [arg for arg in args if arg != "--smoke"]
    if "--smoke" in args:
        os.environ[SMOKE_ENV] = "1"
    modules = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))
    chosen = [m for m in modules if not names or m.removeprefix("bench_") in names]
    for name in chosen:
        print(f"\n== {name.removeprefix('bench_')} ==", flush=True)
        started = time.perf_counter()
        importlib.import_module(f"bench.{name}").main()
        print(f"({time.perf_counter() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
