"""Line files as writers leave them: a request undone leaves no trace, a file replaced under its writer is noticed.

Short writes on a full disk are in tests/receive/test_disk_full.py (a real tmpfs and a file-size limit).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvaudit.emit.line_file import LineFile, write_together

LINE = b'{"resourceSpans":[]}\n'


def test_a_request_undone_leaves_no_trace_in_the_file_nor_in_when_it_rotates(tmp_path: Path):
    # Room for two lines and a half: a third line rotates the file, a second does not.
    kept = LineFile(tmp_path / "a.jsonl", max_bytes=len(LINE) * 5 // 2)
    (tmp_path / "b.jsonl").mkdir()  # b's file cannot be opened: the request fails after a's line went out
    failing = LineFile(tmp_path / "b.jsonl")
    kept.write(LINE)
    with pytest.raises(OSError):
        write_together([(kept, LINE, 1), (failing, LINE, 1)], fsync=False)
    assert (tmp_path / "a.jsonl").read_bytes() == LINE  # cut back
    kept.write(LINE)  # the retry: its second line, in the same file
    kept.close()
    assert (tmp_path / "a.jsonl").read_bytes() == LINE * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]  # nothing rotated


def test_a_file_replaced_under_its_writer_is_noticed_and_what_it_held_counted_lost(tmp_path: Path):
    path = tmp_path / "r1.jsonl"
    writer = LineFile(path)
    writer.write(LINE, items=3)
    other = tmp_path / "other.jsonl"
    other.write_bytes(b"{}\n")
    other.replace(path)  # someone else's file now stands at the name; ours is unlinked
    writer.write(LINE, items=2)
    writer.close()
    assert path.read_bytes() == b"{}\n" + LINE  # appended to the file at the name, after its own line
    assert writer.stats.lost_items == 3 and writer.stats.lost_files == 1
