"""The house plan holds: each stage imports only what docs/architecture.md allows, and the serving side stays light.

The stages, their packages and their allowed imports are read from the tables of
docs/architecture.md, so the document and the code cannot drift apart: a module of no
stage, an entry of the table that names no module, an import the table does not allow,
or a heavy package on the serving side fails here. An entry covers the module it names
and, when that is a package, the modules beneath it; except the root package
`kvaudit`, which covers only itself: a new top-level module needs an entry of its own.
Imports are read from the source (every `import`, also inside functions), and the
serving side is also imported for real in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# The folders of the repository behind each import name (pyproject.toml's package-dir).
FOLDERS = {
    "kvaudit": ROOT / "kvaudit",
    "kvaudit.hooks": ROOT / "hooks",
    "kvaudit.tui": ROOT / "tui",
    "kvaudit.queries": ROOT / "queries",
}
ROOT_PACKAGE = "kvaudit"
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


def covers(entry: str, name: str) -> bool:
    """Whether the table's `entry` covers the module (or the name imported from it) `name`."""
    return name == entry or (entry != ROOT_PACKAGE and name.startswith(entry + "."))


def stage_of(module: str) -> str | None:
    """The stage of the longest entry that covers `module`."""
    best = max(
        ((entry, stage) for stage, (entries, _) in stages().items() for entry in entries if covers(entry, module)),
        key=lambda found: len(found[0]),
        default=(None, None),
    )
    return best[1]


def modules_in(folders: dict[str, Path]) -> dict[str, Path]:
    """Every module under `folders` (import name -> folder), by its import name."""
    found = {}
    for package, folder in folders.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            if package == ROOT_PACKAGE and parts[:1] in (["hooks"], ["tui"]):
                continue
            found[".".join([package, *parts])] = path
    return found


@cache
def modules() -> dict[str, Path]:
    return modules_in(FOLDERS)


def without_stage(names: Iterable[str]) -> list[str]:
    return [name for name in names if stage_of(name) is None]


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
    assert without_stage(modules()) == []


def test_every_entry_of_the_table_names_a_module():
    entries = [entry for entries, _ in stages().values() for entry in entries]
    assert [entry for entry in entries if entry not in modules()] == []


def test_a_module_the_table_does_not_name_has_no_stage(tmp_path: Path):
    package = tmp_path / "kvaudit"
    for module in ("__init__.py", "foo.py", "contract.py", "emit/__init__.py", "emit/new_part.py"):
        (package / module).parent.mkdir(parents=True, exist_ok=True)
        (package / module).touch()
    assert without_stage(modules_in({"kvaudit": package})) == ["kvaudit.foo"]
    assert stage_of("kvaudit") == stage_of("kvaudit.safe_text") == stage_of("kvaudit.errors.InputError") == "shared"


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
