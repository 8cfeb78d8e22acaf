"""The seed's fault in LMCache's multiprocess mode, for tests and demos: a raw-pointer fallback store.

The incident this project is about: a store path that, failing to copy, hands the pool
process-local addresses of the paged KV blocks instead of portable pages. Through
LMCache's multiprocess server the payload moves by the server's own transfer path (the
worker's engine-driven copy on a CPU), which kvaudit does not replace:
`RawPointerFaultMPConnector` is `LMCacheMPConnector` itself, and only its format
(`RawPointerMPFormat`) declares its stores as the fallback would make them: `transfer=raw_ptr`,
the paged layout and the blocks' process-local addresses. The producer's stamps
(`stamp_dir`) carry `transfer=raw_ptr` to every reader, since no MP object or event says
how a payload moved: the audit flags each fetched block (KVA002, critical where used) and
the guard refuses it, and vLLM recomputes. Wrap it with
`"wrap": "RawPointerFaultMPConnector", "wrap_module_path": "kvaudit.hooks.vllm.lmcache_mp_fault"`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector import LMCacheMPConnector

from kvaudit.contract import PageDescriptor, Transfer
from kvaudit.hooks.vllm.inner_formats import CPU_PAGED_LAYOUT, Unit
from kvaudit.hooks.vllm.lmcache_mp_layer import MPFormat

if TYPE_CHECKING:
    import torch


class RawPointerFaultMPConnector(LMCacheMPConnector):  # type: ignore[misc, valid-type]
    """`LMCacheMPConnector`, whose stores kvaudit describes as the raw-pointer fallback's."""


class RawPointerMPFormat(MPFormat):
    """The fallback's stores: raw paged blocks, referred to by their process-local addresses."""

    stamp_transfer = Transfer.RAW_PTR.value

    def describe_store(self, unit: Unit, kv_caches: dict[str, torch.Tensor]) -> list[PageDescriptor]:
        pages = super().describe_store(unit, kv_caches)
        first_cache = next(iter(kv_caches.values()), None)
        first_block = unit.token_start // self._geometry.block_size
        for index, page in enumerate(pages):
            page.layout = CPU_PAGED_LAYOUT
            block = first_block + index
            if first_cache is not None and block < len(unit.plan.block_ids):
                page.address = int(first_cache[unit.plan.block_ids[block]].data_ptr())
        return pages
