"""Files are followed by identity: rotation never counts a line twice, `kvaudit ingest` is
idempotent per file and offset (issue 17, item 5).

Live stores are refreshed the way `kvaudit exporter` and `kvaudit alerts watch` refresh
theirs: `DuckDBBackend(TraceStore(paths, ":memory:")).refresh(final=False)`.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest

from kvaudit.cli import main
from kvaudit.commands.metrics_server import serve
from kvaudit.emit.line_file import LineFile
from kvaudit.read.open import open_store

from ..support.exporter import caught_up
from ..support.hostile import good_lines
from ..support.live_reads import append, counts, live

LINES = 24


@pytest.mark.parametrize("follow", ["directory", "glob"])
def test_the_collectors_rotation_never_counts_a_line_twice(tmp_path: Path, follow: str):
    """The Collector's file exporter renames `traces.json` to `traces-<time>.json` and
    starts a fresh `traces.json`; its writer may finish a batch in the old one."""
    lines = good_lines(LINES)
    active = tmp_path / "traces.json"
    backend = live([tmp_path if follow == "directory" else tmp_path / "traces*.json"])
    append(active, lines[0:4])
    assert counts(backend) == (4, 4)
    append(active, lines[4:6])  # written before the rotation, read after it
    rotated = tmp_path / "traces-2026-12-03T10-00-00.000.json"
    active.rename(rotated)
    append(active, lines[6:9])
    assert counts(backend) == (9, 9)
    append(rotated, lines[9:10])  # a batch finished in the old file
    assert counts(backend) == (10, 10)
    active.rename(tmp_path / "traces-2026-12-03T10-05-00.000.json")
    append(active, lines[10:12])
    rotated.unlink()  # the oldest backup removed: its rows stay
    assert counts(backend) == (12, 12)
    # Rows keep the name their file had when they were read.
    assert backend.query("SELECT DISTINCT file FROM pages ORDER BY 1")[1] == [(str(rotated),), (str(active),)]


def test_the_exporters_counts_are_unchanged_by_a_rotation(tmp_path: Path):
    """`kvaudit exporter` reads what is new as it arrives: rotation leaves its counters as they were."""
    lines = good_lines(LINES)
    active = tmp_path / "traces.json"
    append(active, lines[:4])
    server, port = serve(live([tmp_path]), "127.0.0.1", 0, analyse_every_s=0, settle_s=0)
    try:
        caught_up(server)
        before = _scraped_pages(port)
        active.rename(tmp_path / "traces-2026-12-03T10-00-00.000.json")
        active.write_bytes(b"")
        caught_up(server)
        after = _scraped_pages(port)
        append(active, lines[4:6])
        caught_up(server)
        grown = _scraped_pages(port)
    finally:
        server.shutdown()
    assert (before, after, grown) == (4, 4, 6)


def _scraped_pages(port: int) -> float:
    """The page descriptors `kvaudit_pages_total` counts, over every operation."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as reply:
        text = reply.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("kvaudit_pages_total"))


def test_kvaudits_own_rotation_never_counts_a_line_twice(tmp_path: Path):
    lines = good_lines(LINES)
    writer = LineFile(tmp_path / "r1.jsonl", max_bytes=3 * len(lines[0]))  # rotates every few lines
    backend = live([tmp_path])
    for n, line in enumerate(lines, start=1):
        writer.write(line)
        if n % 2 == 0:
            assert counts(backend) == (n, n)
    writer.close()
    assert len(list(tmp_path.iterdir())) > LINES // 4  # it did rotate
    assert counts(backend) == (LINES, LINES)


@pytest.mark.parametrize("truncated", [False, True], ids=["rewritten-in-place", "truncated-and-refilled"])
def test_a_file_rewritten_is_read_from_its_start(tmp_path: Path, truncated: bool):
    """Same inode, other first bytes (its fingerprint says so) or fewer bytes: another
    file, read from its start; the rows of the old one kept."""
    lines = good_lines(LINES)
    path = tmp_path / "r1.jsonl"
    path.write_bytes(b"".join(lines[:3]))
    backend = live([tmp_path])
    assert counts(backend) == (3, 3)
    inode = path.stat().st_ino
    if truncated:
        path.write_bytes(b"".join(lines[3:5]))  # shorter than it was
    else:
        with path.open("r+b") as f:  # no truncation, now longer
            f.write(b"".join(lines[3:8]))
    assert path.stat().st_ino == inode
    assert counts(backend) == ((5, 5) if truncated else (8, 8))


def test_a_named_file_between_rotations_is_no_error(tmp_path: Path):
    lines = good_lines(LINES)
    path = tmp_path / "traces.json"
    path.write_bytes(b"".join(lines[:2]))
    backend = live([path])
    assert counts(backend) == (2, 2)
    path.rename(tmp_path / "traces-1.json")  # renamed, its successor not created yet
    assert counts(backend) == (2, 2)
    path.write_bytes(b"".join(lines[2:5]))
    assert counts(backend) == (5, 5)
    assert backend.query("SELECT count(*) FROM read_errors")[1] == [(0,)]


# --- kvaudit ingest ----------------------------------------------------------------------


@pytest.mark.parametrize("target", ["-o", "--parquet"])
def test_ingest_twice_is_ingest_once_and_then_only_what_is_new(
    tmp_path: Path, target: str, capsys: pytest.CaptureFixture[str]
):
    lines = good_lines(LINES)
    traces = tmp_path / "traces"
    traces.mkdir()
    r1, r2 = traces / "r1.jsonl", traces / "r2.jsonl"
    append(r1, lines[:4])
    append(r2, [*lines[4:6], b"not json\n"])
    output = str(tmp_path / ("out.duckdb" if target == "-o" else "dataset"))

    def ingest() -> tuple[int, int]:
        assert main(["ingest", str(traces), target, output, "-q"]) == 0
        store = open_store([output])
        counts = store.query("SELECT (SELECT count(*) FROM pages), (SELECT count(*) FROM read_errors)")[1][0]
        store.close()
        return counts

    assert ingest() == (6, 1)
    assert ingest() == (6, 1)  # nothing new: nothing added
    append(r1, lines[6:8])
    assert ingest() == (8, 1)  # only the appended lines
    r1.rename(traces / "r1-2026-12-03T10-00-00.000.jsonl")  # rotated between ingests
    append(r1, lines[8:9])
    assert ingest() == (9, 1)
    append(r1, [lines[9][:100]])  # a writer in the middle of a line
    assert ingest() == (9, 1)
    assert "r1.jsonl ends in an unterminated line: left for the next read" in capsys.readouterr().err
    append(r1, [lines[9][100:]])
    assert ingest() == (10, 1)  # the whole line, once it is whole


def test_an_ingested_database_names_where_each_file_was_read_to(tmp_path: Path):
    lines = good_lines(LINES)
    (tmp_path / "r1.jsonl").write_bytes(b"".join(lines[:3]))
    database = tmp_path / "out.duckdb"
    assert main(["ingest", str(tmp_path / "r1.jsonl"), "-o", str(database), "-q"]) == 0
    store = open_store([str(database)])
    [(path, offset, next_line, inode)] = store.query('SELECT path, "offset", next_line, inode FROM kv_files')[1]
    assert (path, offset, next_line) == (str(tmp_path / "r1.jsonl"), len(b"".join(lines[:3])), 4)
    assert inode == os.stat(tmp_path / "r1.jsonl").st_ino
