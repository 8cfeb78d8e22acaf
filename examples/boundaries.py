"""Where shared KV caching pays: workload × router × pool size, from the simulator.

    python examples/boundaries.py              # rich tables
    python examples/boundaries.py --markdown   # the tables of the README

For each cell the same arrivals run twice: with one pool shared by the replicas,
and without sharing (each replica a private pool of its share of the bytes). The
load of each workload is set so that serving it without any reuse would keep the
GPUs about half busy, so that the TTFT figures compare like with like. A second
table holds the mixed workload fixed and lowers the pool's bandwidth until moving
KV costs more than recomputing it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from kvaudit.present.rows import write_rows
from kvaudit.simulator.engine import GIB, SimConfig, simulate
from kvaudit.simulator.stats import summarise

WORKLOADS = ("chat", "agent", "shared", "oneshot")
ROUTERS = ("round-robin", "session-affinity", "prefix-aware")
POOLS_GIB = (16, 64, 256)
BANDWIDTHS_GBPS = (50, 25, 10, 5, 3.5, 2, 1)
TARGET_UTILISATION = 0.5
PROBE_RATE = 0.1


def calibrated(config: SimConfig) -> SimConfig:
    """The same configuration at the arrival rate that keeps the GPUs half busy without reuse."""
    probe = simulate(dataclasses.replace(config, rate=PROBE_RATE))
    demand_s = sum(r.prefill_no_reuse_s for r in probe.requests)
    utilisation = demand_s / (config.duration_s * config.replicas)
    return dataclasses.replace(config, rate=PROBE_RATE * TARGET_UTILISATION / utilisation)


def boundaries(duration_s: float) -> tuple[list[str], list[tuple[object, ...]]]:
    columns = [
        "workload",
        "router",
        "pool GiB",
        "hit",
        "hit, private",
        "cross",
        "TTFT ms",
        "× vs private",
        "× vs no reuse",
        "× idle",
        "transfer",
    ]
    rows = []
    for workload in WORKLOADS:
        base = calibrated(SimConfig(mix={workload: 1.0}, duration_s=duration_s))
        for router in ROUTERS:
            for pool in POOLS_GIB:
                config = dataclasses.replace(base, router=router, pool_bytes=pool * GIB)
                shared = summarise(workload, simulate(config).requests)
                private = summarise(workload, simulate(dataclasses.replace(config, shared=False)).requests)
                rows.append(
                    (
                        workload,
                        router,
                        pool,
                        f"{shared.hit:.0%}",
                        f"{private.hit:.0%}",
                        f"{shared.cross:.0%}",
                        f"{shared.ttft_ms:.0f}",
                        f"{private.ttft_ms / shared.ttft_ms:.2f}",
                        f"{shared.ttft_x:.2f}",
                        f"{shared.idle_x:.2f}",
                        f"{shared.transfer:.0%}",
                    )
                )
    return columns, rows


def bandwidth_sweep(duration_s: float) -> tuple[list[str], list[tuple[object, ...]]]:
    base = calibrated(SimConfig(duration_s=duration_s))
    columns = ["pool GB/s", "load µs/token", "prefill µs/token", "hit", "× vs no reuse", "× idle", "transfer"]
    rows = []
    for gbps in BANDWIDTHS_GBPS:
        config = dataclasses.replace(base, cost=dataclasses.replace(base.cost, pool_bytes_per_s=gbps * 1e9))
        summary = summarise("mix", simulate(config).requests)
        rows.append(
            (
                gbps,
                f"{1e6 * config.cost.transfer_s(config.model.kv_bytes_per_token):.1f}",
                f"{1e6 * config.cost.prefill_s(config.model, 1):.1f}",
                f"{summary.hit:.0%}",
                f"{summary.ttft_x:.2f}",
                f"{summary.idle_x:.2f}",
                f"{summary.transfer:.0%}",
            )
        )
    return columns, rows


def _markdown(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(v) for v in row) + " |")
    print()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=300.0, help="simulated seconds per run")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    show = _markdown if args.markdown else write_rows
    show(*boundaries(args.duration))
    show(*bandwidth_sweep(args.duration))
    return 0


if __name__ == "__main__":
    sys.exit(main())
