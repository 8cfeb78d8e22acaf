"""The LMCache hook against real LMCache 0.5.6: real engines in separate OS processes,
sharing LMCache's own `lm://` server on 127.0.0.1 or an `fs://` directory.

The replicas run `tests/support/lmcache_replica.py`; their engines copy KV with the CPU copy
connector of `kvaudit.hooks.lmcache.testing`, which stands in for LMCache's CUDA copy
kernel only. What the hooks recorded is read back through the `pages`, `spans` and
`replicas` views of `kvaudit.read.store`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("lmcache", reason="LMCache is installed by scripts/install-lmcache.sh")
torch = pytest.importorskip("torch")

from kvaudit.contract import REQUIRED_ON_FETCH, REQUIRED_ON_STORE, Op, PageDescriptor, Res  # noqa: E402
from kvaudit.read.store import TraceStore  # noqa: E402

from ...support import SUPPORT  # noqa: E402
from ...support.servers import free_port, serving  # noqa: E402

# LMCache sets up OpenTelemetry logging through a handler the SDK deprecates: not ours.
pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*LoggingHandler.*:DeprecationWarning")]

REPLICA_SCRIPT = SUPPORT / "lmcache_replica.py"
TOKENS = 1000  # LMCache stores full 256-token chunks only: 768 tokens, 3 pages
STORED = 768
ENV = {
    **os.environ,
    "LMCACHE_TRACK_USAGE": "false",
    # LMCache's default hash is Python's `hash` of int tuples; fixed anyway, as LMCache asks.
    "PYTHONHASHSEED": "0",
}
GEOMETRY_R1 = {"layers": 2, "kv_heads": 2, "head_size": 16}
# Same width (2 x 16 = 4 x 8), another head split: LMCache cannot tell the difference.
GEOMETRY_SPLIT = {"layers": 2, "kv_heads": 4, "head_size": 8}


@pytest.fixture(scope="module")
def lm_url() -> Iterator[str]:
    """LMCache's own server, `python -m lmcache.v1.server 127.0.0.1 PORT cpu`."""
    port = free_port()
    command = [sys.executable, "-m", "lmcache.v1.server", "127.0.0.1", str(port), "cpu"]
    with serving(command, port, "LMCache server", env=ENV):
        yield f"lm://127.0.0.1:{port}"


def _spec(
    tmp: Path, replica: str, role: str, pools: list[dict[str, Any]], geometry: dict[str, int], **extra: Any
) -> dict[str, Any]:
    return {
        "replica": replica,
        "role": role,
        "pools": pools,
        "tokens": TOKENS,
        "seed": sum(map(ord, replica)),
        "export": f"file:{tmp / 'traces' / replica}.jsonl",
        "out": str(tmp / f"{replica}.json"),
        **geometry,
        **extra,
    }


def _run(*specs: dict[str, Any]) -> None:
    """Run replicas as OS processes, at most two at a time (the machine has two cores)."""
    for batch in (specs[i : i + 2] for i in range(0, len(specs), 2)):
        procs = [
            subprocess.Popen(
                [sys.executable, str(REPLICA_SCRIPT), json.dumps(spec)],
                env=ENV,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for spec in batch
        ]
        for spec, proc in zip(batch, procs, strict=True):
            output, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"replica {spec['replica']} failed:\n{output[-3000:]}"


class Runs:
    """What the replicas of one module run reported, and their traces."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.store = TraceStore([tmp / "traces"])
        self.store.refresh()

    def result(self, replica: str, pool: int = 0) -> dict[str, int]:
        return json.loads((self.tmp / f"{replica}.json").read_text())[pool]

    def kv(self, replica: str, pool: int = 0) -> Any:
        return torch.load(self.tmp / f"{replica}.json.{pool}.pt")

    def rows(self, query: str, **params: Any) -> list[dict[str, Any]]:
        columns, rows = self.store.query(query, params)
        return [dict(zip(columns, row, strict=True)) for row in rows]

    def pages(self, replica: str, op: str, pool: int = 0) -> list[dict[str, Any]]:
        """The pages of `replica`'s `op` on its `pool`-th pool (each pool is one span, in order)."""
        return self.rows(
            """
            WITH ops AS (
                SELECT span_id, row_number() OVER (ORDER BY start_ns) - 1 AS pool
                FROM spans WHERE replica = $replica AND op = $op
            )
            SELECT pages.* FROM pages JOIN ops USING (span_id)
            WHERE pages.replica = $replica AND ops.pool = $pool ORDER BY token_start
            """,
            replica=replica,
            op=op,
            pool=pool,
        )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, lm_url: str) -> Iterator[Runs]:
    tmp = tmp_path_factory.mktemp("lmcache")
    (tmp / "traces").mkdir()
    registry = str(tmp / "registry")
    lm = [{"url": lm_url, "offset": 0}]
    # Two fs:// pools, with and without LMCache's chunk header, each with its own tokens.
    fs = [
        {"url": f"fs://localhost:0{tmp / 'pool-meta'}", "offset": 10_000},
        {"url": f"fs://localhost:0{tmp / 'pool-bare'}", "offset": 20_000, "extra_config": {"save_chunk_meta": False}},
    ]
    # Producers first: r1 into the lm:// server, leaving descriptors in the registry and
    # hashing every page; f1 into the two fs:// pools.
    # p1 stores the same tokens as r1 with prevent on: the same pool, other keys.
    _run(
        _spec(tmp, "r1", "store", lm, GEOMETRY_R1, registry=registry, checksum_rate=1.0),
        _spec(tmp, "f1", "store", fs, GEOMETRY_R1),
        _spec(tmp, "p1", "store", lm, GEOMETRY_R1, prevent=True),
    )
    # Consumers: the same geometry, the other head split without and with the guard,
    # and the fs:// reader.
    _run(
        _spec(tmp, "r2", "fetch", lm, GEOMETRY_R1, checksum_rate=1.0),
        _spec(tmp, "r3", "fetch", lm, GEOMETRY_SPLIT),
        _spec(tmp, "r4", "fetch", lm, GEOMETRY_SPLIT, guard=True, registry=registry, checksum_rate=1.0),
        # r4 recording none of its requests (sampled by the request id LMCache is told): the
        # guard still judges them.
        _spec(tmp, "s4", "fetch", lm, GEOMETRY_SPLIT, guard=True, registry=registry, sample_rate=0, request_id="s4-0"),
        _spec(tmp, "f2", "fetch", fs, GEOMETRY_R1),
        # With prevent on: r2 and r3 again.
        _spec(tmp, "p2", "fetch", lm, GEOMETRY_R1, prevent=True),
        # p3 stores what it recomputed: under its own fingerprint, beside p1's pages.
        _spec(tmp, "p3", "fetch", lm, GEOMETRY_SPLIT, prevent=True, store_recomputed=True),
    )
    result = Runs(tmp)
    yield result
    result.store.close()


