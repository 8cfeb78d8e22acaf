"""The house plan holds: each stage imports only what docs/architecture.md allows, and the serving side stays light.

The stages, their packages and their allowed imports are read from the tables of
docs/architecture.md, so the document and the code cannot drift apart: a module of no
stage, an import the table does not allow, or a heavy package on the serving side
fails here. Imports are read from the source (every `import`, also inside functions),
and the serving side is also imported for real in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# The folders of the repository behind each import name (pyproject.toml's package-dir).
FOLDERS = {"kvaudit": ROOT / "kvaudit", "kvaudit.hooks": ROOT / "hooks", "kvaudit.tui": ROOT / "tui"}
SERVING_SIDE = ("shared", "emit", "hooks")
# What the analysis side brings, which must never load inside a serving process.
HEAVY = ("duckdb", "pyarrow", "numpy", "numba", "llvmlite", "rich", "textual", "plotly", "chdb", "sqlglot")


def _table(heading: str) -> list[list[str]]:
    """The rows of the first table after `heading`, as lists of cells."""
    lines = ARCHITECTURE.read_text().split(f"\n## {heading}\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[start + 2 : end]]


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


@cache
def stages() -> dict[str, tuple[list[str], set[str]]]:
    """Stage -> (its packages, the stages it may import)."""
    return {row[0]: (_names(row[1]), set(_names(row[3]))) for row in _table("Stages")}


def stage_of(module: str) -> str | None:
    """The stage whose package is the longest prefix of `module`."""
    best = max(
        ((package, stage) for stage, (packages, _) in stages().items() for package in packages
         if module == package or module.startswith(package + ".")),
        key=lambda found: len(found[0]),
        default=(None, None),
    )  # fmt: skip
    return best[1]


@cache
def modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            name = ".".join([package, *parts])
            if package == "kvaudit" and parts[:1] in (["hooks"], ["tui"]):
                continue
            found[name] = path
    return found


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_every_module_belongs_to_a_stage():
    assert [name for name in modules() if stage_of(name) is None] == []


def test_stages_import_only_what_the_plan_allows():
    wrong = []
    for name, path in modules().items():
        stage = stage_of(name)
        allowed = stages()[stage][1] | {stage}
        for imported in imports(path):
            if imported.split(".")[0] == "kvaudit":
                target = stage_of(imported)
                if target is not None and target not in allowed:
                    wrong.append(f"{name} ({stage}) imports {imported} ({target})")
    assert wrong == []


def test_the_serving_side_imports_only_its_own_packages():
    allowed = {row[0].strip("`") for row in _table("What the serving side may import")}
    wrong = []
    for name, path in modules().items():
        if stage_of(name) in SERVING_SIDE:
            for imported in imports(path):
                top = imported.split(".")[0]
                if top != "kvaudit" and top not in sys.stdlib_module_names and top not in allowed:
                    wrong.append(f"{name} imports {imported}")
    assert wrong == []


def test_nothing_outside_the_commands_imports_the_tui():
    importers = {
        name
        for name, path in modules().items()
        if stage_of(name) not in ("tui", "commands") and any(i.startswith("kvaudit.tui") for i in imports(path))
    }
    assert importers == set()


def test_importing_the_serving_side_loads_nothing_heavy():
    serving = [
        name
        for name in modules()
        if stage_of(name) in ("shared", "emit") or name in ("kvaudit.hooks", "kvaudit.hooks.vllm.settings")
    ]
    code = (
        "import importlib, json, sys\n"
        f"for name in {serving!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == []
