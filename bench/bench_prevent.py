"""Prevention against the guard during a rolling upgrade (issue 25), in the fleet simulator.

The same seeded run three ways: no protection (the old layout's pages are read by the
upgraded replica: silent corruption), guard only (they move and are rejected, then
recomputed), and prevention (the geometry fingerprint in the keys: they are never
found). Printed per way: hit rate, share of tokens the lookup found, mean TTFT, and
the GiB moved for pages the guard rejects, over the whole run and after the upgrade.

Size: KVAUDIT_BENCH_SIM_S simulated seconds (default 600; the upgrade at half of them).
"""

from __future__ import annotations

import dataclasses
from typing import Final

from bench.common import env_int
from kvaudit.simulator.engine import EPOCH_NS, NS, SimConfig, simulate
from kvaudit.simulator.faults import Faults
from kvaudit.simulator.stats import summarise

GIB: Final = 1 << 30


def main() -> None:
    duration = float(env_int("KVAUDIT_BENCH_SIM_S", 600, 60))
    upgrade_at = duration / 2
    base = SimConfig(duration_s=duration, seed=0)
    ways = {
        "none": Faults(upgrade_at_s=upgrade_at),
        "guard": Faults(upgrade_at_s=upgrade_at, guard=True),
        "prevent": Faults(upgrade_at_s=upgrade_at, prevent=True),
    }
    page_bytes = base.model.page_bytes(base.page_tokens)
    print(f"{base.model.name}, {base.replicas} replicas, {duration:.0f} s, upgrade of the last at {upgrade_at:.0f} s")
    print("way      span   reqs   hit  found  ttft_ms  misread  rejected_GiB")
    upgrade_ns = EPOCH_NS + int(upgrade_at * NS)
    for name, faults in ways.items():
        result = simulate(dataclasses.replace(base, faults=faults))
        for span, since in (("all", EPOCH_NS), ("after", upgrade_ns)):
            records = [r for r in result.requests if r.start_ns >= since]
            summary = summarise(span, records)
            rejected = sum(r.rejected_tokens for r in records) // base.page_tokens * page_bytes
            misread = sum(1 for t in result.ground_truth if t.used and t.time_ns >= since)
            print(
                f"{name:8} {span:5} {summary.reqs:5} {100 * summary.hit:5.1f}% {100 * summary.found:5.1f}%"
                f" {summary.ttft_ms:8.0f} {misread:8} {rejected / GIB:13.1f}"
            )
