"""logrotate's rotations never count a line twice: a copy is known by its first bytes, not its name or inode.

`copytruncate` copies the active file to a new name (a new inode holding text already
read) and truncates the active one, which its writer goes on appending to; `dateext`
names the copy by date; `compress` gzips (or zstds) the copy, at once or a rotation
later (`delaycompress`). Live stores are refreshed as `kvaudit exporter` and `kvaudit
alerts watch` refresh theirs; `kvaudit ingest` keeps its positions between runs.
"""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from kvaudit.cli import main
from kvaudit.read.sources import zstd

from ..support.hostile import good_lines
from ..support.live_reads import append, counts, live

LINES = good_lines(36)


def _copytruncate(active: Path, copy: Path) -> None:
    shutil.copyfile(active, copy)
    with active.open("r+b") as f:
        f.truncate(0)


def _gzip(path: Path) -> None:
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()


def _zstd(path: Path) -> None:
    path.with_name(path.name + ".zst").write_bytes(zstd.compress(path.read_bytes()))
    path.unlink()


def _nothing(path: Path) -> None:
    pass


STYLES: dict[str, tuple[str, Callable[[Path], None], bool]] = {
    # name: (the copy's name, what compress does to it, whether a refresh sees it before that)
    "copytruncate": ("traces.jsonl.1", _nothing, True),
    "dateext": ("traces.jsonl-20261207", _nothing, True),
    "compress-gzip": ("traces.jsonl.1", _gzip, False),
    "compress-zstd": ("traces.jsonl.1", _zstd, False),
    "delaycompress-gzip": ("traces.jsonl.1", _gzip, True),
}


@pytest.mark.parametrize("style", list(STYLES))
def test_a_live_reader_counts_each_line_once_through_logrotate(tmp_path: Path, style: str):
    copy_name, compress, seen_before_compress = STYLES[style]
    active, copy = tmp_path / "traces.jsonl", tmp_path / copy_name
    backend = live([tmp_path])
    append(active, LINES[:20])
    assert counts(backend) == (20, 20)
    append(active, LINES[20:32])  # written before the rotation, read after it
    _copytruncate(active, copy)
    if seen_before_compress:
        assert counts(backend) == (32, 32)
    compress(copy)
    assert counts(backend) == (32, 32)
    append(active, LINES[32:36])  # the writer goes on in the truncated file
    assert counts(backend) == (36, 36)


def test_ingest_after_a_copytruncate_adds_only_what_is_new(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    traces, database = tmp_path / "traces", tmp_path / "kv.duckdb"
    traces.mkdir()
    active = traces / "traces.jsonl"
    append(active, LINES[:20])
    assert main(["ingest", str(traces), "--out", str(database)]) == 0
    append(active, LINES[20:32])
    _copytruncate(active, traces / "traces.jsonl-20261207")
    _gzip(traces / "traces.jsonl-20261207")
    append(active, LINES[32:36])
    assert main(["ingest", str(traces), "--out", str(database)]) == 0
    capsys.readouterr()
    query = "SELECT count(*), count(DISTINCT request_id) FROM pages"
    assert main(["sql", "--format", "csv", str(database), query]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "36,36"
