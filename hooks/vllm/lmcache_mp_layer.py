"""LMCache's multiprocess connector (`LMCacheMPConnector`) at the vLLM layer: each block and its server object.

`LMCacheMPConnector` keeps LMCache's engine in its multiprocess server (`lmcache
server`), which vLLM's worker reaches over ZMQ: each step's metadata lists, per request,
a `STORE` or `RETRIEVE` of whole LMCache chunks (`LoadStoreOp`: the request's tokens, the
range, the blocks) under the request's cache salt. `MPFormat` makes one unit of each,
with one page per vLLM block, described fully:

- key, hash algorithm and token range: vLLM's block hash, as for every connector;
- the server object holding the block (`source_key`, `contract.mp_object_key`): the chunk
  hash of the chunk holding the block's last token, computed from the request's tokens
  as the server computes it (LMCache's `TokenHasher`, with the server's chunk size and the
  connector's `lmcache.mp.hash_algorithm`), and the cache salt: the key of the page the
  server hook (`kvaudit.hooks.lmcache.mp_server`) records for that object;
- model, world size and rank: those of the server object's key, which the worker builds
  from its own model and parallel rank (an object under any other key is not served);
- dtype, shape, layout (`contract.MP_LAYOUTS`: `KV_LTD` where vLLM packs K and V on one
  axis, as its CPU cache does; `KV_2LTD` otherwise) and bytes: the format of the objects
  the server allocated for this worker's registered KV cache; tier `cpu` (the server's
  L1), object group 0 (`kv_group`; LMCache 0.5.6 keeps one group for a model without
  sliding-window layers); how the payload moved (`transfer`) on a store, and on a fetch
  from the producer's stamp (`stamp_dir`), as no MP object or event says it;
- on a store, the replica's head geometry and fingerprint, as every producer's.

No MP object or event carries the head split: a replica with another split of the same
width reads the same objects. Producer stamps (`stamp_dir`) are what tells it apart: the
guard refuses such a block and vLLM recomputes it. Trace context cannot cross the MP
protocol (its messages have no field for it): the vLLM spans record vLLM's internal
request id (`kvaudit.request.engine_id`), which is the request id the server's lookup
spans carry, and the blocks name the server's objects: the layers join in SQL
(docs/design.md section 6.4).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Final

import msgspec

from kvaudit.contract import MP_LAYOUTS, PageDescriptor, Tier, Transfer, mp_object_key
from kvaudit.hooks.vllm.geometry import EngineGeometry
from kvaudit.hooks.vllm.inner_formats import Unit, page_skeletons
from kvaudit.hooks.vllm.plans import RequestPlan

if TYPE_CHECKING:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

logger = logging.getLogger(__name__)

BACKEND: Final = "vllm.LMCacheMPConnector"
# Plans of requests whose later steps may still load or store: the oldest dropped past this bound.
_MAX_PLANS: Final = 4096
_HASH_ALGORITHM_KEY: Final = "lmcache.mp.hash_algorithm"


class MPOp(msgspec.Struct):
    """One `LoadStoreOp` of the inner metadata, as the unit's `ref`."""

    token_ids: list[int]
    end: int
    cache_salt: str


def wraps_lmcache_mp(connector_class: type) -> bool:
    """Whether the wrapped connector is LMCache's multiprocess connector (LMCache's own, or vLLM's copy)."""
    from vllm.distributed.kv_transfer.kv_connector.v1 import lmcache_mp_connector

    classes = tuple(
        cls
        for cls in (
            getattr(lmcache_mp_connector, "LMCacheMPConnector", None),
            getattr(lmcache_mp_connector, "LMCacheMPConnectorUpstream", None),
        )
        if isinstance(cls, type)
    )
    return bool(classes) and issubclass(connector_class, classes)


