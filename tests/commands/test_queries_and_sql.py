"""Named queries by name: `kvaudit queries` lists them, `kvaudit sql -q NAME` runs them, from anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvaudit.analyse.named_queries import describe, named_queries, run_named
from kvaudit.cli import main
from kvaudit.read.open import open_store

from ..support.fleet import Fleet, page


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict]:
    assert main(argv) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_queries_lists_each_question_with_its_parameters(capsys: pytest.CaptureFixture[str]):
    listed = {row["name"]: row for row in _json(capsys, ["queries", "--format", "json"])}
    shown = {n for n in named_queries() if not n.startswith(("audit/", "tui/")) and n != "views"}
    assert set(listed) == shown
    assert listed["hit_rate"]["parameters (default)"] == "bucket_s=60"
    assert listed["summary"]["answers"] == describe("summary").summary != ""
    everything = {row["name"] for row in _json(capsys, ["queries", "--all", "--format", "json"])}
    assert {"audit/kva001_incomplete_metadata", "tui/replicas"} <= everything


@pytest.fixture
def traces(trace_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    fleet = Fleet(trace_dir, monkeypatch)
    r1, r2 = fleet.replica("r1"), fleet.replica("r2")
    fleet.at(0).store(r1, [page("a"), page("b", 1)])
    fleet.at(40).fetch(r2, [page("a", used=True)])  # one minute of the epoch: 00:00 + 40 s and + 75 s
    fleet.at(75).fetch(r2, [page("b", 1, used=True)])
    fleet.open().close()  # every span on disk
    return trace_dir


def test_sql_runs_a_named_query_with_its_parameters(traces: Path, capsys: pytest.CaptureFixture[str]):
    rows = _json(capsys, ["sql", str(traces), "-q", "hit_rate", "--param", "bucket_s=30", "--format", "json"])
    columns, expected = run_named(open_store([str(traces)]), "hit_rate", {"kvaudit_bucket_s": 30})
    numbers = [c for c in columns if c != "bucket_start"]
    assert [[row[c] for c in numbers] for row in rows] == [
        [value for c, value in zip(columns, row) if c != "bucket_start"] for row in expected
    ]
    assert len({row["bucket_start"] for row in rows}) == 2  # two 30 s buckets, one of 60
    default = _json(capsys, ["sql", str(traces), "-q", "hit_rate", "--format", "json"])
    assert len({row["bucket_start"] for row in default}) == 1


@pytest.mark.parametrize("spec", ["queries/summary.sql", "summary.sql", "summary"])
def test_a_file_argument_naming_a_shipped_query_works_outside_a_checkout(
    traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], spec: str
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no queries/ folder here
    rows = _json(capsys, ["sql", str(traces), "-f", spec, "--format", "json"])
    assert {row["replica"] for row in rows} == {"r1", "r2"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-q", "nope"], "no named query 'nope'"),
        (["-f", "nope.sql"], "nope.sql: no such file, nor a named query"),
        (["-q", "summary", "--param", "bucket"], "--param 'bucket': expected NAME=VALUE"),
    ],
)
def test_bad_names_are_one_line(traces: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str):
    assert main(["sql", str(traces), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
