"""LMCache's multiprocess server for the tests, started by its own CLI (`lmcache server`), with kvaudit's hook.

As RECIPES.md found it runs on a CPU: `--supported-transfer-mode auto` (vLLM's CPU worker
registers through the engine-driven path, which the default refuses), an LRU L1, metrics
off (their Prometheus exporter is not installed). Its log goes to `DIR/server.log`; the
hook writes the pool's spans to `file:DIR/pool.jsonl`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import ROOT
from .replica_processes import Replica, run_all
from .servers import free_port, wait_listening
from .tiny_model import tiny_llama, write_random_weights
from .waiting import wait_until

POOL = "pool"
CHUNK_SIZE = 256
# The replica script the MP tests run (one vLLM replica, its requests one after the other).
REPLICA_SCRIPT = Path(__file__).resolve().parent / "vllm" / "topology_replica.py"
# The same width (2 KV heads x 32 = 1 x 64) split otherwise: no MP key or event tells.
SPLIT = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64}
REPLICA_ENV = {
    "OMP_NUM_THREADS": "2",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_TARGET_DEVICE": "cpu",
    "LMCACHE_TRACK_USAGE": "false",
}


@dataclass(frozen=True)
class MPServer:
    port: int
    http_port: int
    log: Path
    traces: Path
    pid: int

    def connector_config(self) -> dict[str, object]:
        """`LMCacheMPConnector`'s entries of `kv_connector_extra_config` for this server."""
        return {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": self.port}


def _lmcache_command() -> list[str]:
    script = Path(sys.executable).with_name("lmcache")
    return [str(script)] if script.exists() else [shutil.which("lmcache") or "lmcache"]


@contextmanager
def mp_server(directory: Path, *, hook: bool = True, server_module: str | None = None) -> Iterator[MPServer]:
    """An `lmcache server` on a free port, with kvaudit's hook (`--server-module`), until the block ends.

    `server_module`: another `--server-module` value to load instead (a benchmark's timed
    hook), importable from the repository. Stopped with SIGINT, which it handles by
    stopping its event bus: the hook's spans are flushed.
    """
    from kvaudit.hooks.lmcache.mp_server import SERVER_MODULE_OPTION, server_module_argument

    directory.mkdir(parents=True, exist_ok=True)
    port, http_port = free_port(), free_port()
    traces = directory / f"{POOL}.jsonl"
    command = [
        *_lmcache_command(),
        "server",
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--l1-size-gb", "1", "--eviction-policy", "LRU", "--chunk-size", str(CHUNK_SIZE)),
        *("--supported-transfer-mode", "auto", "--disable-metrics"),
        *("--http-host", "127.0.0.1", "--http-port", str(http_port)),
    ]
    if hook:
        command += [SERVER_MODULE_OPTION, server_module or server_module_argument(POOL, f"file:{traces}")]
    log = directory / "server.log"
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "PYTHONPATH": path}
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_listening(proc, http_port, "lmcache server")
        wait_until(lambda: "cache server is running" in log.read_text(), what="lmcache server ready")
        yield MPServer(port, http_port, log, traces, proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def replicas_in_turn(base: Path, specs: list[tuple[str, Callable[[MPServer], dict[str, Any]]]]) -> dict[str, Replica]:
    """The tiny model (seeded random weights) in `base`/model, one server, and the replicas
    `(name, spec of the server)` run one after the other around it, by name; the pool's
    spans and the replicas' go to `base`/traces (the server has stopped when this returns)."""
    (base / "model").mkdir()
    model = tiny_llama("bfloat16")
    (base / "model" / "config.json").write_text(json.dumps(model))
    write_random_weights(base / "model", model)
    with mp_server(base / "traces") as server:
        after = [(), *[(name,) for name, _ in specs[:-1]]]
        replicas = [
            Replica(name, REPLICA_SCRIPT, spec(server), previous) for (name, spec), previous in zip(specs, after)
        ]
        return run_all(replicas, base / "logs", REPLICA_ENV, parallel=1)
