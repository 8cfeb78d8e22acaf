import re

import msgspec

from kvaudit import contract
from kvaudit.analyse.named_queries import load
from kvaudit.contract import (
    CONSUMER_FIELDS,
    PAGE_COLUMNS,
    REQUIRED_ON_FETCH,
    REQUIRED_ON_STORE,
    RESOURCE_COLUMNS,
    SPAN_COLUMNS,
    STORED_FIELDS,
    Kind,
    KVConfig,
    PageAttr,
    PageDescriptor,
    Res,
    SpanAttr,
    Transfer,
)

from ..support.pages import full_page


def test_every_descriptor_field_has_one_attribute_name():
    names = [getattr(PageAttr, field.upper()) for field in PageDescriptor.__struct_fields__]
    assert len(set(names)) == len(names) == len(PageDescriptor.__struct_fields__)
    assert all(name.startswith("kvaudit.page.") for name in names)


def test_descriptor_round_trips_through_attributes():
    page = full_page("ab" * 32, 3, used=True)
    attrs = page.to_attributes()
    assert attrs[PageAttr.SHAPE] == (2, 2, 32, 64)
    assert PageDescriptor.from_attributes(attrs) == page


def test_absent_fields_are_absent_attributes():
    page = PageDescriptor(key="k", used=False, address=7)
    assert page.to_attributes() == {PageAttr.KEY: "k", PageAttr.USED: False, PageAttr.ADDRESS: 7}
    assert set(page.missing(REQUIRED_ON_FETCH)) == REQUIRED_ON_FETCH - {"key", "used"}


def test_required_sets_follow_the_design():
    assert "used" in REQUIRED_ON_FETCH and "used" not in REQUIRED_ON_STORE
    assert {"layers", "kv_heads", "head_size"} <= REQUIRED_ON_STORE
    assert "checksum" not in REQUIRED_ON_FETCH


def test_kv_config_resource_attributes():
    attrs = KVConfig(model="m", layers=2).to_attributes()
    assert attrs == {Res.KV_MODEL: "m", Res.KV_LAYERS: 2}


def test_dtype_sizes():
    assert contract.bytes_per_element("torch.bfloat16") == 2
    assert contract.bytes_per_element("float8_e4m3fn") == 1
    assert contract.bytes_per_element("complex-thing") is None


def _rule(name: str) -> str:
    return load(f"audit/{name}")


def test_the_audit_rules_check_the_contracts_fields():
    """The rules are SQL and the guard is Python: both read their field lists from the contract's."""
    missing = re.findall(r"CASE WHEN (\w+) IS NULL THEN '(\w+)' END", _rule("kva001_incomplete_metadata"))
    assert all(column == name for column, name in missing)
    assert {name for _, name in missing} == REQUIRED_ON_FETCH
    stored = re.findall(r"coalesce\((\w+) <> s_\1, false\) AS d_\1", _rule("kva004_store_fetch_mismatch"))
    assert tuple(stored) == STORED_FIELDS
    consumer = re.findall(r"coalesce\((\w+) <> c_\1, false\) OR", _rule("kva005_incompatible_consumer"))
    assert tuple(consumer) == CONSUMER_FIELDS
    assert f"transfer = '{Transfer.RAW_PTR}'" in _rule("kva002_process_local_reference")


def test_the_views_columns_come_from_the_records():
    assert [name for name in PAGE_COLUMNS] == list(PageDescriptor.__struct_fields__)
    assert {column: kind for column, (_, kind) in PAGE_COLUMNS.items()}["shape"] is Kind.INTS
    assert set(KVConfig.__struct_fields__) <= set(RESOURCE_COLUMNS)
    assert SPAN_COLUMNS["request_id"] == (SpanAttr.REQUEST_ID, Kind.STR)


def test_a_page_from_a_config_carries_the_config_and_nothing_else():
    kv = KVConfig(model="m", dtype="bfloat16", layout="L", block_size=16, world_size=2, rank=1, hash_algo="sha256")
    page = PageDescriptor.from_config(kv, key="k", shape=(1, 2))
    assert (page.model, page.dtype, page.layout, page.world_size, page.rank, page.hash_algo) == (
        "m", "bfloat16", "L", 2, 1, "sha256",
    )  # fmt: skip
    assert (page.key, page.shape, page.used, page.token_start) == ("k", (1, 2), None, None)


_REPLICA = KVConfig(
    model="m",
    dtype="bfloat16",
    layout="KV_2LTD",
    block_size=256,
    world_size=2,
    rank=0,
    hash_algo="sha256",
    layers=2,
    kv_heads=2,
    head_size=16,
)


def test_prevent_fingerprint_is_stable_and_equal_where_pages_can_be_shared():
    fingerprint = contract.geometry_fingerprint(_REPLICA)
    # Pinned: the recipe is documented (docs/design.md section 4.5) and replicas of
    # different kvaudit releases must agree, so a change to it must be deliberate.
    assert fingerprint == "61af728e2f8dfe97"
    assert re.fullmatch(r"[0-9a-f]{16}", fingerprint)
    # The hash algorithm decides the keys themselves; a torch-spelled dtype is the same dtype.
    same = msgspec.structs.replace(_REPLICA, hash_algo="builtin", dtype="torch.bfloat16")
    assert contract.geometry_fingerprint(same) == fingerprint


def test_prevent_fingerprint_differs_on_every_geometry_field():
    fingerprint = contract.geometry_fingerprint(_REPLICA)
    changed = {
        "model": "other",
        "dtype": "float16",
        "layout": "KV_2TD",
        "layers": 3,
        "kv_heads": 4,
        "head_size": 8,
        "block_size": 16,
        "world_size": 1,
        "rank": 1,
    }
    assert set(changed) == set(contract.GEOMETRY_FIELDS)
    others = {contract.geometry_fingerprint(msgspec.structs.replace(_REPLICA, **{k: v})) for k, v in changed.items()}
    others.add(contract.geometry_fingerprint(_REPLICA, format_version="2"))
    others.add(contract.geometry_fingerprint(msgspec.structs.replace(_REPLICA, layout=None)))
    assert fingerprint not in others and len(others) == len(changed) + 2


def test_prevent_fingerprint_in_the_resource_and_on_the_pages_a_replica_stores():
    declared = _REPLICA.with_geometry()
    assert declared.geometry == contract.geometry_fingerprint(_REPLICA)
    # Declaring it changes nothing it is computed from.
    assert contract.geometry_fingerprint(declared) == declared.geometry
    assert declared.to_attributes()[contract.Res.KV_GEOMETRY] == declared.geometry
    page = contract.PageDescriptor.from_config(declared, key="k")
    assert page.to_attributes()[contract.PageAttr.GEOMETRY] == declared.geometry
    assert contract.RESOURCE_COLUMNS["geometry"] == (contract.Res.KV_GEOMETRY, contract.Kind.STR)
    assert contract.PAGE_COLUMNS["geometry"] == (contract.PageAttr.GEOMETRY, contract.Kind.STR)
