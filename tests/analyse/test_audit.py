"""The auditor against hand-built traces with known answers, rule by rule."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from kvaudit.analyse.audit import SEVERITY_ORDER, Finding, rule_queries, run_audit
from kvaudit.cli import main
from kvaudit.contract import REQUIRED_ON_FETCH, Hook, KVConfig, Op, PageDescriptor

from ..support.fleet import Fleet, page
from ..support.pages import KV


@pytest.fixture
def fleet(trace_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    return Fleet(trace_dir, monkeypatch)


def _audit(fleet: Fleet, skew_s: float = 1.0) -> list[Finding]:
    store = fleet.open()
    try:
        return run_audit(store, skew_s=skew_s)
    finally:
        store.close()


def _codes(findings: list[Finding]) -> list[tuple[str, str]]:
    return sorted((f.code, f.severity) for f in findings)


def test_one_rule_file_per_code():
    assert [name.split("/")[1][:6] for name in rule_queries()] == [f"kva00{n}" for n in range(1, 9)]


def test_a_clean_cross_replica_fetch_has_no_findings(fleet: Fleet):
    r1, r2 = fleet.replica("r1"), fleet.replica("r2")
    fleet.at(0).store(r1, [page("a", 0), page("b", 1)])
    fleet.at(5).fetch(r2, [page("a", 0, used=True), page("b", 1, used=True)])
    assert _audit(fleet) == []


def test_kva001_each_required_field_alone(fleet: Fleet):
    r1, r2 = fleet.replica("r1"), fleet.replica("r2")
    fields = sorted(REQUIRED_ON_FETCH)
    fleet.at(0).store(r1, [page(f"k{i}", i) for i in range(len(fields))])
    lacking = [msgspec.structs.replace(page(f"k{i}", i, used=False), **{field: None}) for i, field in enumerate(fields)]
    fleet.at(1).fetch(r2, lacking)
    findings = _audit(fleet)
    assert {f.code for f in findings} == {"KVA001"}
    by_field = {f.fields[0]: f for f in findings}
    assert sorted(by_field) == fields and all(len(f.fields) == 1 for f in findings)
    for field, finding in by_field.items():
        assert finding.rule == "incomplete-metadata" and finding.replica == "r2" and field in finding.message
        # Rejected is a safe miss (warning); without `used` it cannot be shown to be one.
        assert finding.severity == ("critical" if field == "used" else "warning")
        assert finding.producer == (None if field == "key" else "r1")


def test_kva002_raw_pointer_from_another_replica_and_a_bare_page(fleet: Fleet):
    r1, r2 = fleet.replica("r1"), fleet.replica("r2")
    fleet.at(0).store(r1, [page("a", 0, address=0x7F0000001000), page("b", 1)])
    bare = PageDescriptor(key="b", used=True, transfer="raw_ptr", address=0x7F00DEAD0000)
    fleet.at(1).fetch(r2, [page("a", 0, used=True, address=0x7F0000001000), bare])
    findings = _audit(fleet)
    assert _codes(findings) == [("KVA001", "critical"), ("KVA002", "critical"), ("KVA002", "critical")]
    kva002 = [f for f in findings if f.code == "KVA002"]
    assert {f.key for f in kva002} == {"a", "b"}
    assert all(f.producer == "r1" and f.fields["replica"] == {"stored": "r1", "consumer": "r2"} for f in kva002)


def test_kva002_not_for_an_address_the_consumers_own_process_stored(fleet: Fleet):
    r1 = fleet.replica("r1")
    fleet.at(0).store(r1, [page("a", address=0x7F0000001000)])
    fleet.at(1).fetch(r1, [page("a", used=True, address=0x7F0000001000, transfer="raw_ptr")])
    assert _audit(fleet) == []


def test_kva002_for_another_process_of_the_same_replica(fleet: Fleet):
    worker, server = fleet.replica("r1", engine="vllm"), fleet.replica("r1", engine="lmcache")
    fleet.at(0).store(server, [page("a")])
    fleet.at(1).fetch(worker, [page("a", used=False, transfer="raw_ptr")])
    [finding] = _audit(fleet)
    assert (finding.code, finding.severity, finding.producer) == ("KVA002", "warning", "r1")
    assert "another process" in finding.message


def test_kva002_without_a_producer_is_info_beside_the_orphan(fleet: Fleet):
    r2 = fleet.replica("r2")
    fleet.at(1).fetch(r2, [page("a", used=True, address=0x7F0000001000)])
    assert _codes(_audit(fleet)) == [("KVA002", "info"), ("KVA006", "info")]


def test_kva003_bytes_against_shape_and_dtype(fleet: Fleet):
    r1, r2 = fleet.replica("r1"), fleet.replica("r2")
    pages = [page("a", 0), page("b", 1), page("c", 2), page("d", 3)]
    fleet.at(0).store(r1, pages)
    fetched = [
        page("a", 0, used=True, bytes=1000),  # also differs from the store: KVA004
        page("b", 1, used=True, dtype="torch.bfloat16"),  # torch's spelling, right size
        page("c", 2, used=True, dtype="mystery8"),  # unknown size: not checked here
        page("d", 3, used=True, shape=(2, 2, 32, 32)),
    ]
    fleet.at(1).fetch(r2, fetched)
    by_key = {(f.code, f.key): f for f in _audit(fleet)}
    assert by_key[("KVA003", "a")].fields["bytes"] == {"fetched": 1000, "expected": 16384}
    assert by_key[("KVA003", "d")].fields["bytes"] == {"fetched": 16384, "expected": 8192}
    assert not any(code == "KVA003" and key in "bc" for code, key in by_key)


def test_kva004_compares_with_the_producer_only_where_both_sides_have_the_field(fleet: Fleet):
    r1, r2, r3 = fleet.replica("r1"), fleet.replica("r2"), fleet.replica("r3")
    fleet.at(0).store(r1, [page("a", 0), page("b", 1), page("c", 2, checksum=None)])
    fleet.at(10).store(r3, [page("a", 0, layout="NB_2_BS_NH_HS")])  # later: never the producer
    fleet.at(20).fetch(
        r2,
        [
            page("a", 0, used=True, checksum="xxh3_64:ffff"),
            page("b", 1, used=True, layout=None),  # absent on the fetch: KVA001 only
            page("c", 2, used=True, checksum="xxh3_64:1234"),  # absent on the store: nothing
        ],
    )
    findings = _audit(fleet)
    assert _codes(findings) == [("KVA001", "critical"), ("KVA004", "critical")]
    kva004 = next(f for f in findings if f.code == "KVA004")
    assert (kva004.key, kva004.producer) == ("a", "r1")
    assert kva004.fields == {"checksum": {"fetched": "xxh3_64:ffff", "stored": "xxh3_64:0123456789abcdef"}}


def test_producer_is_the_earliest_store_within_the_skew(fleet: Fleet):
    r1, r2, r3 = fleet.replica("r1"), fleet.replica("r2"), fleet.replica("r3")
    fleet.at(10.5).store(r1, [page("a", checksum="xxh3_64:aaaa")])
    fleet.at(12).store(r3, [page("a")])
    fleet.at(10).fetch(r2, [page("a", used=True)])  # r1's clock runs 0.5 s ahead
    [finding] = _audit(fleet, skew_s=1.0)
    assert (finding.code, finding.producer) == ("KVA004", "r1")
    # Without that skew the store came after the fetch: no producer, but not an orphan either.
    assert _audit(fleet, skew_s=0.1) == []


def test_kva005_rolling_upgrade_caught_through_the_producers_descriptor(fleet: Fleet):
    upgraded = msgspec.structs.replace(KV, layout="NB_2_BS_NH_HS")
    r1, r2 = fleet.replica("r1"), fleet.replica("r2", upgraded)
    fleet.at(0).store(r1, [page("a")])
    # The fetched object did not carry its layout: KVA001, and the stored side says it differs.
    fleet.at(1).fetch(r2, [page("a", used=True, layout=None)])
    findings = _audit(fleet)
    assert _codes(findings) == [("KVA001", "critical"), ("KVA005", "critical")]
    kva005 = next(f for f in findings if f.code == "KVA005")
    assert kva005.fields == {"layout": {"fetched": None, "stored": "NB_NH_BS_2HS", "consumer": "NB_2_BS_NH_HS"}}


def test_kva005_head_geometry_and_rank_of_the_fetched_page(fleet: Fleet):
    r1, r2 = fleet.replica("r1"), fleet.replica("r2", KVConfig(model="tiny-llama", kv_heads=4, rank=1))
    fleet.at(0).store(r1, [page("a")])
    fleet.at(1).fetch(r2, [page("a", used=False)])
    [finding] = _audit(fleet)
    assert (finding.code, finding.severity) == ("KVA005", "warning")
    assert finding.fields == {
        "kv_heads": {"fetched": 2, "stored": 2, "consumer": 4},
        "rank": {"fetched": 0, "stored": 0, "consumer": 1},
    }


def test_kva008_geometry_of_the_stored_or_the_fetched_page_against_the_consumers(fleet: Fleet):
    # Another block size only: nothing KVA005 compares, everything the fingerprint covers.
    old, new = KV.with_geometry(), msgspec.structs.replace(KV, block_size=16).with_geometry()
    assert old.geometry != new.geometry
    r1, r2 = fleet.replica("r1", old), fleet.replica("r2", new)
    fleet.at(0).store(r1, [page("a", 0, geometry=old.geometry), page("b", 1, geometry=old.geometry), page("c", 2)])
    fleet.at(1).fetch(
        r2,
        [
            page("a", 0, used=True),  # the fetched object carried none: the producer's store says it
            page("b", 1, used=False, geometry=old.geometry),  # the guard refused it: a safe miss
            page("c", 2, used=True),  # an older producer, no fingerprint anywhere: not compared
        ],
    )
    findings = _audit(fleet)
    assert [(f.code, f.severity, f.key) for f in findings] == [("KVA008", "critical", "a"), ("KVA008", "warning", "b")]
    a, b = findings
    assert (a.rule, a.producer) == ("geometry-mismatch", "r1")
    assert a.fields == {"geometry": {"fetched": None, "stored": old.geometry, "consumer": new.geometry}}
    assert b.fields["geometry"]["fetched"] == old.geometry
    assert a.message == f"page of geometry {old.geometry} fetched by r2 of geometry {new.geometry}"


def test_kva008_not_for_the_same_fingerprint_nor_a_consumer_without_one(fleet: Fleet):
    kv = KV.with_geometry()
    r1, r2, r3 = fleet.replica("r1", kv), fleet.replica("r2", kv), fleet.replica("r3")
    fleet.at(0).store(r1, [page("a", geometry=kv.geometry)])
    fleet.at(1).fetch(r2, [page("a", used=True, geometry=kv.geometry)])
    fleet.at(2).fetch(r3, [page("a", used=True, geometry="0123456789abcdef")])  # r3 declares none
    assert _audit(fleet) == []


def test_kva006_orphan_is_info(fleet: Fleet):
    r2 = fleet.replica("r2")
    fleet.at(1).fetch(r2, [page("a", used=True)])
    [finding] = _audit(fleet)
    assert (finding.code, finding.rule, finding.severity, finding.producer) == (
        "KVA006",
        "orphan-fetch",
        "info",
        None,
    )


def test_kva007_unreadable_lines_dropped_events_and_emitter_errors(fleet: Fleet, trace_dir: Path):
    r1 = fleet.replica("r1", max_pages_per_span=2)
    fleet.at(0).store(r1, [page("a", 0), page("b", 1), page("c", 2)])
    broken = r1.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR)
    broken.add_page("not a descriptor")  # type: ignore[arg-type]
    broken.end()
    store = fleet.open()
    store.close()
    with (trace_dir / "r1-vllm.jsonl").open("ab") as f:
        f.write(b"not json\n")
    store = fleet.open()
    findings = run_audit(store)
    assert {f.code for f in findings} == {"KVA007"} and all(f.severity == "warning" for f in findings)
    by_kind = {next(iter(f.fields)): f for f in findings}
    assert by_kind["reason"].file.endswith("r1-vllm.jsonl") and by_kind["reason"].line is not None
    assert by_kind["dropped_events"].fields["dropped_events"] == 1 and by_kind["dropped_events"].span_id
    assert by_kind["dropped_spans"].fields["errors"] == 1 and by_kind["dropped_spans"].replica == "r1"
    assert by_kind["dropped_spans"].fields["lost_batches"] == 0


def test_kva007_lost_kv_event_batches(fleet: Fleet):
    r1 = fleet.replica("r1")
    fleet.at(0).store(r1, [page("a", 0)])
    r1.count_lost_batches(3)  # the KV events subscriber saw a gap in the engine's sequence numbers
    [finding] = run_audit(fleet.open())
    assert (finding.code, finding.replica, finding.fields["lost_batches"]) == ("KVA007", "r1", 3)
    assert finding.message.endswith("3 lost KV event batches")


def test_findings_are_sorted_critical_first(fleet: Fleet):
    r1, r2 = fleet.replica("r1"), fleet.replica("r2")
    fleet.at(0).store(r1, [page("a")])
    fleet.at(1).fetch(r2, [page("z", used=True), page("a", used=False, model="other"), page("y", used=True, rank=3)])
    order = [SEVERITY_ORDER[f.severity] for f in _audit(fleet)]
    assert order == sorted(order) and order[0] == 0


def test_cli_exit_status_and_json(fleet: Fleet, trace_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    r1, r2 = fleet.replica("r1"), fleet.replica("r2")
    fleet.at(0).store(r1, [page("a")])
    fleet.at(1).fetch(r2, [page("a", used=True, dtype="float16"), page("o", used=True)])
    fleet.open().close()
    assert main(["audit", str(trace_dir), "--format", "json", "--skew", "500ms"]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["code"] for line in lines] == ["KVA004", "KVA005", "KVA006"]
    for key in ("code", "severity", "replica", "key", "trace_id", "span_id", "fields", "message", "file", "line"):
        assert key in lines[0]
    assert lines[0]["fields"]["dtype"] == {"fetched": "float16", "stored": "bfloat16"}
    assert main(["audit", str(trace_dir)]) == 1
    out = capsys.readouterr().out
    assert "critical KVA004 store-fetch-mismatch (1)" in out and "info KVA006 orphan-fetch (1)" in out
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["audit", str(empty)]) == 2
    assert main(["audit", str(tmp_path / "nothing")]) == 2
    with pytest.raises(SystemExit):
        main(["audit", str(trace_dir), "--skew", "soon"])


def test_audit_of_an_ingested_database(fleet: Fleet, trace_dir: Path, tmp_path: Path):
    r1, r2 = fleet.replica("r1"), fleet.replica("r2")
    fleet.at(0).store(r1, [page("a")])
    fleet.at(1).fetch(r2, [page("a", used=True, rank=1)])
    fleet.open().close()
    database = tmp_path / "traces.duckdb"
    assert main(["ingest", "-q", str(trace_dir), "-o", str(database)]) == 0
    assert main(["audit", str(database)]) == 1