def packs_kv() -> bool:
    """Whether this platform's KV cache packs K and V on one axis (vLLM's CPU attention backend)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


class MPFormat:
    """`LMCacheMPConnector`'s metadata as the vLLM layer sees it: one unit per STORE or RETRIEVE."""

    backend = BACKEND
    # How its stores move a block (stamped: no MP object or event says it).
    stamp_transfer: str = Transfer.COPY.value

    def __init__(self, inner: KVConnectorBase_V1, geometry: EngineGeometry) -> None:
        self._inner = inner
        self._geometry = geometry
        self._plans: OrderedDict[str, RequestPlan] = OrderedDict()
        self._hasher: Any = None
        self.layout = MP_LAYOUTS[3] if packs_kv() else MP_LAYOUTS[4]
        g = geometry
        # One block of the server's object, as this replica reads it (the guard expects it).
        self.page_shape: tuple[int, ...] = (
            (g.layers, g.block_size, g.kv_heads * 2 * g.head_size)
            if self.layout == MP_LAYOUTS[3]
            else (2, g.layers, g.block_size, g.kv_heads * g.head_size)
        )
        kv = geometry.kv_config(self.layout)
        self._fetch_fields: dict[str, Any] = {
            "hash_algo": geometry.hash_algo,
            "model": geometry.model,
            "world_size": geometry.world_size,
            "rank": geometry.rank,
            "dtype": geometry.dtype,
            "shape": self.page_shape,
            "layout": self.layout,
            "bytes": geometry.page_bytes,
            "tier": Tier.CPU.value,
            "kv_group": 0,
        }
        self._store_fields = {
            **self._fetch_fields,
            "transfer": self.stamp_transfer,
            "layers": kv.layers,
            "kv_heads": kv.kv_heads,
            "head_size": kv.head_size,
            "geometry": kv.geometry,
        }
        self._hash_algorithm = _hash_algorithm(inner)

    def units(self, inner_meta: KVConnectorMetadata, plans: list[RequestPlan]) -> list[Unit]:
        for plan in plans:
            self._plans[plan.req_id] = plan
            self._plans.move_to_end(plan.req_id)
        while len(self._plans) > _MAX_PLANS:
            self._plans.popitem(last=False)
        units = []
        block_size = self._geometry.block_size
        for request in getattr(inner_meta, "requests", ()):
            plan = self._plans.get(request.request_id)
            op = request.op
            if plan is None or op.token_ids is None:
                continue
            # A retrieve skips the blocks vLLM already held (`skip_first_n_tokens`): not loaded.
            start = op.start + (getattr(op, "skip_first_n_tokens", 0) or 0)
            start -= start % block_size
            if op.end > start:
                ref = MPOp(op.token_ids, op.end, request.cache_salt or "")
                units.append(Unit(plan, request.direction == "STORE", start, op.end - start, ref))
        return units

    def describe_fetch(self, unit: Unit) -> list[PageDescriptor]:
        pages = page_skeletons(unit, self._geometry, self._fetch_fields)
        self._name_sources(pages, unit.ref)
        return pages

    def describe_store(self, unit: Unit, kv_caches: dict[str, torch.Tensor]) -> list[PageDescriptor]:
        pages = page_skeletons(unit, self._geometry, self._store_fields)
        self._name_sources(pages, unit.ref)
        return pages

    def _name_sources(self, pages: list[PageDescriptor], op: MPOp) -> None:
        """Each block names the server object of the chunk holding its last token."""
        hasher = self._token_hasher()
        chunk = hasher.chunk_size
        hashes = hasher.compute_chunk_hashes(op.token_ids, end=op.end)
        for page in pages:
            assert page.token_end is not None  # page_skeletons gives every page its range
            index = (page.token_end - 1) // chunk
            if index < len(hashes):
                page.source_key = mp_object_key(hashes[index], op.cache_salt)

    def _token_hasher(self) -> Any:
        """LMCache's own hasher of the server's chunks, made when first needed (the worker's
        adapter knows the server's chunk size once it has connected)."""
        if self._hasher is None:
            from lmcache.v1.multiprocess.token_hasher import TokenHasher

            chunk_size = self._inner.worker_adapter.lmcache_tokens_per_chunk  # type: ignore[attr-defined]
            self._hasher = TokenHasher(chunk_size=chunk_size, hash_algorithm=self._hash_algorithm)
        return self._hasher


def _hash_algorithm(inner: KVConnectorBase_V1) -> str:
    """The chunk hash algorithm the connector's configuration names (it must be the server's)."""
    from lmcache.integration.vllm.vllm_multi_process_adapter import ExtraConfigDefault

    transfer = getattr(inner, "_kv_transfer_config", None)
    extra = getattr(transfer, "kv_connector_extra_config", None) or {}
    return str(extra.get(_HASH_ALGORITHM_KEY) or ExtraConfigDefault.hash_algorithm.default)


def format_for(inner: KVConnectorBase_V1, geometry: EngineGeometry) -> MPFormat | None:
    """The format of an `LMCacheMPConnector` inner connector; None for any other."""
    if not wraps_lmcache_mp(type(inner)):
        return None
    from kvaudit.hooks.vllm.lmcache_mp_fault import RawPointerFaultMPConnector, RawPointerMPFormat

    if isinstance(inner, RawPointerFaultMPConnector):
        return RawPointerMPFormat(inner, geometry)
    return MPFormat(inner, geometry)


def prevent_salt_fingerprint(vllm_config: Any, layout: str | None) -> str:
    """The fingerprint a prevented request's cache salt carries: the replica's on rank 0, so that
    every rank's objects of one request share the salt (their keys tell the ranks apart)."""
    from kvaudit.hooks.vllm.geometry import engine_geometry

    fingerprint = engine_geometry(vllm_config, 0).kv_config(layout).geometry
    assert fingerprint is not None
    return fingerprint


def salt_request(request: Any, fingerprint: str) -> None:
    """Append the geometry tag to the request's cache salt (`contract.geometry_salt`), once.

    Set before LMCache's connector first reads the salt (its request tracker, made at the
    request's first lookup): the lookup, the retrieves and the stores all carry it. vLLM
    hashed the prompt's blocks with the client's salt when the request arrived: its own
    prefix cache and kvaudit's block keys are unchanged.
    """
    from kvaudit.contract import geometry_salt

    salt = geometry_salt(None, fingerprint)
    current = getattr(request, "cache_salt", None) or ""
    if not current.endswith(salt):
        request.cache_salt = geometry_salt(current, fingerprint)