def _descriptor(row: dict[str, Any]) -> PageDescriptor:
    fields = {name: row[name] for name in PageDescriptor.__struct_fields__ if row.get(name) is not None}
    if "shape" in fields:
        fields["shape"] = tuple(fields["shape"])
    return PageDescriptor(**fields)


def _cross_replica_fetches(runs: Runs, consumer: str) -> list[dict[str, Any]]:
    """Fetched pages of `consumer` joined to the earliest earlier store of their key by another replica."""
    return runs.rows(
        """
        SELECT f.key, f.used, f.bytes AS fetched_bytes, s.bytes AS stored_bytes, s.replica AS producer
        FROM pages f
        JOIN pages s ON s.key = f.key AND s.op = 'store' AND s.replica <> f.replica AND s.time_ns <= f.time_ns
        WHERE f.op = 'fetch' AND f.replica = $consumer
        QUALIFY row_number() OVER (PARTITION BY f.key ORDER BY s.time_ns) = 1
        ORDER BY f.token_start
        """,
        consumer=consumer,
    )


@pytest.mark.parametrize(("producer", "consumer"), [("r1", "r2"), ("f1", "f2")])
def test_replica_fetches_the_other_replicas_pages(runs: Runs, producer: str, consumer: str) -> None:
    assert runs.result(consumer) == {"lookup": STORED, "retrieved": STORED, "recomputed": TOKENS - STORED}
    assert torch.equal(runs.kv(consumer)[:, :, :STORED], runs.kv(producer)[:, :, :STORED])

    reuse = _cross_replica_fetches(runs, consumer)
    pools = 2 if producer == "f1" else 1
    assert [row["producer"] for row in reuse] == [producer] * 3 * pools
    assert all(row["used"] and row["fetched_bytes"] == row["stored_bytes"] == 65536 for row in reuse)

    stored = [_descriptor(row) for row in runs.pages(producer, "store")]
    fetched = [_descriptor(row) for row in runs.pages(consumer, "fetch")]
    assert [page.missing(REQUIRED_ON_STORE) for page in stored] == [[]] * 3
    assert [page.missing(REQUIRED_ON_FETCH) for page in fetched] == [[]] * 3
    assert [(p.token_start, p.token_end) for p in fetched] == [(0, 256), (256, 512), (512, 768)]
    for store, fetch in zip(stored, fetched, strict=True):
        assert (fetch.key, fetch.model, fetch.dtype, fetch.shape, fetch.layout, fetch.bytes) == (
            store.key,
            store.model,
            store.dtype,
            store.shape,
            store.layout,
            store.bytes,
        )
        assert (fetch.layout, fetch.shape, fetch.tier) == ("KV_2LTD", (2, 2, 256, 32), "remote")
        # The fetched object carries no head split: only the store side knows it.
        assert (fetch.kv_heads, fetch.head_size, store.kv_heads, store.head_size) == (None, None, 2, 16)
    if producer == "r1":  # both sides hashed every page
        assert [p.checksum for p in fetched] == [p.checksum for p in stored]
        assert all(p.checksum.startswith("xxh3_64:") for p in fetched)

    lookup = runs.rows("SELECT * FROM spans WHERE replica = $r AND op = 'lookup' ORDER BY start_ns", r=consumer)[0]
    assert (lookup["outcome"], lookup["tokens_hit"], lookup["tokens_requested"]) == ("hit", STORED, STORED)


