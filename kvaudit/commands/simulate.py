"""`kvaudit simulate`: a fleet of replicas sharing a KV pool, traced through the real emitter.

Each cause of docs/design.md section 7 can be made to happen: eviction pressure with a
small `--pool-gib`, routing that splits sessions with `--router round-robin` or `random`
beside `--local-gib` or `--private-pools`, a late store with `--fault late-store:S`, the
guard with `--guard` and a fault (`raw-ptr`, `rolling-upgrade`).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import UsageError, command_parser
from kvaudit.errors import user_files
from kvaudit.simulator.engine import GIB, GROUND_TRUTH_FILE, PAGE_TRUTH_FILE, SimConfig, SimResult, simulate
from kvaudit.simulator.faults import parse_faults
from kvaudit.simulator.hardware import GPUS, PRECISIONS, load_gpu
from kvaudit.simulator.model import PRESETS, CostModel, load_model
from kvaudit.simulator.router import ROUTERS
from kvaudit.simulator.stats import Summary, summarise_by
from kvaudit.simulator.workload import WORKLOADS, parse_mix


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "simulate",
        SUMMARIES["simulate"],
        "kvaudit simulate --out sim-out --duration 300 --router prefix-aware --fault rolling-upgrade:150 --guard",
    )
    add_arguments(parser)
    parser.add_argument(
        "--out",
        default="sim-out",
        help="directory for traces/r1.jsonl, traces/r2.jsonl, ..., ground_truth.jsonl and page_truth.jsonl",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print only where the files went")
    parser.set_defaults(run=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The simulation's options, defaults from `SimConfig` and `CostModel`."""
    defaults = SimConfig()
    cost = CostModel()
    parser.add_argument("--replicas", type=int, default=defaults.replicas, help="default: %(default)s")
    parser.add_argument(
        "--model",
        default="gemma-2-27b",
        help=f"a preset ({', '.join(PRESETS)}) or a geometry JSON file; default: %(default)s",
    )
    parser.add_argument(
        "--pool-gib", type=float, default=defaults.pool_bytes / GIB, help="shared pool capacity; default: %(default)s"
    )
    parser.add_argument("--local-gib", type=float, default=0.0, help="per-replica local tier (0: none)")
    parser.add_argument(
        "--private-pools",
        action="store_true",
        help="no sharing: each replica its own pool of an equal share of --pool-gib",
    )
    parser.add_argument("--router", choices=list(ROUTERS), default=defaults.router, help="default: %(default)s")
    parser.add_argument(
        "--workload",
        default=",".join(f"{k}={v:g}" for k, v in defaults.mix.items()),
        help=f"a mix of {', '.join(WORKLOADS)} with weights, e.g. chat=3,oneshot=1; default: %(default)s",
    )
    parser.add_argument(
        "--rate", type=float, default=defaults.rate, help="new sessions per simulated second; default: %(default)s"
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=defaults.duration_s,
        help="simulated seconds of arrivals; default: %(default)s",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="default: %(default)s")
    parser.add_argument("--page-tokens", type=int, default=defaults.page_tokens, help="default: %(default)s")
    parser.add_argument(
        "--gpu",
        default="h100",
        help=f"a GPU profile ({', '.join(GPUS)}) or a profile JSON file; default: %(default)s",
    )
    parser.add_argument(
        "--mfu",
        type=float,
        default=cost.mfu,
        help="share of the GPU's peak rate prefill sustains; default: %(default)s",
    )
    parser.add_argument("--precision", choices=PRECISIONS, default=cost.precision, help="default: %(default)s")
    parser.add_argument(
        "--no-attention", action="store_true", help="charge prefill its linear FLOPs only (no attention)"
    )
    parser.add_argument(
        "--gpu-tflops", type=float, help="effective prefill rate, in place of the GPU's peak rate x MFU"
    )
    parser.add_argument(
        "--pool-gbps", type=float, default=cost.pool_bytes_per_s / 1e9, help="pool to GPU, GB/s; default: %(default)s"
    )
    parser.add_argument("--local-gbps", type=float, help="local tier to GPU, GB/s; default: the GPU's host link")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND:VALUE",
        help="raw-ptr:SHARE (fetched pages served without portable metadata), rolling-upgrade:SECONDS, or"
        " late-store:SECONDS (pages reach the tiers that long after their prefill)",
    )
    parser.add_argument("--guard", action="store_true", help="reject bad pages (they are recomputed)")
    parser.add_argument(
        "--prevent", action="store_true", help="each replica's geometry fingerprint in its page keys (no foreign hits)"
    )


def config_from(args: argparse.Namespace) -> SimConfig:
    try:
        return SimConfig(
            replicas=args.replicas,
            model=load_model(args.model),
            page_tokens=args.page_tokens,
            pool_bytes=int(args.pool_gib * GIB),
            shared=not args.private_pools,
            local_bytes=int(args.local_gib * GIB),
            router=args.router,
            mix=parse_mix(args.workload),
            rate=args.rate,
            duration_s=args.duration,
            seed=args.seed,
            cost=CostModel(
                gpu=load_gpu(args.gpu),
                mfu=args.mfu,
                precision=args.precision,
                attention=not args.no_attention,
                gpu_flops=args.gpu_tflops * 1e12 if args.gpu_tflops else None,
                pool_bytes_per_s=args.pool_gbps * 1e9,
                local_bytes_per_s=args.local_gbps * 1e9 if args.local_gbps else None,
            ),
            faults=parse_faults(args.fault, guard=args.guard, prevent=args.prevent),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    config = config_from(args)
    started = time.perf_counter()
    with user_files():  # writing into --out
        result = simulate(config, out)
    if not args.quiet:
        print_summary(result, time.perf_counter() - started)
    print(
        f"Traces: {', '.join(str(f) for f in result.files)}; ground truth: {out / GROUND_TRUTH_FILE},"
        f" {out / PAGE_TRUTH_FILE}"
    )
    return 0


def print_summary(result: SimResult, seconds: float) -> None:
    from kvaudit.present.rows import write_rows

    config = result.config
    cost = config.cost
    print(
        f"Simulated {config.duration_s:g} s of {config.replicas} replicas of {config.model.name} "
        f"({config.model.kv_bytes_per_token / 1024:.0f} KiB of KV per token) on {cost.gpu.name} "
        f"({cost.effective_flops / 1e12:.0f} TFLOP/s effective, {cost.precision}"
        f"{'' if cost.attention else ', no attention'}), pool {config.pool_bytes / GIB:g} GiB, "
        f"router {config.router}: {len(result.requests)} requests in {seconds:.1f} s."
    )
    columns = Summary.columns()
    write_rows(columns, [s.row() for s in summarise_by(result.requests, lambda r: r.replica)], title="Per replica")
    write_rows(columns, [s.row() for s in summarise_by(result.requests, lambda r: r.workload)], title="Per workload")
    causes = Counter(page.cause.value for page in result.pages)
    rows = [(cause, count) for cause, count in causes.most_common()]
    write_rows(["cause", "pages"], rows, title="What became of each prompt page (docs/design.md section 7)")
    faults = Counter((t.fault, "used" if t.used else "rejected") for t in result.ground_truth)
    if faults:
        rows = [(fault, fate, count) for (fault, fate), count in sorted(faults.items())]
        write_rows(["fault", "page", "fetched pages"], rows, title="Injected faults (ground truth)")
