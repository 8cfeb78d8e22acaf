"""The lowest versions kvaudit declares hold (issue 52): each `>=` floor of the plain
install and of the analysis extra installed exactly, from the package index, into a fresh
environment with the wheel, then the commands that use them: simulate, sql, ingest,
audit, report, alerts.

A floor that does not hold is found here rather than by a user (DuckDB 1.4 to 1.5.0 lack
the setting the alert rules' sandbox sets; DuckDB before 2.0.1 needs pytz for `report`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from ..support import ROOT

pytestmark = pytest.mark.slow  # builds the wheel, downloads and installs every floor


def _floors() -> dict[str, str]:
    """The `>=` floor of each requirement of the plain install and of the analysis extra (the
    other extras build on it) that applies here, read from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for text in [*project["dependencies"], *project["optional-dependencies"]["analysis"]]:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate(default_environment()):
            continue
        lowest = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        if lowest:
            floors[canonicalize_name(requirement.name)] = lowest[0]
    return floors


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900)


def test_every_declared_floor_installed_exactly_runs_the_commands(tmp_path: Path):
    floors = _floors()
    assert {"duckdb", "msgspec", "numba", "opentelemetry-sdk"} <= set(floors)
    source = tmp_path / "source"  # a copy: building leaves build/ and *.egg-info behind
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv*", ".git", ".cache", "build", "*.egg-info"))
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", ".", "./source"],
        tmp_path,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("kvaudit-*.whl")
    environment = tmp_path / "env"
    venv.create(environment, with_pip=True)
    python = str(environment / "bin" / "python")
    pins = [f"{name}=={version}" for name, version in floors.items()]
    installed = _run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{wheel}[analysis]", *pins], tmp_path
    )
    assert installed.returncode == 0, installed.stderr
    frozen = _run([python, "-m", "pip", "list", "--format", "freeze"], tmp_path).stdout.splitlines()
    versions = {
        canonicalize_name(name): Version(version) for name, _, version in (line.partition("==") for line in frozen)
    }
    assert {name: versions.get(name) for name in floors} == {name: Version(v) for name, v in floors.items()}

    kvaudit = str(environment / "bin" / "kvaudit")
    traces = str(tmp_path / "sim" / "traces")
    for command, allowed in (
        (["simulate", "--out", "sim", "--duration", "30", "--quiet", "--fault", "raw-ptr:0.2"], (0,)),
        (["sql", traces, "SELECT op, count(*) AS n FROM pages GROUP BY ALL", "--format", "csv"], (0,)),
        (["ingest", traces, "-o", "traces.duckdb", "--quiet"], (0,)),
        (["sql", "traces.duckdb", "-q", "summary", "--format", "json"], (0,)),
        (["audit", traces, "--format", "json"], (0, 1)),  # 1: the injected faults' findings
        (["report", traces], (0, 1)),
        (["alerts", "eval", traces, "--fail-on", "never"], (0,)),
    ):
        done = _run([kvaudit, *command], tmp_path)
        assert done.returncode in allowed, f"kvaudit {' '.join(command)}: {done.returncode}\n{done.stderr}"
        assert "is failing" not in done.stdout + done.stderr, done.stdout  # no alert rule failed
