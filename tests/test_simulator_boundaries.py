"""The performance boundaries the README states, checked on short runs of `examples/boundaries.py`."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from kvaudit.simulator.engine import SimConfig, simulate
from kvaudit.simulator.stats import summarise


def _boundaries() -> ModuleType:
    path = Path(__file__).parent.parent / "examples" / "boundaries.py"
    spec = importlib.util.spec_from_file_location("boundaries", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chat_and_shared_prompts_gain_most_one_shot_least():
    boundaries = _boundaries()
    gain = {}
    for workload in ("chat", "shared", "oneshot"):
        config = boundaries.calibrated(SimConfig(mix={workload: 1.0}, duration_s=120))
        gain[workload] = summarise(workload, simulate(config).requests).idle_x
    assert gain["shared"] > 2 and gain["chat"] > 1.5
    assert gain["oneshot"] == pytest.approx(1.0)


def test_transfer_eats_the_gain_below_the_break_even_bandwidth():
    boundaries = _boundaries()
    columns, rows = boundaries.bandwidth_sweep(60)
    idle = {row[0]: float(row[columns.index("× idle")]) for row in rows}
    breakeven_gbps = SimConfig().cost.breakeven_bytes_per_s(SimConfig().model) / 1e9
    assert 3 < breakeven_gbps < 4
    assert all(speedup > 1 for gbps, speedup in idle.items() if gbps > breakeven_gbps)
    assert all(speedup < 1 for gbps, speedup in idle.items() if gbps < breakeven_gbps)
