"""The same queries give the same answers on DuckDB over trace files and on ClickHouse (chdb).

The traces are written through the real emitter; ClickHouse gets them as the
Collector's ClickHouse exporter would store them (kvaudit.backends.clickhouse_load),
and every ClickHouse test runs twice: over the views decoding the exporter's
`otel_traces`, and over the typed tables `kvaudit clickhouse setup` makes
(kvaudit.backends.clickhouse_tables). Every named query in queries/ is compared, so new
ones are covered as they are added.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvaudit.analyse.audit import run_audit
from kvaudit.analyse.audit_partitions import plan, run_audit_by_partition
from kvaudit.analyse.capacity import capacity_curve
from kvaudit.analyse.named_queries import load
from kvaudit.backends import BackendError
from kvaudit.backends.clickhouse import ChdbConnection, ClickHouseBackend, connect
from kvaudit.backends.clickhouse_load import create_table, load_files
from kvaudit.backends.clickhouse_setup import setup
from kvaudit.backends.clickhouse_translate import to_clickhouse
from kvaudit.backends.clickhouse_views import view_columns
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.cli import main
from kvaudit.commands.arguments import open_backend
from kvaudit.otlp.schema import AnyValue, ArrayValue
from kvaudit.read.decode import attribute_text
from kvaudit.read.open import open_store

from ..support.backend_fleet import answers, named_queries, write_fleet

pytestmark = pytest.mark.slow  # every query on DuckDB and twice on chdb


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("fleet")
    write_fleet(directory)
    return directory


@pytest.fixture(scope="module")
def duck(fleet: Path) -> Iterator[DuckDBBackend]:
    backend = DuckDBBackend(open_store([str(fleet)]))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def chdb_database(fleet: Path, duck: DuckDBBackend) -> Iterator[None]:
    """The fleet in chdb as the Collector's exporter stores it, with the typed tables `kvaudit clickhouse
    setup` makes filled as the rows arrive. chdb's sessions in one process share its database."""
    loader = ClickHouseBackend(ChdbConnection())
    create_table(loader)
    assert [line.split(": ")[1] for line in setup(loader)] == ["created"] * 6
    assert load_files(loader, [str(fleet)]) == duck.query("SELECT count(*) FROM spans")[1][0][0]
    yield
    loader.close()


@pytest.fixture(scope="module", params=["views", "typed"])
def clickhouse(request: pytest.FixtureRequest, chdb_database: None) -> Iterator[ClickHouseBackend]:
    """ClickHouse over the exporter's `otel_traces` (views decoding its maps) or over the typed tables."""
    backend = ClickHouseBackend(ChdbConnection(), typed=request.param == "typed")
    backend.query("SELECT 1")
    assert backend.reads_typed_tables is (request.param == "typed")
    yield backend
    backend.close()


@pytest.fixture
def backends(duck: DuckDBBackend, clickhouse: ClickHouseBackend) -> tuple[DuckDBBackend, ClickHouseBackend]:
    return duck, clickhouse


@pytest.mark.parametrize("view", sorted(view_columns()))
def test_views_have_the_columns_of_the_duckdb_views(backends, view):
    duck, clickhouse = backends
    expected = duck.query(f"SELECT * FROM {view} LIMIT 0")[0]
    assert clickhouse.query(f"SELECT * FROM {view} LIMIT 0")[0] == expected == view_columns()[view]


@pytest.mark.parametrize("view", ["spans", "pages", "replicas"])
def test_views_hold_the_same_rows(backends, view):
    duck, clickhouse = backends
    expected = answers(duck, f"SELECT * FROM {view}")
    assert expected[1], "the fleet must fill every view"
    assert answers(clickhouse, f"SELECT * FROM {view}") == expected


@pytest.mark.parametrize("name", named_queries())
def test_named_queries_agree(backends, name):
    duck, clickhouse = backends
    assert answers(clickhouse, load(name)) == answers(duck, load(name))


@pytest.mark.parametrize(
    "name", ["evictions/before_reuse", "evictions/hit_tier", "evictions/occupancy", "evictions/rates"]
)
def test_eviction_queries_agree(backends, name):
    duck, clickhouse = backends
    expected = answers(duck, load(name))
    assert expected[1], "the fleet must give every eviction query rows"
    assert answers(clickhouse, load(name)) == expected


def test_hit_tier_names_where_each_block_came_from(duck):
    _, rows = duck.query(load("evictions/hit_tier"))
    assert [(key, served, tier) for _, _, key, _, _, served, _, tier in rows if key.startswith("e")] == [
        ("e1", "pool", "cpu"),
        ("e2", "miss", None),
        ("e1", "gpu", None),
        ("e2", "miss", None),
        ("e3", "pool", "cpu"),
    ]


# Constructs the named queries and audit rules rely on, each of which sqlglot alone
# would translate wrongly or not at all (kvaudit.backends.clickhouse_translate).
REPRESENTATIVE = {
    "json_object": """
        SELECT key, json_object('page', json_object('bytes', bytes, 'shape', shape, 'used', used),
                                'mismatch', CASE WHEN used = false THEN json_object('used', used) END) AS j
        FROM pages""",
    "concat_ws_skips_nulls": """
        SELECT key, concat_ws(', ', CASE WHEN model IS NULL THEN 'model' END,
                                    CASE WHEN shape IS NULL THEN 'shape' END, 'end') AS missing
        FROM pages""",
    "variables": """
        SELECT count(*) AS n FROM pages
        WHERE time_ns > (SELECT min(time_ns) FROM pages) + coalesce(getvariable('kvaudit_after_ns'), 0)""",
    "list_product_and_absent_arrays": """
        SELECT key, list_product(shape) AS elements, shape IS NULL AS no_shape FROM pages""",
    "product_aggregate": "SELECT key, product(token_end) AS p FROM pages GROUP BY key",
    "cte_materialisation": """
        WITH a AS NOT MATERIALIZED (SELECT key, bytes FROM pages), b AS MATERIALIZED (SELECT key FROM pages)
        SELECT a.key, a.bytes FROM a JOIN b ON a.key = b.key""",
    "portable_hash": "SELECT key, md5_number_upper(key) % 1000 AS bucket, md5_number_lower(key) AS low FROM pages",
    "percentiles_and_aliases": """
        SELECT op, sum(tokens_hit) AS tokens_hit, sum(tokens_hit) / nullif(count(*), 0) AS mean_hit,
               percentile_cont(0.9) WITHIN GROUP (ORDER BY duration_ms) AS p90,
               quantile_cont(duration_ms, 0.5) AS p50, median(duration_ms) AS p50_again,
               to_timestamp(min(start_ns) / 1e9) AS first_start
        FROM spans GROUP BY op""",
    "window_functions": """
        SELECT key, cume_dist() OVER (ORDER BY token_start, key) AS cd,
               row_number() OVER (PARTITION BY op ORDER BY time_ns) AS nth FROM pages""",
    "outer_join_nulls_and_stars": """
        SELECT f.*, s.replica AS producer, s.shape AS s_shape
        FROM pages f LEFT JOIN (SELECT * FROM pages WHERE op = 'store') s ON s.key = f.key
        WHERE f.op = 'fetch'""",
    "filter_and_empty_aggregates": """
        SELECT count(*) FILTER (WHERE used) AS used, sum(bytes) FILTER (WHERE op = 'evict') AS none_evicted,
               arg_min(replica, time_ns) AS first FROM pages""",
    "group_by_all_and_distinct_arrays": "SELECT op, shape, count(DISTINCT key) AS keys FROM pages GROUP BY ALL",
    "timestamps_of_nanoseconds": "SELECT key, op, make_timestamp_ns(time_ns) AS at FROM pages",
    "asof_join": """
        SELECT f.key, f.time_ns - s.time_ns AS after_store_ns, make_timestamp_ns(s.time_ns) AS stored_at
        FROM (SELECT key, time_ns FROM pages WHERE op = 'fetch') f
        ASOF JOIN (SELECT key, time_ns FROM pages WHERE op = 'store') s ON s.key = f.key AND s.time_ns < f.time_ns""",
    "key_ids_grouped_and_joined": """
        SELECT f.request_id, f.token_start, s.producer
        FROM pages f
        LEFT JOIN (SELECT key_id(key) AS id, arg_min(replica, time_ns) AS producer FROM pages
                   WHERE op = 'store' AND key IS NOT NULL GROUP BY key_id(key)) s ON s.id = key_id(f.key)
        WHERE f.op = 'fetch'""",
    "key_ids_computed": """
        SELECT count(*) AS pairs FROM (SELECT key FROM pages WHERE op = 'fetch' AND key IS NOT NULL) f
        JOIN (SELECT DISTINCT key FROM pages WHERE op = 'store') s ON key_id(s.key) = key_id(f.key)""",
    "distinct_keys": """
        SELECT count(DISTINCT key) AS keys, count(DISTINCT p.key) FILTER (WHERE op = 'store') AS stored,
               (SELECT count(DISTINCT key) FROM pages WHERE op = 'fetch') AS fetched FROM pages p""",
    "spans_time_and_status": """
        SELECT op, outcome, status_code, duration_ms > 0 AS timed, end_time >= start_time AS ordered,
               tokens_hit / nullif(tokens_requested, 0) AS rate FROM spans""",
}


@pytest.mark.parametrize("name", sorted(REPRESENTATIVE))
def test_representative_queries_agree(backends, name):
    duck, clickhouse = backends
    params = {"kvaudit_after_ns": 1000}
    assert answers(clickhouse, REPRESENTATIVE[name], params) == answers(duck, REPRESENTATIVE[name], params)


def test_audit_findings_agree(backends):
    duck, clickhouse = backends
    expected = [dataclasses.replace(f, file=None, line=None) for f in run_audit(duck)]
    assert {f.code for f in expected} >= {"KVA001", "KVA002", "KVA003", "KVA004", "KVA005", "KVA006"}
    assert run_audit(clickhouse) == expected


def test_audit_by_partition_agrees(backends):
    duck, clickhouse = backends
    expected = [dataclasses.replace(f, file=None, line=None) for f in run_audit(duck)]
    # Four partitions of the one day (20 fetched pages): key-hash buckets of five or so each.
    assert len(plan(clickhouse, rows_per_partition=5)) == 4
    assert run_audit_by_partition(clickhouse, rows_per_partition=5) == expected


@pytest.mark.parametrize("sample_rate", [1.0, 0.5])
def test_capacity_curves_agree(backends, sample_rate):
    duck, clickhouse = backends
    expected = capacity_curve(duck, sample_rate=sample_rate)
    curve = capacity_curve(clickhouse, sample_rate=sample_rate)
    assert (curve.accesses, curve.sample_rate) == (expected.accesses, expected.sample_rate) and expected.accesses
    assert curve.distances.tolist() == expected.distances.tolist()


def test_key_ids_are_read_where_the_key_is_a_page_column():
    """`key_id(key)` and `count(DISTINCT key)` of `pages` read the ids the typed tables store; a key
    out of a subquery has its id computed. `summary` computes none (docs/scale.md, "The key's id")."""
    [direct] = to_clickhouse("SELECT key_id(key) AS id, count(DISTINCT key) AS n FROM pages GROUP BY key_id(key)")
    assert "FROM pages_keyed AS pages" in direct.sql and "sipHash128" not in direct.sql
    assert "key_hash AS id" in direct.sql and "uniqExactIf(key_hash, key_hash <> 0)" in direct.sql
    [computed] = to_clickhouse("SELECT key_id(s.key) AS id FROM (SELECT key FROM pages) AS s")
    assert "sipHash128" in computed.sql and "pages_keyed" not in computed.sql
    [summary] = to_clickhouse(load("summary"))
    assert "pages_keyed" in summary.sql and "sipHash128" not in summary.sql


def test_cte_materialisation_is_left_to_clickhouse():
    """The auditor materialises its producers in DuckDB; servers that know neither keyword must still parse it."""
    [statement] = to_clickhouse(
        "WITH a AS MATERIALIZED (SELECT 1 AS x), b AS NOT MATERIALIZED (SELECT x FROM a) SELECT x FROM b"
    )
    assert "MATERIALIZED" not in statement.sql.upper()


def test_temp_tables_are_visible_to_later_queries(backends):
    import pyarrow as pa

    sizes = pa.table({"dtype": ["bfloat16"], "bytes": [2]})
    # `f.*` beside a joined table with a column of the same name (`bytes`), over a CTE.
    sql = """
        WITH f AS (SELECT key, bytes, dtype, shape FROM pages)
        SELECT f.*, list_product(f.shape) * d.bytes AS size FROM f JOIN element_sizes d ON d.dtype = f.dtype"""
    for backend in backends:
        backend.temp_table("element_sizes", sizes)
    duck, clickhouse = backends
    assert answers(clickhouse, sql) == answers(duck, sql)


def test_errors_are_one_line(backends, capsys):
    _, clickhouse = backends
    with pytest.raises(BackendError, match="nope"):
        clickhouse.query("SELECT nope FROM pages")
    with pytest.raises(ValueError, match="clickhouse://HOST"):
        connect("postgres://localhost/db")
    with pytest.raises(ValueError, match="not both"):
        open_backend("clickhouse://localhost:8123/otel", ["traces/"])
    for command in (["sql", "SELECT 1"], ["audit"], ["report"]):
        assert main([*command, "--backend", "clickhouse://127.0.0.1:9/otel"]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"kvaudit {command[0]}: error: 127.0.0.1:9: cannot connect to ClickHouse")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (AnyValue(stringValue="bf16"), "bf16"),
        (AnyValue(intValue="-42"), "-42"),
        (AnyValue(intValue=7), "7"),
        (AnyValue(boolValue=False), "false"),
        (AnyValue(doubleValue=1.0), "1"),
        (AnyValue(doubleValue=0.25), "0.25"),
        (AnyValue(doubleValue=1e21), "1000000000000000000000"),
        (AnyValue(arrayValue=ArrayValue([AnyValue(intValue="2"), AnyValue(intValue="64")])), "[2,64]"),
        (AnyValue(), ""),
    ],
)
def test_attribute_text_is_the_collectors(value, text):
    """pdata's AsString, which the ClickHouse exporter stores and the views parse back."""
    assert attribute_text(value) == text
