"""Driving a real LMCache engine on a CPU, for tests, examples and benchmarks.

`CPUCopyConnector` stands in for LMCache's CUDA copy kernel only: LMCache's own GPU
connectors assert a CUDA device, so on a CPU this small connector copies between a
plain CPU KV tensor `[layers, 2, tokens, kv_heads, head_size]` (passed to `store` and
`retrieve` as `kvcache=`) and LMCache's `KV_2LTD` memory objects
`[2, layers, tokens, kv_heads * head_size]`. Everything else is LMCache's own code.
"""

from __future__ import annotations

from typing import Any

import torch
from lmcache.v1.cache_engine import LMCacheEngine, LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector import GPUConnectorInterface
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.metadata import LMCacheMetadata


class CPUCopyConnector(GPUConnectorInterface):
    def __init__(self, layers: int, kv_heads: int, head_size: int) -> None:
        self.layers, self.kv_heads, self.head_size = layers, kv_heads, head_size

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, self.layers, num_tokens, self.kv_heads * self.head_size])

    def from_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kwargs: Any) -> None:
        chunk = kwargs["kvcache"][:, :, start:end]
        memory_obj.tensor.copy_(chunk.permute(1, 0, 2, 3, 4).reshape(self.get_shape(end - start)))

    def to_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kwargs: Any) -> None:
        # The memory object is read with this engine's own head split, whatever
        # split its producer used: the copy cannot tell, just like the CUDA kernel.
        split = memory_obj.tensor.reshape(2, self.layers, end - start, self.kv_heads, self.head_size)
        kwargs["kvcache"][:, :, start:end].copy_(split.permute(1, 0, 2, 3, 4))

    def batched_from_gpu(self, memory_objs: Any, starts: list[int], ends: list[int], **kwargs: Any) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.from_gpu(obj, start, end, **kwargs)

    def batched_to_gpu(self, memory_objs: Any = None, starts: Any = None, ends: Any = None, **kwargs: Any) -> None:
        for obj, start, end in zip(memory_objs, starts, ends, strict=True):
            self.to_gpu(obj, start, end, **kwargs)


def cpu_engine(
    name: str,
    *,
    layers: int,
    kv_heads: int,
    head_size: int,
    model: str = "tiny",
    dtype: torch.dtype = torch.bfloat16,
    chunk_size: int = 256,
    **config: Any,
) -> LMCacheEngine:
    """A started `LMCacheEngine` with a local CPU tier; `config` goes to `LMCacheEngineConfig.from_defaults`."""
    config.setdefault("local_cpu", True)
    config.setdefault("max_local_cpu_size", 0.5)
    engine_config = LMCacheEngineConfig.from_defaults(chunk_size=chunk_size, **config)
    metadata = LMCacheMetadata(
        model_name=model,
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=dtype,
        kv_shape=(layers, 2, chunk_size, kv_heads, head_size),
        chunk_size=chunk_size,
    )
    connector = CPUCopyConnector(layers, kv_heads, head_size)
    engine = LMCacheEngineBuilder.get_or_create(name, engine_config, metadata, connector, None, None)
    engine.post_init()
    return engine
