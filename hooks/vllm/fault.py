"""A deliberately faulty KV connector for tests and demos: never used unless named.

`RawPointerFaultConnector` is ExampleConnector with a raw-pointer fallback store: it
writes each page's raw block memory (the bytes of vLLM's packed paged layout,
`[kv heads, block size, 2 * head size]` per block on the CPU) with no shape, dtype or
layout. Its load path reads those bytes in the reader's own dtype and in the portable,
token-major layout the example connector exchanges (`[tokens, kv heads, 2 * head
size]`). Between replicas of one dtype that is the same bytes in another order;
between a float32 producer and a bfloat16 consumer it is garbage. Either way the
consumer gets a full hit and a silently wrong KV cache, with no error: the bug class
of docs/design.md section 1, on a real engine. (A random-weight test model attends almost
uniformly, so only the dtype misread changes its greedy output.)

    kv_connector="KVAuditConnector",
    kv_connector_extra_config={"kvaudit": {"wrap": "RawPointerFaultConnector",
        "wrap_module_path": "kvaudit.hooks.vllm.fault", ...}, "shared_storage_path": DIR}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
)

if TYPE_CHECKING:
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata

RAW_SUFFIX = ".raw"


class RawPointerFaultConnector(ExampleConnector):
    """ExampleConnector whose pages travel as raw paged-block bytes (see the module docstring)."""

    def _raw_path(self, layer_name: str, record: Any) -> str:
        path = self._generate_filename_debug(layer_name, record.token_ids, record.mm_hashes)
        return path.removesuffix(".safetensors") + RAW_SUFFIX

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, ExampleConnectorMetadata)
        for record in metadata.requests:
            if not record.is_store:
                continue
            blocks = torch.unique_consecutive(record.slot_mapping // self._block_size)
            raw = kv_layer[blocks.to(kv_layer.device)].contiguous().cpu()
            with open(self._raw_path(layer_name, record), "wb") as file:
                file.write(raw.view(torch.uint8).numpy().tobytes())

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, ExampleConnectorMetadata)
        if forward_context.attn_metadata is None:
            return
        for record in metadata.requests:
            if record.is_store:
                continue
            for layer_name, layer in forward_context.no_compile_layers.items():
                kv_cache = getattr(layer, "kv_cache", None)
                if kv_cache is None:
                    continue
                # The bug: the reader assumes its own dtype and token-major layout for
                # bytes written in the producer's dtype and paged, head-major layout.
                tokens, heads, packed = len(record.slot_mapping), kv_cache.shape[1], kv_cache.shape[3]
                with open(self._raw_path(layer_name, record), "rb") as file:
                    raw = bytearray(file.read(tokens * heads * packed * kv_cache.element_size()))
                payload = torch.frombuffer(raw, dtype=kv_cache.dtype).reshape(tokens, heads, packed)
                slots = record.slot_mapping.to(kv_cache.device)
                kv_cache[slots // self._block_size, :, slots % self._block_size] = payload.to(kv_cache.device)
