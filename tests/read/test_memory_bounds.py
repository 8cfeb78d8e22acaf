"""Tiny inputs stay tiny in memory: what a read may take is bounded by the limits, not by what a file inflates to.

Each hostile file (tests/support/hostile.py) is read by `kvaudit`'s reader in a child
process, whose peak resident memory (VmHWM) is measured above its idle size after a
warm-up read: it must stay within READ_BUDGET (docs/operations.md, "Reading traces").
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ..support import hostile

MiB = 1 << 20
READ_BUDGET = 448 * MiB  # docs/operations.md: the memory one read may take above idle

_CHILD = r"""
import gc, json, sys
from kvaudit.read.store import TraceStore

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

warm, path = sys.argv[1:]
store = TraceStore([warm])  # the page scanner and DuckDB loaded: what any read starts with
store.refresh()
store.close()
gc.collect()
try:  # start the high-water mark afresh (Linux: clear_refs 5)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass
idle = status("VmRSS")
store = TraceStore([path])
store.refresh()
_, [(spans,)] = store.query("SELECT count(*) FROM spans")
_, errors = store.query("SELECT line, reason FROM read_errors")
print(json.dumps({"over_idle": status("VmHWM") - idle, "spans": spans, "errors": errors}))
"""


def _read_in_child(tmp_path: Path, path: Path) -> dict[str, object]:
    warm = tmp_path / "warm.jsonl"
    warm.write_bytes(b"".join(hostile.good_lines()))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(warm), str(path)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


CASES: dict[str, tuple[str, Callable[[Path], Path], int, str | None]] = {
    # name: (file name, maker, good spans read, what its read error says)
    "zstd-frame-1GiB": ("frames.json.zst", hostile.zstd_frame_bomb, 0, "longer than the"),
    "newlines-10MB": ("newlines.jsonl", hostile.newlines, 0, None),
    "zst-newlines-1GiB": ("newlines.jsonl.zst", hostile.zstd_of_newlines, 0, None),
    "attributes-1M": ("attributes.jsonl", hostile.many_attributes, hostile.LINES - 1, "more than the 1024"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_small_hostile_file_is_read_within_the_memory_budget(tmp_path: Path, case: str):
    name, make, spans, error = CASES[case]
    path = make(tmp_path / name)
    result = _read_in_child(tmp_path, path)
    assert result["spans"] == spans
    errors = result["errors"]
    assert isinstance(errors, list)
    if error is None:
        assert errors == []
    else:
        assert len(errors) == 1 and error in errors[0][1]
    over_idle = result["over_idle"]
    assert isinstance(over_idle, int)
    print(f"{case}: {path.stat().st_size} bytes on disk, {over_idle / MiB:.0f} MiB over idle")
    assert over_idle < READ_BUDGET
