"""The audit a partition at a time gives the whole audit's findings, on every backend, across a day's boundary.

The fleet straddles UTC midnight: fetches whose producers stored the day before, a
store a fraction of a second after a fetch on the other side of midnight (within the
clock skew), a key stored only the day after it was fetched, an orphan, and an
unreadable line (a rule over the traces as a whole, which must come once, not per
partition). It is audited whole and by partition over trace files, Parquet written by
`kvaudit ingest --parquet`, and chdb (over `otel_traces` and over the typed tables).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from kvaudit.analyse.audit import Finding, run_audit
from kvaudit.analyse.audit_partitions import TRACES, Partition, audit_partition, plan, run_audit_by_partition
from kvaudit.backends.clickhouse import ChdbConnection, ClickHouseBackend
from kvaudit.backends.clickhouse_load import create_table, load_files
from kvaudit.backends.clickhouse_setup import setup
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.cli import main
from kvaudit.read.open import open_store

from ..support.fleet import Fleet, page

# Fleet's clock starts at 2023-11-14 22:13:20 UTC; midnight comes 6,400 s later.
MIDNIGHT = 6400.0
DAY = 86400.0


def write_midnight_fleet(directory: Path) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        fleet = Fleet(directory, monkeypatch)
        r1, r2 = fleet.replica("r1"), fleet.replica("r2")
        # Day 1: r1 stores a, b, c ten seconds before midnight; r2 fetches d, which nobody stores.
        fleet.at(MIDNIGHT - 10).store(r1, [page("a", 0), page("b", 1), page("c", 2)])
        fleet.at(MIDNIGHT - 5).fetch(r2, [page("d", 0, used=True)])
        # A fetch half a second before midnight whose store follows at 0.2 s past (within 1 s of skew),
        # read through a process-local address of another process (KVA002).
        fleet.at(MIDNIGHT - 0.5).fetch(r2, [page("e", 0, used=True, transfer="raw_ptr")])
        fleet.at(MIDNIGHT + 0.2).store(r1, [page("e", 0)])
        # Day 2: r2 fetches what r1 stored the day before: a as stored, b wrong in size, c in another layout.
        fleet.at(MIDNIGHT + 5).fetch(
            r2,
            [
                page("a", 0, used=True),
                page("b", 1, used=True, bytes=1000),
                page("c", 2, used=True, layout="NB_2_BS_NH_HS"),
                msgspec.structs.replace(page("f", 3, used=True), model=None),
            ],
        )
        # Day 2: g fetched an hour after midnight, stored only the next day (stored, but no producer).
        fleet.at(MIDNIGHT + 3600).fetch(r2, [page("g", 0, used=True, transfer="raw_ptr")])
        fleet.at(MIDNIGHT + DAY + 60).store(r1, [page("g", 0)])
        # Day 3: a fetched again, its producer now two days back: outside a lookback of one day.
        fleet.at(MIDNIGHT + DAY + 120).fetch(r2, [page("a", 0, used=True)])
        fleet.open().close()
    (directory / "broken.jsonl").write_text("not json\n")


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("midnight")
    write_midnight_fleet(directory)
    return directory


@pytest.fixture(scope="module")
def duck(traces: Path) -> Iterator[DuckDBBackend]:
    backend = DuckDBBackend(open_store([str(traces)]))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def parquet(traces: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DuckDBBackend]:
    dataset = tmp_path_factory.mktemp("dataset")
    assert main(["ingest", str(traces), "--parquet", str(dataset), "-q"]) == 0
    backend = DuckDBBackend(open_store([str(dataset)]))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def chdb(traces: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ClickHouseBackend]]:
    """Sessions over `otel_traces` and over the typed tables of one chdb database."""
    path = str(tmp_path_factory.mktemp("chdb"))
    loader = ClickHouseBackend(ChdbConnection(path))
    create_table(loader)
    list(setup(loader))
    load_files(loader, [str(traces)])
    backends = {
        "chdb-views": ClickHouseBackend(ChdbConnection(path), typed=False),
        "chdb-typed": ClickHouseBackend(ChdbConnection(path)),
    }
    yield backends
    for backend in [*backends.values(), loader]:
        backend.close()


# chdb is the slow engine here: its runs are `slow`, and its database is made only for them.
CHDB = ("chdb-views", "chdb-typed")


@pytest.fixture(params=["trace files", "parquet", *(pytest.param(n, marks=pytest.mark.slow) for n in CHDB)])
def backend(request, duck, parquet):
    if request.param.startswith("chdb"):
        return request.getfixturevalue("chdb")[request.param]
    return {"trace files": duck, "parquet": parquet}[request.param]


def _without_origin(findings: list[Finding]) -> list[Finding]:
    """What every backend gives alike: ClickHouse keeps no file and line, and no unreadable lines."""
    return [dataclasses.replace(f, file=None, line=None) for f in findings if f.file is None or f.code != "KVA007"]


def test_the_fleet_has_the_cases(duck):
    codes = {(f.code, f.key) for f in run_audit(duck)}
    assert {("KVA004", "b"), ("KVA003", "b"), ("KVA005", "c"), ("KVA001", "f"), ("KVA006", "d")} <= codes
    assert {("KVA002", "e"), ("KVA002", "g"), ("KVA007", None)} <= codes
    assert ("KVA006", "g") not in codes  # stored, the day after
    days = [str(p) for p in plan(duck)]
    assert days == ["2023-11-14", "2023-11-15", "2023-11-16"]


def test_same_findings_as_the_whole_audit(backend):
    """With a lookback of two days every producer is within reach: the whole audit's findings, by day
    and by key-hash buckets of a day (two fetched pages or so in each)."""
    whole = _without_origin(run_audit(backend))
    assert _without_origin(run_audit_by_partition(backend, lookback_s=2 * DAY)) == whole
    assert _without_origin(run_audit_by_partition(backend, lookback_s=2 * DAY, rows_per_partition=2)) == whole


def test_a_producer_the_day_before_is_found(backend):
    """With the default lookback (one day), day 2's fetches find their producers on day 1."""
    day2 = Partition(dt.date(2023, 11, 15))
    found = {(f.code, f.key, f.producer) for f in audit_partition(backend, day2)}
    assert {("KVA004", "b", "r1"), ("KVA005", "c", "r1")} <= found
    assert not any(code == "KVA006" and key in ("a", "b", "c") for code, key, _ in found)


