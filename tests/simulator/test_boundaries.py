"""The boundaries the README and docs/boundaries.md state: `examples/boundaries.py`, short runs and the docs' tables."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import sys
from functools import cache
from types import ModuleType

import pytest

from kvaudit.simulator.engine import SimConfig, simulate
from kvaudit.simulator.stats import summarise

from ..support import ROOT


@cache
def _boundaries() -> ModuleType:
    path = ROOT / "examples" / "boundaries.py"
    spec = importlib.util.spec_from_file_location("boundaries", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where its dataclasses look their annotations up
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
    columns, rows = boundaries.bandwidth(60)
    idle = {row[0]: float(row[columns.index("× idle")]) for row in rows}
    cost, model = SimConfig().cost, SimConfig().model
    # Attention makes long prompts dearer to recompute: they break even at a lower bandwidth.
    highest, lowest = (cost.breakeven_bytes_per_s(model, tokens) / 1e9 for tokens in (1024, 32768))
    assert 3 < lowest < highest < 4
    assert all(speedup > 1 for gbps, speedup in idle.items() if gbps > highest)
    assert all(speedup < 1 for gbps, speedup in idle.items() if gbps < lowest)


BOUNDARIES = ROOT / "docs" / "boundaries.md"
README_SECTION = "### Where shared KV caching pays"
# A command named in backquotes at the start of a line, then (after a line of text) the table it prints.
COMMAND_TABLE = re.compile(r"^`python examples/boundaries\.py ([^`]*)`.*\n\n((?:\|.*\n)+)", re.MULTILINE)
# A figure in prose: a number not glued to a name (Gemma-2, H100, 70B) on either side.
FIGURE = re.compile(r"(?<![\w.,/:])(?<![A-Za-z]-)\d[\d,]*(?:\.\d+)?(?![\w.]\d|[\w])")
NOT_PROSE = re.compile(r"(?s:```.*?```)|`[^`]*`|\[[^\]]*\]\([^)]*\)|^\|.*$", re.MULTILINE)


def _printed(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert _boundaries().main(argv) == 0
    return out.getvalue()


def _figures(text: str) -> set[str]:
    return {match.replace(",", "") for match in FIGURE.findall(text)}


def _docs() -> dict[str, str]:
    """docs/boundaries.md, and the README's section on the boundaries."""
    readme = (ROOT / "README.md").read_text().split(f"\n{README_SECTION}\n", 1)[1].split("\n## ", 1)[0]
    return {BOUNDARIES.name: BOUNDARIES.read_text(), README_SECTION: readme}


@pytest.mark.slow  # runs every command the docs name
def test_every_number_in_the_docs_is_printed_by_the_command_they_name():
    printed: dict[str, str] = {}
    for name, text in _docs().items():
        found = COMMAND_TABLE.findall(text)
        assert len(found) == text.count("\n|---"), f"{name}: a table without the command that prints it"
        for args, table in found:
            printed[args] = printed.get(args) or _printed(args.split())
            assert printed[args].strip() == table.strip(), f"{name}: `{args}` prints another table"
    # docs/boundaries.md quotes only what the tables print (citations, code and formulas aside).
    prose = NOT_PROSE.sub("", BOUNDARIES.read_text())
    assert _figures(prose) - _figures("".join(printed.values())) == set()
