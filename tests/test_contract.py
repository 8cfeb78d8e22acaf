from kvaudit import contract
from kvaudit.contract import REQUIRED_ON_FETCH, REQUIRED_ON_STORE, KVConfig, PageAttr, PageDescriptor, Res

from .conftest import full_page


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