def test_a_producer_beyond_the_lookback_is_outside_the_window(backend):
    """Day 3 fetches `a`, first stored two days before: beyond one day's lookback it reads as never stored."""
    day3 = Partition(dt.date(2023, 11, 16))
    assert [(f.code, f.key) for f in audit_partition(backend, day3)] == [("KVA006", "a")]
    assert audit_partition(backend, day3, lookback_s=2 * DAY) == []


def test_partitions_run_apart_add_up_to_the_audit(duck):
    """What a cluster does: each partition on its own (by name), the rules over all spans once."""
    names = [TRACES, *(str(p) for p in plan(duck, rows_per_partition=2))]
    assert len(names) > 4
    found = [f for name in names for f in audit_partition(duck, name, lookback_s=2 * DAY)]
    assert sorted(found, key=repr) == sorted(run_audit(duck), key=repr)
    assert sum(f.code == "KVA007" for f in found) == 1


def test_partition_names():
    assert str(Partition(dt.date(2026, 12, 1))) == "2026-12-01"
    assert Partition.parse("2026-12-01:3/8") == Partition(dt.date(2026, 12, 1), 3, 8)
    for bad in ("2026-13-01", "2026-12-01:8/8", "2026-12-01:x"):
        with pytest.raises(ValueError, match="2026"):
            Partition.parse(bad)


def test_audit_command_by_day(traces, capsys):
    assert main(["audit", str(traces), "--format", "json"]) == 1
    whole = capsys.readouterr().out
    assert main(["audit", str(traces), "--format", "json", "--by-day", "--lookback", "2d"]) == 1
    assert capsys.readouterr().out == whole
    assert main(["audit", str(traces), "--by-day", "--list-partitions"]) == 0
    assert capsys.readouterr().out.split() == [TRACES, "2023-11-14", "2023-11-15", "2023-11-16"]
    assert main(["audit", str(traces), "--by-day", "--partition", "2023-11-16", "--format", "json"]) == 0
    assert '"code": "KVA006"' in capsys.readouterr().out  # info only: exit status 0
    assert main(["audit", str(traces), "--partition", "2023-11-16"]) == 2
    assert "go with --by-day" in capsys.readouterr().err
