"""Where shared KV caching pays, from the simulator's cost model and fleet runs.

    python examples/boundaries.py                       # every table, as rich tables
    python examples/boundaries.py --markdown fleet      # one table, as the docs show it

Tables (docs/boundaries.md explains each):
  fleet      workload x router x pool size: each cell runs the same arrivals with one
             pool shared by the replicas and without sharing (each replica a private
             pool of its share of the bytes), at the arrival rate that keeps the GPUs
             half busy without reuse, so that TTFT figures compare like with like. Without
             sharing, the achievable hit rate (docs/design.md section 7.3) counts the
             pages another replica's pool held: what routing left on the table (with
             one shared pool every copy is reachable, and it equals the hit rate).
  bandwidth  the mixed workload as the pool's bandwidth falls below the break-even.
  context    the cost model alone: a follow-up turn on a cached context, per model and
             context length, with attention and without, and the break-even bandwidth.
  models, gpus   the presets and GPU profiles the cost model runs on.
  published  published speed-ups beside the simulator's closest configuration.

Every table separates the idle speed-up (transfer against compute, one request on an
idle GPU) from the queueing-inclusive one (TTFT under load, against a fleet without
reuse serving the same arrivals).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvaudit.present.rows import write_rows
from kvaudit.simulator.engine import GIB, SimConfig, simulate
from kvaudit.simulator.hardware import GPUS
from kvaudit.simulator.model import PRESETS, CostModel
from kvaudit.simulator.stats import Summary, summarise

Table = tuple[list[str], list[tuple[object, ...]]]

WORKLOADS = ("chat", "agent", "shared", "oneshot")
ROUTERS = ("round-robin", "session-affinity", "prefix-aware")
POOLS_GIB = (16, 64, 256)
BANDWIDTHS_GBPS = (50, 25, 10, 5, 3.5, 3, 2, 1)
CONTEXTS = (1024, 4096, 8192, 32768, 131072)
FOLLOW_UP_TOKENS = 256  # a new turn: the user's message and the previous answer
TARGET_UTILISATION = 0.5
PROBE_RATE = 0.1
# Beyond this factor between a published figure and the simulator's, docs/boundaries.md says why.
AGREEMENT = 1.5


def calibrated(config: SimConfig) -> SimConfig:
    """The same configuration at the arrival rate that keeps the GPUs half busy without reuse."""
    probe = simulate(dataclasses.replace(config, rate=PROBE_RATE))
    demand_s = sum(r.prefill_no_reuse_s for r in probe.requests)
    utilisation = demand_s / (config.duration_s * config.replicas)
    return dataclasses.replace(config, rate=PROBE_RATE * TARGET_UTILISATION / utilisation)


def _run(config: SimConfig, workload: str) -> Summary:
    return summarise(workload, simulate(config).requests)


def fleet(duration_s: float) -> Table:
    columns = [
        "workload",
        "router",
        "pool GiB",
        "hit",
        "hit, private",
        "achievable, private",
        "cross",
        "× idle",
        "TTFT ms",
        "× queued",
        "× queued vs private",
        "transfer",
    ]
    rows = []
    for workload in WORKLOADS:
        base = calibrated(SimConfig(mix={workload: 1.0}, duration_s=duration_s))
        for router in ROUTERS:
            for pool in POOLS_GIB:
                config = dataclasses.replace(base, router=router, pool_bytes=pool * GIB)
                shared = _run(config, workload)
                private = _run(dataclasses.replace(config, shared=False), workload)
                rows.append(
                    (
                        workload,
                        router,
                        pool,
                        f"{shared.hit:.0%}",
                        f"{private.hit:.0%}",
                        f"{private.achievable:.0%}",
                        f"{shared.cross:.0%}",
                        f"{shared.idle_x:.2f}",
                        f"{shared.ttft_ms:.0f}",
                        f"{shared.ttft_x:.2f}",
                        f"{private.ttft_ms / shared.ttft_ms:.2f}",
                        f"{shared.transfer:.0%}",
                    )
                )
    return columns, rows


def bandwidth(duration_s: float) -> Table:
    base = calibrated(SimConfig(duration_s=duration_s))
    columns = ["pool GB/s", "load µs/token", "hit", "× idle", "× queued", "transfer"]
    rows = []
    for gbps in BANDWIDTHS_GBPS:
        config = dataclasses.replace(base, cost=dataclasses.replace(base.cost, pool_bytes_per_s=gbps * 1e9))
        summary = _run(config, "mix")
        per_token = config.cost.load_s(config.model, config.page_tokens, config.page_tokens) / config.page_tokens
        rows.append(
            (
                gbps,
                f"{1e6 * per_token:.1f}",
                f"{summary.hit:.0%}",
                f"{summary.idle_x:.2f}",
                f"{summary.ttft_x:.2f}",
                f"{summary.transfer:.0%}",
            )
        )
    return columns, rows


def context(_: float) -> Table:
    """A follow-up turn on each cached context length, per model, from the cost model alone."""
    cost, linear, page = CostModel(), CostModel(attention=False), SimConfig().page_tokens
    columns = [
        "model",
        "context",
        "attention share",
        "recompute ms",
        "load ms",
        "× idle",
        "× idle, no attention",
        "break-even GB/s",
        "no attention",
    ]
    rows = []
    for name, model in PRESETS.items():
        for tokens in CONTEXTS:
            if tokens > (model.context_length or tokens):
                continue
            cached = tokens - FOLLOW_UP_TOKENS
            rows.append(
                (
                    name,
                    f"{tokens:,}",
                    f"{model.attention_flops(tokens) / cost.prefill_flops(model, tokens):.0%}",
                    f"{1e3 * cost.prefill_s(model, tokens):,.0f}",
                    f"{1e3 * cost.load_s(model, cached, page):,.0f}",
                    f"{cost.reuse_speedup(model, cached, FOLLOW_UP_TOKENS, page):.2f}",
                    f"{linear.reuse_speedup(model, cached, FOLLOW_UP_TOKENS, page):.2f}",
                    f"{cost.breakeven_bytes_per_s(model, tokens) / 1e9:.2f}",
                    f"{linear.breakeven_bytes_per_s(model, tokens) / 1e9:.2f}",
                )
            )
    return columns, rows


def models(_: float) -> Table:
    columns = ["preset", "parameters", "layers", "query heads", "KV heads", "head size", "hidden", "window"]
    columns += ["layer pattern", "context", "KV KiB/token"]
    rows = [
        (
            name,
            f"{model.params / 1e9:.1f} B",
            model.layers,
            model.attention_heads,
            model.kv_heads,
            model.head_size,
            f"{model.hidden_size:,}",
            f"{model.sliding_window:,}" if model.sliding_window else "none",
            f"{model.local_layers} local, {model.layers - model.local_layers} global ({model.layer_pattern})",
            f"{model.context_length:,}",
            f"{model.kv_bytes_per_token / 1024:.0f}",
        )
        for name, model in PRESETS.items()
    ]
    return columns, rows


def gpus(_: float) -> Table:
    columns = ["--gpu", "GPU", "BF16 TFLOP/s", "FP8 TFLOP/s", "memory TB/s", "host link GB/s"]
    rows = [
        (
            name,
            gpu.name,
            f"{gpu.bf16_flops / 1e12:,.1f}",
            f"{gpu.fp8_flops / 1e12:,.1f}" if gpu.fp8_flops else "none",
            f"{gpu.hbm_bytes_per_s / 1e12:.3g}",
            f"{gpu.host_bytes_per_s / 1e9:.0f}",
        )
        for name, gpu in GPUS.items()
    ]
    return columns, rows


@dataclass(frozen=True)
class Published:
    """A published speed-up and the closest configuration the simulator can express.

    low, high: the figure as a speed-up (87% lower TTFT is 1 / 0.13 = 7.7x).
    measures: "idle" (one request's TTFT, no queue), "queued" (TTFT under a serving
        load) or "throughput" (requests a GPU serves: GPU-seconds per request, the
        idle ratio over a workload).
    turn: (cached, new) tokens of the request an idle figure is about; None to take
        the idle ratio over the workloads' runs.
    recompute: share of the cached tokens prefilled again anyway.
    """

    source: str
    claim: str
    low: float
    high: float
    measures: str
    setup: str
    model: str
    gpu: str
    workloads: tuple[str, ...]
    turn: tuple[int, int] | None = None
    recompute: float = 0.0


NVIDIA_POST = (
    "https://developer.nvidia.com/blog/"
    "nvidia-gh200-superchip-accelerates-inference-by-2x-in-multiturn-interactions-with-llama-models/"
)
LLAMA_3_TURN = (8192 - FOLLOW_UP_TOKENS, FOLLOW_UP_TOKENS)  # the last turn Llama 3's window takes
RAG_TURN = (8192, 256)  # the `shared` workload's prompt: an 8,192-token document and a question

PUBLISHED = (
    Published(
        f"[NVIDIA, x86 H100]({NVIDIA_POST})",
        "up to 14× faster TTFT",
        14,
        14,
        "idle",
        "Llama 3 70B, multi-turn, KV offloaded to CPU memory over PCIe",
        "llama-3.1-70b",
        "h100",
        ("chat",),
        turn=LLAMA_3_TURN,
    ),
    Published(
        f"[NVIDIA, GH200]({NVIDIA_POST})",
        "up to 28× faster TTFT",
        28,
        28,
        "idle",
        "the same over NVLink-C2C",
        "llama-3.1-70b",
        "gh200",
        ("chat",),
        turn=LLAMA_3_TURN,
    ),
    Published(
        "[CachedAttention](https://arxiv.org/abs/2403.19708)",
        "up to 87% lower TTFT (7.7×)",
        1 / 0.13,
        1 / 0.13,
        "queued",
        "ShareGPT multi-turn serving, LLaMA, Falcon and Mistral models, KV in host DRAM and SSD",
        "llama-3.1-70b",
        "a100",
        ("chat",),
    ),
    Published(
        "[LMCache README](https://github.com/LMCache/LMCache)",
        "3-10× GPU cycle reduction",
        3,
        10,
        "throughput",
        "vLLM with LMCache, multi-round QA and RAG",
        "llama-3.1-70b",
        "h100",
        ("chat", "shared"),
    ),
    Published(
        "[LMCache README](https://github.com/LMCache/LMCache)",
        "3-10× delay savings",
        3,
        10,
        "queued",
        "the same",
        "llama-3.1-70b",
        "h100",
        ("chat", "shared"),
    ),
    Published(
        "[LMCache paper](https://arxiv.org/abs/2510.09665)",
        "up to 15× throughput",
        15,
        15,
        "throughput",
        "vLLM with LMCache, multi-round QA and document analysis",
        "llama-3.1-70b",
        "h100",
        ("chat", "shared"),
    ),
    Published(
        "[CacheBlend](https://arxiv.org/abs/2405.16444)",
        "2.2-3.3× lower TTFT",
        2.2,
        3.3,
        "idle",
        "RAG, reused chunks not at the prefix, vs full recompute",
        "llama-3.1-70b",
        "h100",
        (),
        turn=RAG_TURN,
        recompute=0.15,
    ),
)


def _host_memory_config(row: Published, duration_s: float) -> SimConfig:
    """One replica whose KV tier is host memory: the pool at the GPU's host link."""
    gpu = GPUS[row.gpu]
    cost = CostModel(gpu=gpu, pool_bytes_per_s=gpu.host_bytes_per_s, pool_latency_s=CostModel.local_latency_s)
    return SimConfig(replicas=1, model=PRESETS[row.model], cost=cost, duration_s=duration_s)


