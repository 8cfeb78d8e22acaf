"""vLLM's `LMCacheConnectorV1` on a CPU, for tests and demos: never used unless named.

LMCache's vLLM integration builds its copy kernel between vLLM's paged KV cache and its
own memory objects with `lmcache.v1.gpu_connector.CreateGPUConnector`, which chooses by
device (CUDA, XPU, MUSA, HPU) and raises "No supported cpu connector found" on a CPU;
LMCache then runs degraded (every lookup waits out its timeout, nothing is stored).

`CPULMCacheConnectorV1` is `LMCacheConnectorV1` with that one choice replaced, while it
builds its LMCache engine, by `kvaudit.hooks.lmcache.testing.CPUPagedConnector`.
Everything else (LMCache's vLLM adapter, its engine, lookup client and server, storage
backends, the `lm://` and `fs://` pools) is LMCache's and vLLM's own code. Nothing else on
that path needed a CPU workaround with vLLM 0.32 and LMCache 0.5.6 in the non-layerwise,
synchronous mode used here (`use_layerwise` and `enable_blending` refuse a CPU in
`CreateGPUConnector` itself).

`RawPointerFaultLMCacheConnector` stands in for a raw-pointer fallback on this path: the
same with `RawPointerPagedConnector`, which stores the bytes of each chunk's paged blocks
as they lie at the blocks' addresses, in vLLM's paged layout, under objects every reader
takes for `KV_2LTD`. Written to a pool that keeps no chunk metadata (`fs://` with
`save_chunk_meta=False`), that is the bug class of docs/design.md section 1 through the
path users deploy: a reader gets a full hit on bytes it misreads, with no error.

    kv_connector="KVAuditConnector",
    kv_connector_extra_config={"kvaudit": {"wrap": "CPULMCacheConnectorV1",
        "wrap_module_path": "kvaudit.hooks.vllm.lmcache_cpu", ...}, "lmcache.remote_url": ...}
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from lmcache.v1 import gpu_connector
from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1

from kvaudit.hooks.lmcache.testing import CPUPagedConnector, RawPointerPagedConnector

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import KVCacheConfig


@contextmanager
def _copy_kernel(connector: type[CPUPagedConnector]) -> Iterator[None]:
    """`CreateGPUConnector` answering `connector` while the block runs (LMCache imports it when called)."""
    original = gpu_connector.CreateGPUConnector

    def create(config: Any, metadata: Any, engine: Any, layout_hints: Any = None) -> CPUPagedConnector:
        layers, _, _, kv_heads, head_size = metadata.kv_shape
        return connector(layers, kv_heads, head_size)

    gpu_connector.CreateGPUConnector = create
    try:
        yield
    finally:
        gpu_connector.CreateGPUConnector = original


class CPULMCacheConnectorV1(LMCacheConnectorV1):
    """`LMCacheConnectorV1` whose LMCache engine copies with `CPUPagedConnector`."""

    copy_kernel: type[CPUPagedConnector] = CPUPagedConnector

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        # The worker builds its LMCache engine, and with it the copy kernel, right here.
        with _copy_kernel(self.copy_kernel):
            super().__init__(vllm_config, role, kv_cache_config)


class RawPointerFaultLMCacheConnector(CPULMCacheConnectorV1):
    """`CPULMCacheConnectorV1` whose stores take the raw-pointer fallback (see the module docstring)."""

    copy_kernel = RawPointerPagedConnector
