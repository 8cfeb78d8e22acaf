"""The replica's own KV configuration, read from the engine config (docs/design.md section 3)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvaudit.contract import KVConfig, bytes_per_element

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig


@dataclass(frozen=True)
class EngineGeometry:
    """What this engine's KV cache is: enough to describe every page it stores."""

    model: str
    dtype: str
    block_size: int
    layers: int
    kv_heads: int
    head_size: int
    world_size: int
    rank: int | None
    hash_algo: str
    # A hybrid model's first KV cache group, the one whose blocks the hook describes: its
    # kind (vLLM's `KVCacheSpecKind`) and window; None for a model with one group.
    kv_group_kind: str | None = None
    sliding_window: int | None = None

    @property
    def group_fields(self) -> dict[str, Any]:
        """What every page of the described group says of it (docs/design.md section 7.1); none with one group."""
        if self.kv_group_kind is None:
            return {}
        return {"kv_group": 0, "kv_group_kind": self.kv_group_kind, "sliding_window": self.sliding_window}

    @property
    def element_bytes(self) -> int:
        return bytes_per_element(self.dtype) or 0

    @property
    def page_shape(self) -> tuple[int, ...]:
        """The shape of one block as this replica's connector reads it (all layers, K and V packed)."""
        return (self.layers, self.block_size, self.kv_heads, 2 * self.head_size)

    @property
    def page_bytes(self) -> int:
        """Bytes of one block over all layers, K and V."""
        return self.layers * self.block_size * self.kv_heads * 2 * self.head_size * self.element_bytes

    def kv_config(self, layout: str | None) -> KVConfig:
        """The replica's configuration with its geometry fingerprint (vLLM has no KV format version)."""
        return KVConfig(
            model=self.model,
            dtype=self.dtype,
            layout=layout,
            block_size=self.block_size,
            world_size=self.world_size,
            rank=self.rank,
            hash_algo=self.hash_algo,
            layers=self.layers,
            kv_heads=self.kv_heads,
            head_size=self.head_size,
        ).with_geometry()


def torch_dtype_name(dtype: object) -> str:
    """`torch.bfloat16` -> `bfloat16`: the contract's spelling."""
    return str(dtype).removeprefix("torch.")


def engine_geometry(
    vllm_config: VllmConfig, rank: int | None, kv_cache_config: KVCacheConfig | None = None
) -> EngineGeometry:
    """The KV geometry of this replica; `rank` is the TP rank in a worker, None in the scheduler;
    `kv_cache_config` the KV cache's groups, where the connector was given them."""
    model_config = vllm_config.model_config
    parallel = vllm_config.parallel_config
    cache = vllm_config.cache_config
    dtype = cache.cache_dtype
    return EngineGeometry(
        model=str(model_config.model),
        dtype=torch_dtype_name(model_config.dtype) if dtype == "auto" else str(dtype),
        block_size=int(cache.block_size),
        layers=int(model_config.get_num_layers(parallel)),
        kv_heads=int(model_config.get_num_kv_heads(parallel)),
        head_size=int(model_config.get_head_size()),
        world_size=int(parallel.tensor_parallel_size),
        rank=rank,
        hash_algo=str(cache.prefix_caching_hash_algo),
        **first_group(kv_cache_config),
    )


def first_group(kv_cache_config: KVCacheConfig | None) -> dict[str, Any]:
    """The first KV cache group's kind and window (of a sliding-window group), where there are
    several groups: a hybrid model. None with one group, where every page is of group 0."""
    try:
        groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
        if len(groups) < 2:
            return {}
        from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind

        spec = groups[0].kv_cache_spec
        kind = get_kv_cache_spec_kind(spec).value
        return {"kv_group_kind": kind, "sliding_window": spec.sliding_window if kind.startswith("sliding") else None}
    except Exception:  # a release that describes its groups otherwise: pages go without their group's kind
        logger.debug("kvaudit: cannot tell the KV cache groups' kinds", exc_info=True)
        return {}
