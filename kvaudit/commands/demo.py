"""`kvaudit demo`: a simulated two-replica 27B fleet with a rolling upgrade, audited end to end.

The simulator drives the real emitter and file exporter; then the same traces go
through what a user would run on their own fleet: the audit, the report and the
capacity curve, the named `summary` query, and the auditor's findings checked against
what the simulator injected.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import UsageError, command_parser
from kvaudit.errors import user_files

if TYPE_CHECKING:
    from kvaudit.read.store import TraceStore
    from kvaudit.simulator.engine import SimConfig, SimResult

# A few simulated minutes at a load that keeps both replicas busy but not saturated.
DURATION_S: Final = 300.0
RATE: Final = 0.3
RAW_PTR_SHARE: Final = 0.002
# What a demo directory may hold (traces, ground truth, report, an ingested database) to be replaced.
DEMO_SUFFIXES: Final = frozenset({".jsonl", ".html", ".duckdb", ".wal"})


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "demo",
        SUMMARIES["demo"],
        "kvaudit demo --out demo-out --guard",
    )
    parser.add_argument("--out", default="demo-out", help="directory for the traces and the report (replaced)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--guard", action="store_true", help="replicas reject bad pages and recompute them")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kvaudit.analyse.named_queries import load
    from kvaudit.commands.simulate import print_summary
    from kvaudit.present.rows import write_rows
    from kvaudit.read.open import open_store
    from kvaudit.simulator.engine import GROUND_TRUTH_FILE, TRACES_DIR, simulate

    out = Path(args.out)
    if out.exists() and not all(p.name == TRACES_DIR or p.suffix in DEMO_SUFFIXES for p in out.iterdir()):
        raise UsageError(f"{out}: holds more than a previous demo's output; give a new or empty directory")
    shutil.rmtree(out, ignore_errors=True)
    config = demo_config(args.seed, guard=args.guard)
    _heading(
        f"1. Simulating {DURATION_S:g} s of two replicas; r2 upgrades to the packed KV layout at {DURATION_S / 2:g} s"
    )
    started = time.perf_counter()
    with user_files():  # writing into --out
        result = simulate(config, out)
    print_summary(result, time.perf_counter() - started)
    traces_dir = out / TRACES_DIR
    store = open_store([str(traces_dir)])
    _heading("2. Reuse as the traces show it (named query `summary`)")
    write_rows(*store.query(load("summary")))
    _report(store, result, out)
    _heading("Look further")
    print(f"  kvaudit tui {traces_dir}")
    print(f"  kvaudit audit {traces_dir} --format json    # every finding, with its trace, span and field values")
    print(f'  kvaudit sql {traces_dir} "SELECT replica, op, layout, used, count(*) FROM pages GROUP BY ALL"')
    print(f"  kvaudit sql {traces_dir} -q summary    # kvaudit queries lists the others")
    print(f"  kvaudit ingest {traces_dir} -o {out}/traces.duckdb && duckdb {out}/traces.duckdb")
    print(f"  ground truth of the injected faults: {out / GROUND_TRUTH_FILE}")
    return 0


def demo_config(seed: int = 0, *, guard: bool = False) -> SimConfig:
    """The demo's fleet: two replicas, raw-pointer faults, r2's rolling upgrade halfway."""
    from kvaudit.simulator.engine import SimConfig
    from kvaudit.simulator.faults import Faults

    return SimConfig(
        rate=RATE,
        duration_s=DURATION_S,
        seed=seed,
        faults=Faults(raw_ptr=RAW_PTR_SHARE, upgrade_at_s=DURATION_S / 2, guard=guard),
    )


def _report(store: TraceStore, result: SimResult, out: Path) -> None:
    """The report (findings, reuse, hit rates, overhead, capacity), and the findings held to the ground truth."""
    from kvaudit.present.report import gather, print_report

    _heading("3. Report: findings, reuse, hit rates, transfer overhead, pool capacity")
    report = gather(store)
    print_report(report, sys.stdout)
    try:
        from kvaudit.present.report_html import write_html
    except ModuleNotFoundError as exc:  # the analysis extra alone: the rest of the demo runs
        print(f"\nNo HTML report: it needs {exc.name}, which this install lacks: pip install 'kvaudit[report]'")
    else:
        html = out / "report.html"
        write_html(report, html, title=f"kvaudit demo: {out}")
        print(f"\nHTML report: {html}")
    found = {(f.replica, f.trace_id, f.key) for f in report.findings}
    caught = sum((t.replica, t.trace_id, t.key) in found for t in result.ground_truth)
    injected = len(result.ground_truth)
    print(f"\nRecall: the audit flagged {caught} of the {injected} faulty fetched pages the simulator injected.")


def _heading(text: str) -> None:
    print(f"\n\033[1m{text}\033[0m" if sys.stdout.isatty() else f"\n== {text}")
