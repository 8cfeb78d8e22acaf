"""The pieces that join the vLLM layer to the LMCache layer in one worker (docs/design.md section 6.4).

The whole path runs in tests/hooks/test_reference_deployment.py on real engines; these are the
rules it rests on, each alone: where the LMCache layer's traces go, which chunk a block
names, and how LMCache's hooks find the vLLM operation they run under.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is installed by scripts/install-vllm.sh")

from opentelemetry.trace import INVALID_SPAN_CONTEXT

from kvaudit.contract import Op, PageDescriptor
from kvaudit.hooks.lmcache.links import _MAX_LINKS, LazyPages, Link, Links
from kvaudit.hooks.vllm.lmcache_layer import LayerSettings, LMCacheUnit, layer_export, name_sources
from kvaudit.hooks.vllm.settings import AuditSettings, inner_transfer_config

from ...support import ROOT

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


def test_a_misspelt_option_is_named_not_dropped_silently(caplog: pytest.LogCaptureFixture):
    extra = {"kvaudit": {"wrap": "LMCacheConnectorV1", "replica": "r1", "gaurd": True, "lmcache": {"registy": "/r"}}}
    with caplog.at_level(logging.WARNING, logger="kvaudit.hooks.vllm.settings"):
        settings = AuditSettings.from_extra_config(extra)
        LayerSettings.from_extra_config(extra, settings)
    assert not settings.guard
    section, layer = (record.getMessage() for record in caplog.records)
    assert 'kv_connector_extra_config["kvaudit"]: unknown key gaurd ignored' in section and "guard" in section
    assert '["kvaudit"]["lmcache"]: unknown key registy ignored' in layer and "registry" in layer


def test_the_example_deployments_configuration_is_read_whole(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """`examples/reference_deployment.py`'s configuration (README "The reference deployment"),
    as vLLM and both hooks read it: every key known, its connector LMCache's."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from kvaudit.hooks.vllm.lmcache_layer import wraps_lmcache

    path = ROOT / "examples" / "reference_deployment.py"
    spec = importlib.util.spec_from_file_location("reference_deployment", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    config = KVTransferConfig(**example.transfer_config("r1", "lm://127.0.0.1:65000", tmp_path))
    extra = config.kv_connector_extra_config
    with caplog.at_level(logging.WARNING, logger="kvaudit.hooks.vllm.settings"):
        settings = AuditSettings.from_extra_config(extra)
        layer = LayerSettings.from_extra_config(extra, settings)
    assert not caplog.records
    assert settings.guard and layer.registry == str(tmp_path / "registry")
    assert wraps_lmcache(KVConnectorFactory.get_connector_class(inner_transfer_config(config, settings)))


def _block(index: int) -> PageDescriptor:
    return PageDescriptor(key=f"b{index}", token_start=index * 32, token_end=(index + 1) * 32)


def test_each_block_names_the_chunk_holding_its_last_token():
    blocks = [_block(i) for i in range(10)]
    unit = LMCacheUnit()
    unit.tell([PageDescriptor(key="c0", token_start=0, token_end=256, used=True)])
    name_sources(blocks, unit.chunks)
    assert [p.source_key for p in blocks] == ["c0"] * 8 + [None, None]
    # A later report (LMCache's next call for the request) names the rest.
    unit.tell([PageDescriptor(key="c1", token_start=256, token_end=512, used=False)])
    name_sources(blocks, unit.chunks)
    assert [(p.source_key, p.used) for p in blocks[7:]] == [("c0", True), ("c1", False), ("c1", False)]


def test_a_fetch_is_judged_a_chunk_at_a_time():
    chunks = [
        PageDescriptor(key="c0", token_start=0, token_end=256, used=True),
        PageDescriptor(key="c1", token_start=256, token_end=1000, used=True),  # a prompt's partial last chunk
    ]
    unit = LMCacheUnit()
    unit.tell(chunks)
    assert unit.first_rejected(0, 31, 32, guard=True) is None  # block 30 ends at token 991
    # Block 31 (tokens 992-1023) ends past every chunk: no chunk served it.
    assert unit.first_rejected(0, 32, 32, guard=True) == 31
    assert unit.first_rejected(0, 32, 32, guard=False) is None
    assert unit.first_rejected(4, 20, 32, guard=True) is None  # a unit starting past local blocks
    chunks[1].used = False  # the guard rejected the second chunk: from block 7 on (its last token 255 is c0's)
    assert unit.first_rejected(0, 31, 32, guard=True) == 8
    assert unit.first_rejected(2, 29, 32, guard=True) == 6


def test_without_the_guard_a_fetch_lmcache_used_whole_is_judged_without_its_descriptors():
    def unmade() -> list[PageDescriptor]:
        raise AssertionError("made on the serving thread")

    unit = LMCacheUnit()
    unit.tell(LazyPages(4, unmade, all_used=True))
    assert unit.first_rejected(0, 32, 32, guard=False) is None
    # A chunk LMCache did not use: its descriptors are read to find the blocks it served.
    partial = LMCacheUnit()
    partial.tell(
        LazyPages(1, lambda: [PageDescriptor(key="c0", token_start=0, token_end=256, used=False)], all_used=False)
    )
    assert partial.first_rejected(0, 8, 32, guard=False) == 0


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


def test_prevent_tag_goes_where_lmcache_reads_request_configs():
    from types import SimpleNamespace

    from lmcache.integration.vllm.utils import extract_request_configs_from_sampling_params
    from vllm import SamplingParams

    from kvaudit.hooks.vllm.prevent import tag_request

    tag = {"lmcache.tag.kvaudit_geometry": "61af728e2f8dfe97"}
    bare = SimpleNamespace(sampling_params=SamplingParams())
    tag_request(bare, tag)
    assert extract_request_configs_from_sampling_params(bare.sampling_params) == tag
    # The client's own entries stay, and so does its dict: the tag goes into a copy.
    own = {"lmcache.tag.run": "a", "do_remote_prefill": True}
    client = SimpleNamespace(sampling_params=SamplingParams(extra_args={"kv_transfer_params": own, "x": 1}))
    tag_request(client, tag)
    assert extract_request_configs_from_sampling_params(client.sampling_params) == {"lmcache.tag.run": "a", **tag}
    assert client.sampling_params.extra_args["x"] == 1 and "lmcache.tag.kvaudit_geometry" not in own
    # Idempotent: vLLM asks again for a request whose lookup is not decided yet.
    tag_request(client, tag)
    assert extract_request_configs_from_sampling_params(client.sampling_params) == {"lmcache.tag.run": "a", **tag}
    # What LMCache would not read a configuration from is left alone.
    odd = SimpleNamespace(sampling_params=SamplingParams(extra_args={"kv_transfer_params": "opaque"}))
    tag_request(odd, tag)
    assert odd.sampling_params.extra_args == {"kv_transfer_params": "opaque"}
    pooling = SimpleNamespace(sampling_params=None)
    tag_request(pooling, tag)
    assert pooling.sampling_params is None


def test_prevent_setting_from_the_kvaudit_section():
    extra = {"kvaudit": {"wrap": "LMCacheConnectorV1", "replica": "r1", "prevent": True}}
    assert AuditSettings.from_extra_config(extra).prevent
    assert not SETTINGS.prevent
