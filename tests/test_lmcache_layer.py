"""The pieces that join the vLLM layer to the LMCache layer in one worker (docs/design.md section 6.4).

The whole path runs in tests/test_seed_topology.py on real engines; these are the
rules it rests on, each alone: where the LMCache layer's traces go, which chunk a block
names, and how LMCache's hooks find the vLLM operation they run under.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm is installed by scripts/install-vllm.sh")

from opentelemetry.trace import INVALID_SPAN_CONTEXT

from kvaudit.contract import Op, PageDescriptor
from kvaudit.hooks.lmcache.links import _MAX_LINKS, Link, Links
from kvaudit.hooks.vllm.lmcache_layer import LayerSettings, LMCacheUnit, layer_export
from kvaudit.hooks.vllm.settings import AuditSettings

# LMCache sets up OpenTelemetry logging through a handler the SDK deprecates: not ours.
pytestmark = pytest.mark.filterwarnings("ignore:.*LoggingHandler.*:DeprecationWarning")
SETTINGS = AuditSettings(wrap="LMCacheConnectorV1", replica="r1", export="file:traces/r1.jsonl")


@pytest.mark.parametrize(
    ("export", "expected"),
    [
        ("file:traces/r1.jsonl", "file:traces/r1.lmcache.jsonl"),
        ("file:traces/r1", "file:traces/r1.lmcache"),
        ("file:traces.d/r1", "file:traces.d/r1.lmcache"),
        ("otlp:http://collector:4318", "otlp:http://collector:4318"),
        (None, None),
    ],
)
def test_the_lmcache_layer_writes_beside_the_vllm_layer(export: str | None, expected: str | None):
    assert layer_export(export) == expected


def test_layer_settings_from_the_one_kvaudit_section():
    extra = {"kvaudit": {"lmcache": {"registry": "/shared/registry", "checksum_rate": "0.25"}}}
    layer = LayerSettings.from_extra_config(extra, SETTINGS)
    assert layer == LayerSettings(
        export="file:traces/r1.lmcache.jsonl", registry="/shared/registry", checksum_rate=0.25
    )
    assert LayerSettings.from_extra_config({"kvaudit": {}}, SETTINGS).registry is None
    with pytest.raises(ValueError, match="must be a dict"):
        LayerSettings.from_extra_config({"kvaudit": {"lmcache": "yes"}}, SETTINGS)
    with pytest.raises(ValueError, match="checksum_rate"):
        LayerSettings.from_extra_config({"kvaudit": {"lmcache": {"checksum_rate": "often"}}}, SETTINGS)


def _block(index: int) -> PageDescriptor:
    return PageDescriptor(key=f"b{index}", token_start=index * 32, token_end=(index + 1) * 32)


def test_each_block_names_the_chunk_holding_its_last_token():
    unit = LMCacheUnit(pages=[_block(i) for i in range(10)])
    first = PageDescriptor(key="c0", token_start=0, token_end=256, used=True)
    unit.tell([first])
    assert [p.source_key for p in unit.pages] == ["c0"] * 8 + [None, None]
    # A later report (LMCache's next call for the request) names the rest.
    unit.tell([PageDescriptor(key="c1", token_start=256, token_end=512, used=False)])
    assert [(p.source_key, p.used) for p in unit.pages[7:]] == [("c0", True), ("c1", False), ("c1", False)]


def test_links_find_the_operation_above_by_engine_request_id_and_op():
    links = Links()
    told: list[list[PageDescriptor]] = []
    link = Link("client-7", INVALID_SPAN_CONTEXT, told.append)
    links.put("client-7-0a1b2c3d", Op.FETCH, link)
    assert links.get("client-7-0a1b2c3d", Op.FETCH) is link
    assert links.get("client-7-0a1b2c3d", Op.STORE) is None
    assert links.get(None, Op.FETCH) is None
    assert links.request_id("client-7-0a1b2c3d", link) == "client-7"
    # Unlinked (a lookup): the engine's id, renamed as the layer above names requests.
    assert links.request_id("client-8-0a1b2c3d", None) == "client-8-0a1b2c3d"
    links.rename = lambda engine_id: engine_id.rsplit("-", 1)[0]
    assert links.request_id("client-8-0a1b2c3d", None) == "client-8"
    links.clear()
    assert links.get("client-7-0a1b2c3d", Op.FETCH) is None and links.rename is None


def test_links_are_bounded():
    links = Links()
    for index in range(_MAX_LINKS + 1):
        links.put(str(index), Op.STORE, Link(str(index), INVALID_SPAN_CONTEXT, lambda pages: None))
    assert links.get("0", Op.STORE) is None
    assert links.get(str(_MAX_LINKS), Op.STORE) is not None
