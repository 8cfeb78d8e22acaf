"""Driving a real LMCache engine on a CPU, for tests, examples and benchmarks.

LMCache's GPU connectors (its copy kernels between the serving engine's KV cache and
its memory objects) need CUDA, XPU, MUSA or HPU, and `CreateGPUConnector` has no CPU
choice. These connectors stand in for them, and for nothing else:

- `CPUCopyConnector` copies between a plain CPU KV tensor `[layers, 2, tokens, kv_heads,
  head_size]` (passed to `store` and `retrieve` as `kvcache=`) and LMCache's `KV_2LTD`
  memory objects `[2, layers, tokens, kv_heads * head_size]`: an LMCache engine driven
  directly.
- `CPUPagedConnector` does what LMCache's vLLM connector (`VLLMPagedMemGPUConnectorV2`)
  does, for vLLM's CPU paged KV cache: one tensor per layer, `[blocks, kv_heads,
  block_size, 2 * head_size]` in memory as `[blocks, kv_heads, 2, block_size,
  head_size]` (each block holds a head's keys, then its values: the CPU attention
  backend's split), addressed through `slot_mapping`.
- `RawPointerPagedConnector` is a deliberately faulty `CPUPagedConnector` for tests and
  demos: a raw-pointer fallback that stores the bytes of a chunk's paged blocks as they
  lie at the blocks' addresses, in vLLM's paged layout, into memory objects that every
  reader takes for `KV_2LTD` (see `kvaudit.hooks.vllm.lmcache_cpu`).

Everything else is LMCache's own code.
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


class CPUPagedConnector(CPUCopyConnector):
    """LMCache's vLLM paged-memory copy, for vLLM's CPU KV cache (see the module docstring).

    `store`, `retrieve` pass `kvcaches` (the layers' KV caches, in layer order) and
    `slot_mapping` (a slot per token of the whole sequence, block id x block size +
    offset), as LMCache's vLLM integration does for its CUDA connectors. Shapes and the
    batched calls are `CPUCopyConnector`'s.
    """

    @staticmethod
    def _split(cache: torch.Tensor) -> torch.Tensor:
        """A layer's cache as `[blocks, kv_heads, 2, block_size, head_size]` (a view: no copy)."""
        blocks, heads, block_size, packed = cache.shape
        return cache.view(blocks, heads, 2, block_size, packed // 2)

    @staticmethod
    def _slots(kwargs: dict[str, Any], start: int, end: int) -> torch.Tensor:
        return kwargs["slot_mapping"][start:end].to("cpu", torch.long)

    def from_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kwargs: Any) -> None:
        slots = self._slots(kwargs, start, end)
        for layer, cache in enumerate(kwargs["kvcaches"]):
            split = self._split(cache)
            block_size = split.shape[3]
            # [tokens, kv_heads, 2, head_size]: the indexed axes come first.
            tokens = split[slots // block_size, :, :, slots % block_size]
            for kv in range(2):
                memory_obj.tensor[kv, layer].copy_(tokens[:, :, kv].reshape(end - start, -1))

    def to_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kwargs: Any) -> None:
        slots = self._slots(kwargs, start, end)
        for layer, cache in enumerate(kwargs["kvcaches"]):
            split = self._split(cache)
            block_size = split.shape[3]
            blocks, offsets = slots // block_size, slots % block_size
            for kv in range(2):
                # Read with this engine's own head split, whatever split its producer
                # used: the copy cannot tell, just like the CUDA kernel.
                payload = memory_obj.tensor[kv, layer].reshape(end - start, self.kv_heads, self.head_size)
                split[blocks, :, kv, offsets] = payload.to(cache.dtype)


class RawPointerPagedConnector(CPUPagedConnector):
    """The raw-pointer fallback (see the module docstring): stores paged blocks' raw bytes."""

    def from_gpu(self, memory_obj: MemoryObj, start: int, end: int, **kwargs: Any) -> None:
        slots = self._slots(kwargs, start, end)
        raw = []
        for cache in kwargs["kvcaches"]:
            blocks = torch.unique_consecutive(slots // cache.shape[2])
            raw.append(cache[blocks].reshape(-1))
        # The bytes at the blocks' addresses, in vLLM's paged layout, layer after layer:
        # the object's own shape and format (KV_2LTD) no longer describe them.
        flat = memory_obj.tensor.view(-1)
        payload = torch.cat(raw)[: flat.numel()]
        flat[: payload.numel()].copy_(payload)


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
