"""`kvaudit clickhouse setup`: the typed tables, made once, filled at insert, backfilled, and what the backend
does without them. On chdb (the ClickHouse engine in-process), a database directory per test."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlglot

from kvaudit.backends import BackendError
from kvaudit.backends.clickhouse import ChdbConnection, ClickHouseBackend
from kvaudit.backends.clickhouse_load import create_table, load_files
from kvaudit.backends.clickhouse_setup import backfill, setup, spans_not_copied
from kvaudit.backends.clickhouse_tables import TYPED_TABLES, setup_statements
from kvaudit.cli import main
from kvaudit.contract import PAGE_COLUMNS

from ..support.backend_fleet import answers, write_fleet

SCHEMA = (
    "SELECT name, engine, create_table_query, comment FROM system.tables"
    " WHERE database = currentDatabase() AND name LIKE 'kvaudit%' ORDER BY name"
)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("fleet")
    write_fleet(directory)
    return directory


@pytest.fixture
def database(tmp_path: Path) -> Iterator[ClickHouseBackend]:
    """A chdb database directory with the exporter's `otel_traces`, and a session on it."""
    backend = ClickHouseBackend(ChdbConnection(str(tmp_path / "chdb")))
    create_table(backend)
    yield backend
    backend.close()


def _session(database: ClickHouseBackend, *, typed: bool = True) -> ClickHouseBackend:
    """Another session on the database (chdb's sessions in one process share its one database)."""
    return ClickHouseBackend(ChdbConnection(database.connection.path), typed=typed)


def _views_and_typed(database: ClickHouseBackend) -> tuple[ClickHouseBackend, ClickHouseBackend]:
    """Two more sessions on the database: one over otel_traces, one over the typed tables."""
    return _session(database, typed=False), _session(database)


def test_setup_twice_changes_nothing(database):
    assert list(setup(database)) == [
        f"{name}: created" for table in TYPED_TABLES for name in (table.name, table.mv_name)
    ]
    before = database.query(SCHEMA)
    assert [line.split(": ")[1] for line in setup(database)] == ["present"] * 6
    assert database.query(SCHEMA) == before
    assert {"kvaudit_pages", "kvaudit_pages_mv", "kvaudit_spans", "kvaudit_replicas"} <= {row[0] for row in before[1]}


def test_typed_tables_take_every_descriptor_field_as_a_column(database):
    list(setup(database))
    columns = dict(database.query("SELECT name, type FROM system.columns WHERE table = 'kvaudit_pages'")[1])
    assert set(PAGE_COLUMNS) <= columns.keys()
    assert columns["key"] == "Nullable(String)" and columns["time_ns"] == "Int64"
    assert columns["replica"] == "LowCardinality(Nullable(String))"
    [(partition_key, sorting_key)] = database.query(
        "SELECT partition_key, sorting_key FROM system.tables WHERE name = 'kvaudit_pages'"
    )[1]
    assert "time_ns" in partition_key and sorting_key == "replica, key, time_ns"
    codecs = dict(database.query("SELECT name, compression_codec FROM system.columns WHERE table = 'kvaudit_pages'")[1])
    assert codecs["time_ns"] == "CODEC(Delta(8), ZSTD(1))" and codecs["key"] == "CODEC(ZSTD(1))"


def test_rows_arriving_after_setup_fill_the_typed_tables(database, traces):
    list(setup(database))
    load_files(database, [str(traces)])
    views, typed = _views_and_typed(database)
    for view in ("pages", "spans", "replicas"):
        assert answers(typed, f"SELECT * FROM {view}") == answers(views, f"SELECT * FROM {view}")
    assert typed.reads_typed_tables and not views.reads_typed_tables
    assert spans_not_copied(database) == 0


def test_backfill_copies_what_came_before_once(database, traces):
    files = sorted(str(path) for path in traces.glob("*.jsonl"))
    load_files(database, files[:1])  # before the typed tables: only otel_traces has it
    list(setup(database))
    load_files(database, files[1:])  # after: the materialized views copy it
    before = spans_not_copied(database)  # the first file's spans
    assert 0 < before < database.query("SELECT count(*) FROM spans")[1][0][0]
    assert _copied(backfill(database)) == before
    views, typed = _views_and_typed(database)
    for view in ("pages", "spans", "replicas"):
        assert answers(typed, f"SELECT * FROM {view}") == answers(views, f"SELECT * FROM {view}")
    counts = [typed.query(f"SELECT count(*) FROM {table.name}")[1] for table in TYPED_TABLES]
    assert _copied(backfill(database)) == 0
    assert [typed.query(f"SELECT count(*) FROM {table.name}")[1] for table in TYPED_TABLES] == counts


def _copied(lines: Iterator[str]) -> int:
    """The spans a backfill copied, from its lines (`otel_traces partition P: N spans copied`)."""
    return sum(int(line.rsplit(": ", 1)[1].split()[0].replace(",", "")) for line in lines)


def test_without_typed_tables_the_backend_says_so_once(database, traces, caplog):
    load_files(database, [str(traces)])
    with caplog.at_level(logging.WARNING, logger="kvaudit.backends.clickhouse"):
        backend = _session(database)
        for _ in range(3):
            backend.query("SELECT count(*) FROM pages")
    assert backend.reads_typed_tables is False
    [record] = caplog.records
    assert "no typed tables for otel_traces" in record.getMessage()
    assert "kvaudit clickhouse setup" in record.getMessage()


def test_typed_tables_of_another_layout_are_not_read_nor_replaced(database, traces, caplog):
    list(setup(database))
    load_files(database, [str(traces)])
    database.connection.command("ALTER TABLE kvaudit_pages MODIFY COMMENT 'kvaudit pages from otel_traces, layout 0'")
    with caplog.at_level(logging.WARNING, logger="kvaudit.backends.clickhouse"):
        backend = _session(database)
        assert backend.query("SELECT count(*) FROM pages")[1] == [(39,)]
    assert backend.reads_typed_tables is False
    assert "kvaudit_pages are of another layout" in caplog.records[0].getMessage()
    with pytest.raises(BackendError, match="kvaudit_pages exists with another layout"):
        list(setup(database))


def test_statements_are_valid_clickhouse():
    for statement in setup_statements():
        sqlglot.parse_one(statement, read="clickhouse")


def test_setup_command(tmp_path: Path, traces: Path, capsys):
    database = tmp_path / "chdb"
    backend = ClickHouseBackend(ChdbConnection(str(database)))
    create_table(backend)
    load_files(backend, [str(traces)])
    backend.close()  # one chdb session at a time: the command opens its own
    url = f"chdb://{database}"
    assert main(["clickhouse", "setup", "--backend", url]) == 0
    out = capsys.readouterr().out
    assert "kvaudit_pages: created" in out and "otel_traces holds 23 spans the typed tables lack" in out
    assert main(["clickhouse", "setup", "--backend", url, "--backfill"]) == 0
    out = capsys.readouterr().out
    assert "kvaudit_pages: present" in out and _copied(iter(out.splitlines()[6:])) == 23
    assert main(["sql", "--backend", url, "SELECT count(*) AS n FROM pages", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", "39"]


def test_setup_print_needs_no_server(capsys):
    assert main(["clickhouse", "setup", "--print", "--backend", "clickhouse://nowhere:1/otel?table=traces"]) == 0
    out = capsys.readouterr().out
    assert "CREATE TABLE IF NOT EXISTS kvaudit_pages" in out and "FROM traces" in out
    assert "INSERT INTO kvaudit_pages" in out  # the backfill, for a partition P
    assert main(["clickhouse", "setup"]) == 2