def test_cross_replica_reuse_through_kvaudit_sql(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    from kvaudit.cli import main

    query = """
        SELECT f.replica AS consumer, s.replica AS producer, count(DISTINCT f.key) AS pages, sum(f.bytes) AS bytes
        FROM pages f JOIN pages s ON s.key = f.key AND s.op = 'store' AND s.replica <> f.replica
        WHERE f.op = 'fetch' AND f.used GROUP BY ALL ORDER BY consumer
    """
    assert main(["sql", str(runs.tmp / "traces"), query, "--format", "json"]) == 0
    reuse = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert reuse == [
        {"consumer": "f2", "producer": "f1", "pages": 6, "bytes": 6 * 65536},
        {"consumer": "p2", "producer": "p1", "pages": 3, "bytes": 3 * 65536},
        {"consumer": "r2", "producer": "r1", "pages": 3, "bytes": 3 * 65536},
        {"consumer": "r3", "producer": "r1", "pages": 3, "bytes": 3 * 65536},
    ]


def test_silent_misread_is_a_full_hit_the_traces_expose(runs: Runs) -> None:
    # r3 splits the same width into 4 heads of 8: LMCache serves r1's pages, no error.
    assert runs.result("r3") == {"lookup": STORED, "retrieved": STORED, "recomputed": TOKENS - STORED}
    r1, r3 = runs.kv("r1"), runs.kv("r3")
    assert torch.equal(r3[:, :, :STORED].flatten(3), r1[:, :, :STORED].flatten(3))  # the same bytes ...
    assert torch.equal(r3[:, :, :STORED, 1], r1[:, :, :STORED, 0, 8:])  # r3's head 1 is half of r1's head 0

    reuse = _cross_replica_fetches(runs, "r3")
    assert [(row["producer"], row["used"]) for row in reuse] == [("r1", True)] * 3
    # ... read under another geometry, which only the traces can tell: the producer's
    # store descriptors against the consumer's own configuration.
    mismatches = runs.rows(
        """
        SELECT f.key, s.kv_heads AS stored_heads, s.head_size AS stored_head_size,
               r.kv_heads AS own_heads, r.head_size AS own_head_size
        FROM pages f
        JOIN pages s ON s.key = f.key AND s.op = 'store'
        JOIN replicas r ON r.replica = f.replica
        WHERE f.op = 'fetch' AND f.replica = 'r3' AND f.used
          AND (s.kv_heads <> r.kv_heads OR s.head_size <> r.head_size)
        """
    )
    assert [(m["stored_heads"], m["stored_head_size"], m["own_heads"], m["own_head_size"]) for m in mismatches] == [
        (2, 16, 4, 8)
    ] * 3


def test_guard_turns_the_misread_into_a_miss_and_recompute(runs: Runs) -> None:
    # r4 is r3 with guard mode and the store registry: nothing of r1's is used.
    assert runs.result("r4") == {"lookup": STORED, "retrieved": 0, "recomputed": TOKENS}
    generator = torch.Generator().manual_seed(sum(map(ord, "r4")))
    own = torch.randn(runs.kv("r4").shape, generator=generator).to(torch.bfloat16)
    assert torch.equal(runs.kv("r4"), own)

    fetched = runs.pages("r4", "fetch")
    assert [(row["used"], row["outcome"]) for row in fetched] == [(False, "rejected")] * 3
    [span] = runs.rows("SELECT * FROM spans WHERE replica = 'r4' AND op = 'fetch'")
    assert (span["outcome"], span["tokens_hit"], span["pages"]) == ("rejected", 0, 3)


def test_guard_judges_a_request_not_recorded(runs: Runs) -> None:
    assert runs.result("s4") == {"lookup": STORED, "retrieved": 0, "recomputed": TOKENS}
    assert runs.rows("SELECT op FROM spans WHERE replica = 's4' AND op IN ('lookup', 'fetch', 'store')") == []


def _store_keys(runs: Runs, replica: str) -> list[str]:
    return [row["key"] for row in runs.pages(replica, "store")]


def test_prevent_the_other_head_split_misses_without_fetching(runs: Runs) -> None:
    # p3 is r3 with prevent: r1's and p1's pages of its tokens sit in the pool, none is its own.
    assert runs.result("p3") == {"lookup": 0, "retrieved": 0, "recomputed": TOKENS}
    generator = torch.Generator().manual_seed(sum(map(ord, "p3")))
    assert torch.equal(runs.kv("p3"), torch.randn(runs.kv("p3").shape, generator=generator).to(torch.bfloat16))
    # No fetch of the producer's bytes at all: no fetched page, nothing used.
    assert runs.rows("SELECT * FROM pages WHERE replica = 'p3' AND op = 'fetch'") == []
    [lookup] = runs.rows("SELECT * FROM spans WHERE replica = 'p3' AND op = 'lookup'")
    assert (lookup["outcome"], lookup["tokens_hit"]) == ("miss", 0)

    from kvaudit.analyse.audit import run_audit

    findings = [f for f in run_audit(runs.store) if f.replica in ("p1", "p2", "p3")]
    assert [f for f in findings if f.severity == "critical"] == []


def test_prevent_same_geometry_still_hits_across_replicas(runs: Runs) -> None:
    # p2 is r2 with prevent: p1's pages carry the same fingerprint, so they are p2's keys.
    assert runs.result("p2") == {"lookup": STORED, "retrieved": STORED, "recomputed": TOKENS - STORED}
    assert torch.equal(runs.kv("p2")[:, :, :STORED], runs.kv("p1")[:, :, :STORED])
    assert [row["producer"] for row in _cross_replica_fetches(runs, "p2")] == ["p1"] * 3
    tagged = _store_keys(runs, "p1")
    assert len(tagged) == 3 and all("@kvaudit_geometry%" in key for key in tagged)
    assert set(tagged).isdisjoint(_store_keys(runs, "r1"))


def test_prevent_off_keys_carry_no_tag(runs: Runs) -> None:
    # Today's behaviour: r1's keys are LMCache's own, and r3 misreads them (the silent-misread test).
    assert not any("kvaudit_geometry" in key for key in _store_keys(runs, "r1"))


def _geometry_of(runs: Runs) -> dict[str, str]:
    return {row["replica"]: row["geometry"] for row in runs.rows("SELECT replica, geometry FROM replicas")}


def test_prevent_fingerprint_in_the_resource_the_stored_pages_and_the_keys(runs: Runs) -> None:
    declared = _geometry_of(runs)
    same, split = declared["r1"], declared["r3"]
    assert re.fullmatch(r"[0-9a-f]{16}", same) and same != split
    assert {declared[r] for r in ("r1", "r2", "p1", "p2", "f1", "f2")} == {same}
    assert {declared[r] for r in ("r3", "r4", "p3")} == {split}
    for replica in ("r1", "p1", "p3"):
        assert [row["geometry"] for row in runs.pages(replica, "store")] == [declared[replica]] * 3
    # Under prevent the key's tag is the fingerprint the resource declares.
    assert all(key.endswith(f"@kvaudit_geometry%{same}") for key in _store_keys(runs, "p1"))
    assert all(key.endswith(f"@kvaudit_geometry%{split}") for key in _store_keys(runs, "p3"))
    # A fetched object carries none (its key's tag would be the consumer's own).
    assert {row["geometry"] for row in runs.pages("r3", "fetch")} == {None}


def test_kva008_the_other_head_split_read_without_prevent(runs: Runs) -> None:
    from kvaudit.analyse.audit import run_audit

    declared = _geometry_of(runs)
    found = [f for f in run_audit(runs.store) if f.code == "KVA008"]
    # r3 used r1's pages (critical); r4's guard refused them (warning); nobody of r1's geometry.
    assert sorted((f.replica, f.severity, f.producer) for f in found) == [
        *[("r3", "critical", "r1")] * 3,
        *[("r4", "warning", "r1")] * 3,
    ]
    expected = {"fetched": None, "stored": declared["r1"], "consumer": declared["r3"]}
    assert all(f.fields == {"geometry": expected} for f in found)


def test_prevent_the_report_counts_the_reuse_prevention_forwent(runs: Runs) -> None:
    from kvaudit.analyse.named_queries import run_named
    from kvaudit.present.report import Report, Table, headline

    row = Table(*run_named(runs.store, "headline"))
    # p3 recomputed the three pages the pool held under p1's fingerprint; r1's keys are untagged.
    assert row.records()[0]["prevented_pages"] == 3
    figure = next(f for f in headline(Report([], row)) if f.name == "prevented_pages")
    assert (figure.text, figure.value) == ("3", 3)


def test_prevent_the_tui_status_line_counts_the_reuse_prevention_forwent(runs: Runs) -> None:
    pytest.importorskip("textual", reason="the TUI's extra")
    from kvaudit.tui.source import LiveSource
    from kvaudit.tui.widgets.status_bar import StatusBar
    from kvaudit.tui.window import window_named

    source = LiveSource(runs.store.cursor(), auditor=None)  # a connection of its own: the store stays open
    source.poll(window_named("1m"))
    figures = source.analyse(window_named("1m"), force=True)  # counted with the analysis, not each refresh
    assert figures is not None and figures.prevented_pages == 3  # over all the traces, whatever the window
    source.close()
    bar = StatusBar("traces/")
    bar.figures = figures
    assert " · 3 prevented" in str(bar.render())


def test_fs_without_chunk_meta_fetches_pages_missing_their_metadata(runs: Runs) -> None:
    # f1 wrote its second pool with save_chunk_meta=False: no header, so f2's reader
    # allocates the objects from its own configuration, and the descriptors say so.
    assert runs.result("f2", pool=1)["retrieved"] == STORED
    assert torch.equal(runs.kv("f2", pool=1)[:, :, :STORED], runs.kv("f1", pool=1)[:, :, :STORED])
    fetched = [_descriptor(row) for row in runs.pages("f2", "fetch", pool=1)]
    assert [sorted(page.missing(REQUIRED_ON_FETCH)) for page in fetched] == [["dtype", "layout", "shape"]] * 3
    assert all(page.used for page in fetched)
    stored = [_descriptor(row) for row in runs.pages("f1", "store", pool=1)]
    assert [page.missing(REQUIRED_ON_STORE) for page in stored] == [[]] * 3
    assert [p.key for p in stored] == [p.key for p in fetched]


def test_every_hooked_process_declares_its_own_configuration(runs: Runs) -> None:
    rows = runs.rows("SELECT replica, engine, engine_version, kv_heads, head_size, layout FROM replicas ORDER BY 1")
    declared = {row["replica"]: row for row in rows}
    assert set(declared) == {"f1", "f2", "p1", "p2", "p3", "r1", "r2", "r3", "r4", "s4"}
    assert (declared["r3"]["kv_heads"], declared["r3"]["head_size"]) == (4, 8)
    assert {(row["engine"], row["engine_version"], row["layout"]) for row in rows} == {("lmcache", "0.5.6", "KV_2LTD")}
    assert runs.rows("SELECT * FROM read_errors") == []


def _local_round(
    name: str, hooked: bool, store_id: str = "req-store", load_id: str = "req-load"
) -> tuple[int, int, Any]:
    """Store a sequence in a local-CPU-only engine (request `store_id`), then look it up and
    retrieve it (request `load_id`)."""
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    from kvaudit.hooks import lmcache as hook
    from kvaudit.hooks.lmcache.testing import cpu_engine

    engine = cpu_engine(
        name,
        **GEOMETRY_R1,
        storage_plugins=[hook.PLUGIN_NAME] if hooked else [],
        extra_config=hook.plugin_config() if hooked else {},
    )
    try:
        tokens = list(range(TOKENS))
        kv = torch.randn(2, 2, TOKENS, 2, 16, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
        engine.store(tokens, kvcache=kv, req_id=store_id)
        looked_up = engine.lookup(tokens, lookup_id=load_id)
        out = torch.zeros_like(kv)
        retrieved = int(engine.retrieve(tokens, kvcache=out, req_id=load_id).sum())
        return looked_up, retrieved, out
    finally:
        LMCacheEngineBuilder.destroy(name)


def _beside_plain(
    tmp_path: Path, replica: str, store_id: str = "req-store", load_id: str = "req-load", **options: Any
) -> TraceStore:
    """A local round unhooked and one hooked with `options`, which LMCache must serve alike;
    the hooked round's traces."""
    from kvaudit.hooks import lmcache as hook

    plain = _local_round("plain", hooked=False)
    assert hook.instrument(replica=replica, export=f"file:{tmp_path}/{replica}.jsonl", **options)
    try:
        hooked = _local_round(replica, hooked=True, store_id=store_id, load_id=load_id)
    finally:
        hook.uninstrument()
    assert plain[:2] == hooked[:2] == (STORED, STORED)
    assert torch.equal(plain[2], hooked[2])
    store = TraceStore([tmp_path])
    store.refresh()
    return store


def test_hooks_change_nothing_with_guard_off(tmp_path: Path) -> None:
    store = _beside_plain(tmp_path, "same", checksum_rate=1.0)
    _, rows = store.query("SELECT op, count(*), bool_and(coalesce(used, true)) FROM pages GROUP BY op ORDER BY op")
    # Destroying the engine removes its pages: the evictions are part of the record too.
    assert rows == [("evict", 3, True), ("fetch", 3, True), ("store", 3, True)]
    _, rows = store.query("SELECT op, request_id FROM spans WHERE op IN ('store', 'lookup', 'fetch') ORDER BY start_ns")
    assert rows == [("store", "req-store"), ("lookup", "req-load"), ("fetch", "req-load")]
    store.close()


def test_a_sample_rate_records_the_chosen_requests_alone(tmp_path: Path) -> None:
    """At rate 0.5, a store of a request the sampler chooses is recorded, the lookup and fetch
    of one it does not are not, and LMCache serves both alike."""
    from kvaudit.sampling import request_sampler

    sampler = request_sampler(0.5)
    assert sampler is not None
    ids = [f"req-{n}" for n in range(64)]
    chosen, left_out = next(filter(sampler, ids)), next(i for i in ids if not sampler(i))
    store = _beside_plain(tmp_path, "sampled", chosen, left_out, sample_rate=0.5)
    _, rows = store.query("SELECT op, request_id FROM spans WHERE op IN ('store', 'lookup', 'fetch')")
    assert rows == [("store", chosen)]
    store.close()
    resource = json.loads((tmp_path / "sampled.jsonl").read_text().splitlines()[0])["resourceSpans"][0]["resource"]
    assert {"key": Res.SAMPLE_RATE, "value": {"doubleValue": 0.5}} in resource["attributes"]


def test_instrument_is_idempotent_and_uninstrument_restores(caplog: pytest.LogCaptureFixture) -> None:
    import lmcache
    from lmcache.v1.cache_engine import LMCacheEngine
    from lmcache.v1.storage_backend.storage_manager import StorageManager
    from lmcache.v1.token_database import ChunkedTokenDatabase

    from kvaudit.hooks import lmcache as hook
    from kvaudit.hooks.lmcache.pages import READ_IN_PLACE

    names = ("batched_get", "get", "get_non_blocking", "layerwise_batched_get", "batched_contains")
    originals = {name: StorageManager.__dict__[name] for name in names}
    tokens_original = ChunkedTokenDatabase.__dict__["process_tokens"]
    engine_originals = {name: LMCacheEngine.__dict__[name] for name in ("store", "retrieve", "lookup")}
    assert hook.instrument(replica="idem", export="file:/dev/null")
    wrapped = {name: StorageManager.__dict__[name] for name in names}
    assert all(wrapped[name] is not originals[name] for name in names)
    assert hook.instrument(replica="idem", export="file:/dev/null")  # a second call changes nothing
    assert {name: StorageManager.__dict__[name] for name in names} == wrapped
    hook.uninstrument()
    hook.uninstrument()
    assert {name: StorageManager.__dict__[name] for name in names} == originals
    assert READ_IN_PLACE == []
    assert ChunkedTokenDatabase.__dict__["process_tokens"] is tokens_original
    assert {name: LMCacheEngine.__dict__[name] for name in engine_originals} == engine_originals
    assert not hook.is_instrumented()

    real_version = lmcache.__version__
    lmcache.__version__ = "0.4.2"
    try:
        with caplog.at_level("ERROR"):
            assert not hook.instrument(replica="old")
    finally:
        lmcache.__version__ = real_version
    assert not hook.is_instrumented()
    assert [r.getMessage() for r in caplog.records if "kvaudit" in r.getMessage()] == [
        "kvaudit: LMCache 0.4.2 is not supported (supported: 0.5.6); LMCache hooks not installed"
    ]
    assert StorageManager.__dict__["batched_get"] is originals["batched_get"]


def test_single_key_paths_are_recorded_and_lmcache_errors_pass_through(tmp_path: Path) -> None:
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    from kvaudit.hooks import lmcache as hook
    from kvaudit.hooks.lmcache.pages import READ_IN_PLACE, object_facts, size_of
    from kvaudit.hooks.lmcache.testing import cpu_engine

    assert hook.instrument(replica="single", export=f"file:{tmp_path}/single.jsonl")
    engine = cpu_engine("single", **GEOMETRY_R1, storage_plugins=[hook.PLUGIN_NAME], extra_config=hook.plugin_config())
    try:
        tokens = list(range(TOKENS))
        engine.store(tokens, kvcache=torch.ones(2, 2, TOKENS, 2, 16, dtype=torch.bfloat16))
        first = next(key for _, _, key in engine.token_database.process_tokens(tokens))
        obj = engine.storage_manager.get(first)
        assert obj is not None
        # Its facts, read off its metadata in place, are what its getters return.
        assert type(obj) in READ_IN_PLACE
        facts = object_facts(obj)
        read = (facts.dtype, facts.shape, facts.memory_format, size_of(facts))
        assert read == (obj.get_dtype(), obj.get_shape(), obj.get_memory_format(), obj.get_size())
        obj.ref_count_down()
        # LMCache's local CPU tier has no non-blocking get: its own error must reach the caller.
        with pytest.raises(NotImplementedError):
            engine.storage_manager.get_non_blocking(first, "LocalCPUBackend")
        # The layerwise path: one future per layer, described when it finishes.
        keys = [key for _, _, key in engine.token_database.process_tokens(tokens)][:2]
        [future] = list(engine.storage_manager.layerwise_batched_get([keys]))
        described = threading.Event()
        future.add_done_callback(lambda _: described.set())  # runs after the hook's own callback
        for obj in future.result(timeout=10):
            obj.ref_count_down()
        assert described.wait(10)
    finally:
        LMCacheEngineBuilder.destroy("single")
        hook.uninstrument()

    store = TraceStore([tmp_path])
    store.refresh()
    _, spans = store.query("SELECT op, outcome, pages, backend FROM spans WHERE op = 'fetch' ORDER BY start_ns")
    assert spans == [
        ("fetch", "hit", 1, "lmcache"),
        ("fetch", "error", 0, "lmcache.local_cpu"),
        ("fetch", "hit", 2, "lmcache.local_cpu"),
    ]
    _, pages = store.query("SELECT token_start, token_end, used, tier FROM pages WHERE op = 'fetch' ORDER BY time_ns")
    assert pages == [(0, 256, True, None), (0, 256, True, "cpu"), (256, 512, True, "cpu")]
    store.close()


def test_without_the_guard_a_chunk_after_a_missing_one_is_fetched_but_not_used(tmp_path: Path) -> None:
    """LMCache uses a prefix: an object it got after one it did not is described, and unused."""
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from opentelemetry.trace import SpanContext

    from kvaudit.hooks import lmcache as hook
    from kvaudit.hooks.lmcache import runtime
    from kvaudit.hooks.lmcache.links import LINKS, Link
    from kvaudit.hooks.lmcache.testing import cpu_engine

    assert hook.instrument(replica="gap", export=f"file:{tmp_path}/gap.jsonl")
    engine = cpu_engine("gap", **GEOMETRY_R1, storage_plugins=[hook.PLUGIN_NAME], extra_config=hook.plugin_config())
    told: list[Any] = []
    try:
        tokens = list(range(TOKENS))
        engine.store(tokens, kvcache=torch.ones(2, 2, TOKENS, 2, 16, dtype=torch.bfloat16))
        keys = [key for _, _, key in engine.token_database.process_tokens(tokens)]
        assert len(keys) == 3
        assert engine.storage_manager.storage_backends["LocalCPUBackend"].remove(keys[1])
        # A layer above (the vLLM hook) follows the request: it is told every requested chunk.
        LINKS.put("gap-engine-id", Op.FETCH, Link("gap-request", SpanContext(1, 2, False), told.append))
        request = runtime.REQUEST_ID.set("gap-engine-id")
        try:
            objs = engine.storage_manager.batched_get(keys, "LocalCPUBackend")
        finally:
            runtime.REQUEST_ID.reset(request)
        assert [obj is not None for obj in objs] == [True, False, True]
        for obj in objs:
            if obj is not None:
                obj.ref_count_down()
    finally:
        LMCacheEngineBuilder.destroy("gap")
        hook.uninstrument()
        LINKS.clear()

    (report,) = told
    assert not report.all_used
    assert [(page.token_start, page.used) for page in report] == [(0, True), (256, False), (512, False)]
    store = TraceStore([tmp_path])
    store.refresh()
    _, spans = store.query(
        "SELECT request_id, outcome, tokens_hit, pages FROM spans WHERE op = 'fetch' AND request_id = 'gap-request'"
    )
    assert spans == [("gap-request", "partial", 256, 2)]
    # The span's pages are the objects LMCache got: the missing chunk is not among them.
    _, pages = store.query(
        "SELECT token_start, used, dtype IS NOT NULL FROM pages WHERE op = 'fetch' AND request_id = 'gap-request' "
        "ORDER BY token_start"
    )
    assert pages == [(0, True, True), (512, False, True)]
    store.close()


def test_the_plugin_alone_switches_the_hooks_on_from_lmcache_config(tmp_path: Path) -> None:
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    from kvaudit.hooks import lmcache as hook
    from kvaudit.hooks.lmcache.testing import cpu_engine

    assert not hook.is_instrumented()
    config = hook.plugin_config(replica="from-config", export=f"file:{tmp_path}/auto.jsonl", guard=True)
    engine = cpu_engine("auto", **GEOMETRY_R1, storage_plugins=[hook.PLUGIN_NAME], extra_config=config)
    try:
        assert hook.is_instrumented()
        tokens = list(range(TOKENS))
        kv = torch.ones(2, 2, TOKENS, 2, 16, dtype=torch.bfloat16)
        engine.store(tokens, kvcache=kv)
        assert int(engine.retrieve(tokens, kvcache=torch.zeros_like(kv)).sum()) == STORED
    finally:
        LMCacheEngineBuilder.destroy("auto")
        hook.uninstrument()
    store = TraceStore([tmp_path])
    store.refresh()
    _, rows = store.query("SELECT replica, op, count(*) FROM pages GROUP BY ALL ORDER BY op")
    # Destroying the engine removes its pages (evictions).
    assert rows == [("from-config", "evict", 3), ("from-config", "fetch", 3), ("from-config", "store", 3)]
    store.close()


def _page(**fields: Any) -> PageDescriptor:
    """A fetched page as LMCache's remote backends deliver it: everything but the head split."""
    page = PageDescriptor(
        key="00ff",
        hash_algo="builtin",
        token_start=0,
        token_end=256,
        model="tiny",
        dtype="bfloat16",
        shape=(2, 2, 256, 32),
        layout="KV_2LTD",
        bytes=2 * 2 * 256 * 32 * 2,
        world_size=1,
        rank=0,
        layers=2,
        used=True,
        transfer="copy",
    )
    return msgspec.structs.replace(page, **fields)


@pytest.mark.parametrize(
    ("fields", "stored", "expected"),
    [
        ({}, None, []),
        ({"shape": None, "dtype": None}, None, ["KVA001 dtype", "KVA001 shape"]),
        ({"address": 1234}, None, ["KVA002 address"]),
        ({"transfer": "raw_ptr"}, None, ["KVA002 address"]),
        ({"bytes": 1000}, None, ["KVA003 bytes"]),
        ({"dtype": "float16"}, None, ["KVA005 dtype"]),
        ({"model": "other"}, None, ["KVA005 model"]),
        ({"shape": (2, 2, 256, 64), "bytes": 2 * 2 * 256 * 64 * 2}, None, ["KVA005 shape"]),
        ({}, {"kv_heads": 4, "head_size": 8}, ["KVA005 kv_heads", "KVA005 head_size"]),
        ({"checksum": "xxh3_64:1"}, {"checksum": "xxh3_64:2"}, ["KVA004 checksum"]),
        ({"checksum": "xxh3_64:1"}, {"checksum": "xxh3_64:1", "kv_heads": 2, "head_size": 16}, []),
    ],
)
def test_guard_checks(fields: dict[str, Any], stored: dict[str, Any] | None, expected: list[str]) -> None:
    from kvaudit.contract import KVConfig
    from kvaudit.guard import violations

    consumer = KVConfig(
        model="tiny",
        dtype="bfloat16",
        layout="KV_2LTD",
        world_size=1,
        rank=0,
        hash_algo="builtin",
        layers=2,
        kv_heads=2,
        head_size=16,
    )
    producer = PageDescriptor(**stored) if stored is not None else None
    expected_page = PageDescriptor.from_config(consumer, shape=(2, 2, 256, 32))
    assert violations(_page(**fields), expected_page, producer) == expected


def test_a_failing_hook_leaves_lmcache_serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    from kvaudit.hooks import lmcache as hook
    from kvaudit.hooks.lmcache import fetch, plugin, runtime
    from kvaudit.hooks.lmcache.testing import cpu_engine

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("describing failed")

    monkeypatch.setattr(fetch, "fetch_page", broken)
    monkeypatch.setattr(plugin, "objects_facts", broken)
    before = runtime.failures()
    assert hook.instrument(replica="broken", export=f"file:{tmp_path}/broken.jsonl", guard=True)
    engine = cpu_engine("broken", **GEOMETRY_R1, storage_plugins=[hook.PLUGIN_NAME], extra_config=hook.plugin_config())
    try:
        tokens = list(range(TOKENS))
        kv = torch.randn(2, 2, TOKENS, 2, 16).to(torch.bfloat16)
        engine.store(tokens, kvcache=kv)
        out = torch.zeros_like(kv)
        assert int(engine.retrieve(tokens, kvcache=out).sum()) == STORED
        assert torch.equal(out[:, :, :STORED], kv[:, :, :STORED])
    finally:
        LMCacheEngineBuilder.destroy("broken")
        hook.uninstrument()
    assert runtime.failures() == before + 2  # one store, one fetch


def test_prevent_tag_is_rank_zeros_fingerprint_on_every_rank() -> None:
    # Tensor parallelism without a second device: LMCache's own token databases for the two
    # ranks of one engine, as each worker builds its own.
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.token_database import ChunkedTokenDatabase

    from kvaudit.hooks.lmcache import prevent, runtime

    config = LMCacheEngineConfig.from_defaults(chunk_size=256)

    def rank(worker: int) -> ChunkedTokenDatabase:
        metadata = LMCacheMetadata(
            model_name="tiny",
            world_size=2,
            local_world_size=2,
            worker_id=worker,
            local_worker_id=worker,
            kv_dtype=torch.bfloat16,
            kv_shape=(2, 2, 256, 2, 16),
            chunk_size=256,
        )
        return ChunkedTokenDatabase(config, metadata)

    first, second = rank(0), rank(1)
    # Each rank declares its own geometry; the keys of both carry rank 0's, as the vLLM hook's
    # one tag for a whole request does (a key names its worker already).
    declared = [runtime.geometry_of(config, db.metadata, first_rank_only=False) for db in (first, second)]
    assert declared[0] != declared[1]
    assert prevent.fingerprint_of(first) == prevent.fingerprint_of(second) == declared[0]
