"""No silent first run (issue 18, item 2): an unbuilt page scanner is built in the
background while the read goes on through msgspec, said once on stderr; its machine
code lives in a user cache directory; `kvaudit --version` says whether it is built.

The build here loads numba's machine code from the cache this environment already has
(NUMBA_CACHE_DIR, which wins over kvaudit's directory) into a fresh kvaudit cache
directory: what is tested is the mark, the background process and the switch from
msgspec to the scanner, not numba's minute of compiling.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kvaudit.read import scanner_cache
from kvaudit.read.reader import SCAN_MIN_BYTES

from ..support.hostile import copies, good_lines
from ..support.waiting import wait_until

MESSAGE = "kvaudit: compiling the page scanner in the background"


def _kvaudit(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvaudit", *argv], capture_output=True, text=True, env=env)


def test_an_unbuilt_scanner_is_built_in_the_background_while_msgspec_reads(tmp_path: Path):
    lines = good_lines(8)
    trace = tmp_path / "traces" / "r1.jsonl"
    trace.parent.mkdir()
    repeat = SCAN_MIN_BYTES // sum(map(len, lines)) + 1  # large enough for the scanner
    trace.write_bytes(copies(lines, repeat))
    subprocess.run([sys.executable, "-m", "kvaudit.read.scanner_cache"], check=True, capture_output=True)
    env = {
        **os.environ,
        "NUMBA_CACHE_DIR": scanner_cache.numba_cache_dir(),
        "KVAUDIT_CACHE_DIR": str(tmp_path / "cache"),
    }
    query = [str(trace.parent), "SELECT count(*) AS pages FROM pages", "--format", "csv"]
    assert "page scanner: not built" in _kvaudit(["--version"], env).stdout

    first = _kvaudit(["sql", *query], env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == ["pages", str(8 * repeat)]
    assert first.stderr.count(MESSAGE) == 1

    log = tmp_path / "cache" / "page-scan.log"
    built = lambda: "page scanner: built" in _kvaudit(["--version"], env).stdout  # noqa: E731
    wait_until(built, timeout=300, what=f"the page scanner built in the background (its log: {log})", interval=0.5)
    second = _kvaudit(["sql", *query], env)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert MESSAGE not in second.stderr


def test_the_cache_directory_is_the_users(monkeypatch):
    monkeypatch.delenv("KVAUDIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/var/cache/someone")
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    assert scanner_cache.cache_dir() == Path("/var/cache/someone/kvaudit")
    assert scanner_cache.numba_cache_dir() == "/var/cache/someone/kvaudit/numba"
    monkeypatch.setenv("KVAUDIT_CACHE_DIR", "/opt/image/kvaudit-cache")  # built into an image
    assert scanner_cache.cache_dir() == Path("/opt/image/kvaudit-cache")
