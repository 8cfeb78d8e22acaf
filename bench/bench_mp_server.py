"""The MP server hook's cost: `lmcache server` with kvaudit's hook against the same server without it.

Two servers in turn, each started by its CLI (tests/support/mp_server.py), each driven by
LMCache's own MP client, `lmcache bench server --mode cpu` (engine-driven transfers, the
tiny model's KV geometry): per request a cold lookup and store, then a warm lookup and
retrieve, with LMCache's checksums. With the hook on, the server loads it through
`bench.mp_server_probe`, which times each of the subscriber's callbacks on the event
bus's drain thread. The figures: the hook's own time as a share of the server's wall
time (the client's run) and of the server process's CPU time, per event; and the client's
store and retrieve latencies with the hook on and off, measured side by side.

Sizes: `KVAUDIT_BENCH_MP_REQUESTS` (default 100; smoke 3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from bench.common import env_int, machine, report

REQUESTS = env_int("KVAUDIT_BENCH_MP_REQUESTS", 100, 3)
# The tiny model's KV cache: (K and V, blocks, block size, KV heads, head size), dtype, layers.
SHAPE_SPEC = "(2,512,32,2,32):bfloat16:2"
TOKENS = 512


def _client(server: Any, out: Path) -> tuple[float, dict[str, Any]]:
    """Run LMCache's MP client against `server`: its wall time and its JSON metrics."""
    lmcache = Path(sys.executable).with_name("lmcache")
    command = [
        str(lmcache),
        *("bench", "server", "--mode", "cpu", "--rpc-url", f"tcp://127.0.0.1:{server.port}"),
        *("--url", f"http://127.0.0.1:{server.http_port}", "--kvcache-shape-spec", SHAPE_SPEC),
        *("--num-tokens", str(TOKENS), "--start", "0", "--end", str(REQUESTS), "--interval", "0"),
        *("--format", "json", "--output", str(out), "-q"),
    ]
    env = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "LMCACHE_DISABLE_BANNER": "1"}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"lmcache bench server failed: {done.stderr[-2000:]}")
    return wall, json.loads(out.read_text())["metrics"]


def _run(base: Path, hook: bool) -> dict[str, Any]:
    import psutil

    from tests.support.mp_server import POOL, mp_server

    directory = base / ("on" if hook else "off")
    timings = directory / "timings.json"
    config = {"replica": POOL, "export": f"file:{directory / POOL}.jsonl", "timings": str(timings)}
    module = json.dumps({"module_path": "bench.mp_server_probe", "config": config})
    with mp_server(directory, hook=hook, server_module=module) as server:
        wall, metrics = _client(server, directory / "client.json")
        cpu = psutil.Process(server.pid).cpu_times()
    result = {"wall_s": wall, "server_cpu_s": cpu.user + cpu.system, "metrics": metrics}
    if hook:
        result["timings"] = json.loads(timings.read_text())
        with open(directory / f"{POOL}.jsonl") as spans:
            result["span_lines"] = sum(1 for _ in spans)
    return result


def main() -> None:
    if find_spec("lmcache") is None or find_spec("psutil") is None:
        print("skipped: lmcache is not installed (scripts/install-lmcache.sh)")
        return
    print(f"{machine()}; {REQUESTS} requests of {TOKENS} tokens, KV {SHAPE_SPEC}")
    with tempfile.TemporaryDirectory(prefix="kvaudit-bench-mp-") as tmp:
        base = Path(tmp)
        off = _run(base, hook=False)
        on = _run(base, hook=True)
    timings = on["timings"]
    hook_s, events = timings["seconds"], max(timings["events"], 1)

    def mean(result: dict[str, Any], section: str) -> float:
        return float(result["metrics"][section][f"{section}_mean"])

    rows: list[list[object]] = [
        [
            "hook time, share of the server's wall time",
            f"{100 * hook_s / on['wall_s']:.3f}%",
            f"{on['wall_s']:.1f} s",
            "",
            "< 1%",
        ],
        [
            "hook time, share of the server's CPU time",
            f"{100 * hook_s / max(on['server_cpu_s'], 1e-9):.2f}%",
            f"{on['server_cpu_s']:.1f} s",
            "",
            "",
        ],
        ["hook time per event (µs)", f"{1e6 * hook_s / events:.1f}", f"{events} events", "", ""],
    ]
    for section in ("cold_store", "warm_retrieve"):
        rows.append(
            [
                f"{section.replace('_', ' ')} mean (ms), hook on / off",
                f"{mean(on, section):.2f}",
                f"{mean(off, section):.2f}",
                f"{mean(on, section) / max(mean(off, section), 1e-9):.2f}",
                "",
            ]
        )
    rows.append(["server CPU (s), hook on / off", f"{on['server_cpu_s']:.1f}", f"{off['server_cpu_s']:.1f}", "", ""])
    report(rows)
    print(f"spans written with the hook on: {on['span_lines']} lines; checksums ok: {on['metrics']['results']}")
    print("goal: hook's share of the server's wall time < 1%")


if __name__ == "__main__":
    main()