def _idle_turn(config: SimConfig, turn: tuple[int, int], recompute: float) -> float:
    cost, model = config.cost, config.model
    cached, new = turn
    again = round(cached * recompute)
    with_reuse = cost.load_s(model, cached, config.page_tokens) + cost.prefill_s(model, new + again, cached - again)
    return cost.prefill_s(model, cached + new) / with_reuse


def _span(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f}"


def _agreement(published: tuple[float, float], simulated: Sequence[float]) -> str:
    """Published over simulated (nearest ends) where the ranges do not meet, marked beyond the agreement factor."""
    low, high = min(simulated), max(simulated)
    if published[1] < low:
        factor = published[1] / low
    elif published[0] > high:
        factor = published[0] / high
    else:
        return "overlaps"
    return f"{factor:.2f}" + (f", beyond {AGREEMENT:g}×" if max(factor, 1 / factor) > AGREEMENT else "")


def published(duration_s: float) -> Table:
    columns = ["source", "published", "measures", "setup", "simulator", "sim × idle", "sim × queued"]
    columns += ["published / sim"]
    rows = []
    for row in PUBLISHED:
        base = _host_memory_config(row, duration_s)
        runs = [_run(calibrated(dataclasses.replace(base, mix={w: 1.0})), w) for w in row.workloads]
        if row.turn is not None:
            idle = [_idle_turn(base, row.turn, row.recompute)]
            cached, new = row.turn
            shape = f"{cached:,} cached + {new} new tokens" + (
                f", {row.recompute:.0%} recomputed" if row.recompute else ""
            )
        else:
            idle = [run.idle_x for run in runs]
            shape = " and ".join(row.workloads)
        queued = [run.ttft_x for run in runs]
        compared = queued if row.measures == "queued" else idle
        rows.append(
            (
                row.source,
                row.claim,
                row.measures,
                row.setup,
                f"{row.model}, {row.gpu}, {shape}"
                + (f"; queued: {', '.join(row.workloads)}" if row.turn and runs else ""),
                _span(idle),
                _span(queued) if queued else "-",
                _agreement((row.low, row.high), compared),
            )
        )
    return columns, rows


TABLES: dict[str, Callable[[float], Table]] = {
    "fleet": fleet,
    "bandwidth": bandwidth,
    "context": context,
    "models": models,
    "gpus": gpus,
    "published": published,
}


def _markdown(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(v) for v in row) + " |")
    print()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="*", metavar="TABLE", help=f"of {', '.join(TABLES)}; default: all")
    parser.add_argument("--duration", type=float, default=300.0, help="simulated seconds per run")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    unknown = set(args.tables) - TABLES.keys()
    if unknown:
        parser.error(f"unknown table {', '.join(sorted(unknown))} (expected {', '.join(TABLES)})")
    for name in args.tables or TABLES:
        columns, rows = TABLES[name](args.duration)
        if args.markdown:
            _markdown(columns, rows)
        else:
            write_rows(columns, rows, title=name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
