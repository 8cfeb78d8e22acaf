"""A full disk under the receiver and under the emitter's file exporter: nothing acknowledged lost, no merged lines.

Each case runs tests/support/disk_full_scenario.py in its own process, on a real 2 MiB tmpfs
(mounted in a user and mount namespace with `unshare`; skipped where that is not
allowed) and under a file-size limit (RLIMIT_FSIZE, EFBIG: runs anywhere).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from ..support import SUPPORT

SCENARIO = SUPPORT / "disk_full_scenario.py"


@cache
def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


def _run(tmp_path: Path, mode: str, writer: str) -> tuple[dict, str]:
    where = tmp_path / "disk"
    where.mkdir()
    command = [sys.executable, str(SCENARIO), str(where), mode, writer]
    if mode == "tmpfs":
        if not _can_mount_tmpfs():
            pytest.skip("no user and mount namespaces here to mount a tmpfs in")
        mount = f"mount -t tmpfs -o size=2m tmpfs {where} && exec " + " ".join(command)
        command = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", mount]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


@pytest.mark.parametrize("mode", ["tmpfs", "rlimit"])
def test_receiver_on_a_full_disk_loses_nothing_acknowledged(tmp_path: Path, mode: str):
    result, stderr = _run(tmp_path, mode, "receiver")
    assert result["full_status"] == [503, "10"]  # retryable, with Retry-After
    assert result["write_failures"] >= 1
    assert result["when_full"]["errors"] == []  # no fragment, no merged line
    assert result["accepted_after_free"]  # space returned: accepted again
    assert result["at_end"]["errors"] == []
    assert result["at_end"]["fetches"] == result["acknowledged"]  # every acknowledged span, once
    assert "nothing of the request kept" in stderr


@pytest.mark.parametrize("mode", ["tmpfs", "rlimit"])
def test_file_exporter_on_a_full_disk_keeps_lines_whole_and_the_loss_reaches_kva007(tmp_path: Path, mode: str):
    result, stderr = _run(tmp_path, mode, "emitter")
    at_end = result["at_end"]
    assert result["failed_exports"] >= 1 and result["dropped"] >= 40
    assert at_end["errors"] == []  # the telemetry span did not land inside a merged line
    assert at_end["spans"] == result["exported"]  # every span counted as exported is readable
    assert at_end["fetches"] + result["dropped"] >= result["operations"]
    # The loss reached the trace: the telemetry span goes after the failed export, alone, and
    # a line that small fits once the failed one is cut back (else stderr has the counts,
    # tests/emit/test_emitter.py::test_a_failing_exporter_is_counted_and_reported_as_telemetry).
    assert any(f"emitter reported {result['dropped']} dropped spans" in message for message in at_end["kva007"])
    assert "exporting spans failed" in stderr
