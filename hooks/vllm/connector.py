"""`KVAuditConnector`: a V1 KV connector that wraps another one and traces what it does.

Every method of the V1 interface is delegated unchanged to the inner connector; the
wrapper only observes. Scheduler side (EngineCore process): a `kvaudit.lookup` span
per `get_num_new_matched_tokens`, and the request plans (page keys, block ids, request
id, trace context) added to the connector metadata. Worker side (each Worker
process): a `kvaudit.fetch` span per load and a `kvaudit.store` span per save, with
one page descriptor per block. With `guard` on, fetched pages that fail the
in-process checks are reported through `get_block_ids_with_load_errors()` so vLLM
recomputes them (with `kv_load_failure_policy="recompute"`), and say `used=false`.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import vllm
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    CopyBlocksOp,
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
    supports_hma,
)

from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
from kvaudit.emit.emitter import Emitter, Operation, setup_emitter
from kvaudit.guard import violations
from kvaudit.hooks.vllm import lmcache_layer
from kvaudit.hooks.vllm.formats import InnerFormat, Unit, format_for, page_skeletons
from kvaudit.hooks.vllm.geometry import EngineGeometry, engine_geometry
from kvaudit.hooks.vllm.plans import KVAuditMetadata, RequestPlan, external_request_id, plan_for
from kvaudit.hooks.vllm.settings import AuditSettings, inner_transfer_config, inner_vllm_config
from kvaudit.hooks.vllm.stamps import apply_stamp, read_stamp, write_stamp
from kvaudit.hooks.vllm.version import check_vllm_version

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent, KVConnectorKVEvents
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


def _inner_class(kv_transfer_config: Any) -> type[KVConnectorBase_V1]:
    settings = AuditSettings.from_extra_config(kv_transfer_config.kv_connector_extra_config)
    return KVConnectorFactory.get_connector_class(inner_transfer_config(kv_transfer_config, settings))


def _tp_rank(vllm_config: VllmConfig) -> int:
    """This worker's tensor-parallel rank (0 without tensor parallelism, where no group may exist)."""
    if vllm_config.parallel_config.tensor_parallel_size == 1:
        return 0
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


class KVAuditConnector(KVConnectorBase_V1):
    """Wraps the connector named in `kv_connector_extra_config["kvaudit"]["wrap"]`.

    Use `KVAuditHMAConnector` to wrap a connector that supports the hybrid memory
    allocator: vLLM decides on HMA from the connector class before it exists.
    """

    # The inner class of the last wrapper built in this process: class-level hooks
    # that vLLM calls without a config (stats) delegate to it.
    _last_inner_class: type[KVConnectorBase_V1] | None = None

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        refusal = check_vllm_version()
        if refusal is not None:
            raise RuntimeError(refusal)
        super().__init__(vllm_config, role, kv_cache_config)
        self._settings = AuditSettings.from_extra_config(self._kv_transfer_config.kv_connector_extra_config)
        worker = role == KVConnectorRole.WORKER
        inner = lmcache_layer.inner_config(inner_vllm_config(vllm_config, self._settings), self._settings, worker)
        self._inner = KVConnectorFactory.create_connector(inner, role, kv_cache_config)
        type(self)._last_inner_class = type(self._inner)
        self._geometry: EngineGeometry = engine_geometry(vllm_config, _tp_rank(vllm_config) if worker else None)
        self._format: InnerFormat = lmcache_layer.format_for(self._inner, self._geometry) or format_for(
            self._inner, self._geometry
        )
        # What this replica reads a page as: the reference the guard compares fetched pages with.
        self._expected = PageDescriptor.from_config(
            self._geometry.kv_config(self._format.layout), shape=self._geometry.page_shape
        )
        self._emitter: Emitter = setup_emitter(
            self._settings.replica,
            self._settings.export,
            engine="vllm",
            engine_version=vllm.__version__,
            service_name="vllm",
            kv=self._geometry.kv_config(self._format.layout),
        )
        atexit.register(self._emitter.shutdown)
        # Scheduler side: requests looked up and not finished, and the loads planned.
        self._requests: dict[str, Request] = {}
        self._local_tokens: dict[str, int] = {}
        self._loads: dict[str, int] = {}
        # Worker side: this step's units, stores in flight, rejected blocks, KV caches.
        self._units: list[Unit] = []
        self._stores: dict[int, Operation] = {}
        self._load_errors: set[int] = set()
        self._kv_caches: dict[str, torch.Tensor] = {}
        self._observation_failed = False
        if self._settings.guard and not worker and self._kv_transfer_config.kv_load_failure_policy == "fail":
            logger.warning(
                "kvaudit guard is on but kv_load_failure_policy='fail': a rejected page fails its "
                "request instead of being recomputed; set kv_load_failure_policy='recompute'"
            )

    # ---- properties and class-level hooks ----

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return self._inner.supports_divergent_local_hybrid_hits

    @property
    def requires_kv_delivery(self) -> bool:
        return self._inner.requires_kv_delivery

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        return _inner_class(vllm_config.kv_transfer_config).get_required_kvcache_layout(vllm_config)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        settings = AuditSettings.from_extra_config(extra_config)
        from vllm.config.kv_transfer import KVTransferConfig

        config = KVTransferConfig(
            kv_connector=settings.wrap,
            kv_connector_module_path=settings.wrap_module_path,
            kv_connector_extra_config=extra_config,
        )
        return KVConnectorFactory.get_connector_class(config).requires_piecewise_for_cudagraph(extra_config)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        inner_class = cls._last_inner_class or cls._inner_class_of_current_config()
        return inner_class.build_kv_connector_stats(data) if inner_class is not None else None

    @classmethod
    def build_prom_metrics(cls, vllm_config: VllmConfig, *args: Any, **kwargs: Any) -> Any:
        return _inner_class(vllm_config.kv_transfer_config).build_prom_metrics(vllm_config, *args, **kwargs)

    @staticmethod
    def _inner_class_of_current_config() -> type[KVConnectorBase_V1] | None:
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        if config is None or config.kv_transfer_config is None:
            return None
        return _inner_class(config.kv_transfer_config)

    # ---- worker side ----

    def get_mem_pool_context(self) -> AbstractContextManager | None:
        return self._inner.get_mem_pool_context()

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if isinstance(connector_metadata, KVAuditMetadata):
            self._units = self._observed(self._format.units, connector_metadata.inner, connector_metadata.plans) or []
            self._inner.bind_connector_metadata(connector_metadata.inner)
        else:
            self._units = []
            self._inner.bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        self._units = []
        self._inner.clear_connector_metadata()

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._kv_caches = kv_caches
        self._inner.register_kv_caches(kv_caches)

    def set_host_xfer_buffer_ops(self, copy_operation: CopyBlocksOp) -> None:
        self._inner.set_host_xfer_buffer_ops(copy_operation)

    def finish_forward(self) -> None:
        self._inner.finish_forward()

    def reset_capture_state(self) -> None:
        self._inner.reset_capture_state()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if isinstance(kv_connector_metadata, KVAuditMetadata):
            kv_connector_metadata = kv_connector_metadata.inner
        self._inner.handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        loads = [unit for unit in self._units if not unit.is_store]
        if not loads:
            self._inner.start_load_kv(forward_context, **kwargs)
            return
        fetches = [self._operation(Op.FETCH, unit) for unit in loads]
        # Described before the load: the guard decides on what the objects say, not on
        # what the inner connector did with them.
        described = [self._describe_fetch(unit) for unit in loads]
        try:
            self._inner.start_load_kv(forward_context, **kwargs)
        except BaseException:
            for fetch in fetches:
                fetch.end(Outcome.ERROR)
            raise
        for unit, fetch, pages in zip(loads, fetches, described):
            self._finish_fetch(unit, fetch, pages)

    def _describe_fetch(self, unit: Unit) -> list[PageDescriptor]:
        """The unit's pages as its objects describe them; when they cannot be read, only
        key and token range, which the guard rejects as incomplete: unchecked is unused."""
        pages = self._observed(self._format.describe_fetch, unit)
        if pages is None:
            pages = page_skeletons(unit, self._geometry.block_size, {"hash_algo": self._geometry.hash_algo})
        return pages

    def _observed(self, describe: Callable[..., _T], *args: Any) -> _T | None:
        """Run one of the hook's own observations; a failure there never reaches vLLM."""
        try:
            return describe(*args)
        except Exception as exc:
            if not self._observation_failed:
                self._observation_failed = True
                logger.warning("kvaudit: cannot describe pages (%r); serving continues", exc, exc_info=True)
            return None

    def _finish_fetch(self, unit: Unit, fetch: Operation, pages: list[PageDescriptor]) -> None:
        stamp = read_stamp(self._settings.stamp_dir, [page.key for page in pages if page.key])
        first_rejected: int | None = None
        for index, page in enumerate(pages):
            apply_stamp(page, stamp)
            if first_rejected is None and (
                # A page a layer below served (LMCache) carries that layer's verdict on it.
                not page.used
                if page.source_key is not None
                else self._settings.guard and bool(violations(page, self._expected))
            ):
                first_rejected = index
        block_size = self._geometry.block_size
        for index, page in enumerate(pages):
            # vLLM recomputes from the first rejected block on: later pages are not used either.
            page.used = first_rejected is None or index < first_rejected
            if not page.used:
                block_index = (page.token_start or 0) // block_size
                if block_index < len(unit.plan.block_ids):
                    self._load_errors.add(unit.plan.block_ids[block_index])
            fetch.add_page(page)
        used_tokens = sum(block_size for page in pages if page.used)
        if first_rejected is not None:
            outcome = Outcome.REJECTED
        else:
            outcome = Outcome.HIT if used_tokens >= unit.num_tokens else Outcome.PARTIAL
        fetch.end(outcome, tokens_hit=used_tokens)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._inner.wait_for_layer_load(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        self._open_stores()
        self._inner.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self) -> None:
        self._open_stores()
        try:
            self._inner.wait_for_save()
        except BaseException:
            for store in self._stores.values():
                store.end(Outcome.ERROR)
            self._stores.clear()
            raise
        for unit in self._units:
            store = self._stores.pop(id(unit), None)
            if store is None:
                continue
            pages = self._observed(self._format.describe_store, unit, self._kv_caches) or []
            for page in pages:
                store.add_page(page)
            if self._settings.stamp_dir is not None:
                self._stamp([page.key for page in pages if page.key])
            store.end(tokens_stored=unit.num_tokens)

    def _open_stores(self) -> None:
        """Start a store span for each store unit of the step, at its first save."""
        for unit in self._units:
            if unit.is_store and id(unit) not in self._stores:
                self._stores[id(unit)] = self._operation(Op.STORE, unit)

    def _stamp(self, keys: list[str]) -> None:
        assert self._settings.stamp_dir is not None
        try:
            write_stamp(self._settings.stamp_dir, keys, self._geometry)
        except OSError as exc:
            logger.warning("kvaudit: cannot write stamp to %s: %s", self._settings.stamp_dir, exc)

    def _operation(self, op: Op, unit: Unit) -> Operation:
        operation = self._emitter.operation(
            op,
            hook=Hook.VLLM_CONNECTOR,
            request_id=unit.plan.request_id,
            backend=self._format.backend,
            tokens_requested=unit.num_tokens,
            parent=unit.plan.parent_context(),
        )
        lmcache_layer.join(unit, operation)
        return operation

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self._inner.get_finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        return self._inner.get_transfer_results(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors = self._inner.get_block_ids_with_load_errors()
        if not self._load_errors:
            return errors
        rejected, self._load_errors = self._load_errors, set()
        return set(errors) | rejected

    def shutdown(self) -> None:
        try:
            self._inner.shutdown()
        finally:
            self._emitter.shutdown()

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        return self._inner.get_kv_connector_stats()

    def get_kv_connector_kv_cache_events(self) -> KVConnectorKVEvents | None:
        return self._inner.get_kv_connector_kv_cache_events()

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        return self._inner.get_handshake_metadata()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return self._inner.build_connector_worker_meta()

    def set_xfer_handshake_metadata(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        self._inner.set_xfer_handshake_metadata(metadata)

    def set_xfer_handshake_metadata_pp_aware(
        self, metadata: dict[tuple[int, int], KVConnectorHandshakeMetadata]
    ) -> None:
        self._inner.set_xfer_handshake_metadata_pp_aware(metadata)

    def get_finished_count(self) -> int | None:
        return self._inner.get_finished_count()

    # ---- scheduler side ----

    def bind_kv_cache_manager(self, kv_cache_manager: KVCacheManager) -> None:
        self._kv_cache_manager = kv_cache_manager
        self._inner.bind_kv_cache_manager(kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        self._inner.bind_gpu_block_pool(gpu_block_pool)

    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        return self._inner.get_loaded_kv_cache_group_ids(request)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        lookup = self._emitter.operation(
            Op.LOOKUP,
            hook=Hook.VLLM_CONNECTOR,
            request_id=external_request_id(request.request_id),
            backend=self._format.backend,
            tokens_requested=request.num_prompt_tokens,
        )
        try:
            matched, load_async = self._inner.get_num_new_matched_tokens(request, num_computed_tokens)
        except BaseException:
            lookup.end(Outcome.ERROR)
            raise
        self._requests[request.request_id] = request
        self._local_tokens[request.request_id] = num_computed_tokens
        if matched is None:
            return matched, load_async  # not decided yet: vLLM asks again, that call is traced
        block_size = self._geometry.block_size
        # The last prompt token is always computed, so a full hit stops a block short of it.
        reachable = (request.num_prompt_tokens - 1) // block_size * block_size
        if matched == 0:
            outcome = Outcome.MISS
        elif num_computed_tokens + matched >= reachable:
            outcome = Outcome.HIT
        else:
            outcome = Outcome.PARTIAL
        lookup.end(outcome, tokens_hit=matched, tokens_local=num_computed_tokens, pages=matched // block_size, bytes=0)
        return matched, load_async

    def get_external_cache_hit_sources(self, request: Request, num_external_tokens: int) -> dict[CacheHitSource, int]:
        return self._inner.get_external_cache_hit_sources(request, num_external_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self._inner.update_state_after_alloc(request, blocks, num_external_tokens)
        if num_external_tokens > 0:
            self._loads[request.request_id] = num_external_tokens

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        inner_meta = self._inner.build_connector_meta(scheduler_output)
        return KVAuditMetadata(inner_meta, self._plans(scheduler_output))

    def _plans(self, scheduler_output: SchedulerOutput) -> list[RequestPlan]:
        plans = []
        for new_request in scheduler_output.scheduled_new_reqs:
            request = self._requests.get(new_request.req_id)
            if request is not None and new_request.block_ids:
                plans.append(self._plan(request, list(new_request.block_ids[0])))
        cached = scheduler_output.scheduled_cached_reqs
        for index, req_id in enumerate(cached.req_ids):
            request = self._requests.get(req_id)
            new_block_ids = cached.new_block_ids[index]
            if request is not None and req_id in cached.resumed_req_ids and new_block_ids:
                plans.append(self._plan(request, list(new_block_ids[0])))
        return plans

    def _plan(self, request: Request, block_ids: list[int]) -> RequestPlan:
        req_id = request.request_id
        return plan_for(request, block_ids, self._loads.pop(req_id, 0), self._local_tokens.get(req_id, 0))

    def on_new_request(self, request: Request) -> None:
        self._inner.on_new_request(request)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self._inner.update_connector_output(connector_output)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._forget(request.request_id)
        return self._inner.request_finished(request, block_ids)

    def _forget(self, req_id: str) -> None:
        self._requests.pop(req_id, None)
        self._local_tokens.pop(req_id, None)
        self._loads.pop(req_id, None)

    def register_finished_partial_tail(
        self, request: Request, block_ids: tuple[list[int], ...], partial_tail_offloads: list[tuple[int, int, int]]
    ) -> bool:
        return self._inner.register_finished_partial_tail(request, block_ids, partial_tail_offloads)

    def take_events(self) -> Iterable[KVCacheEvent]:
        return self._inner.take_events()

    def has_pending_block_frees(self) -> bool:
        return self._inner.has_pending_block_frees()

    def has_pending_push_work(self) -> bool:
        return self._inner.has_pending_push_work()

    def reset_cache(self) -> bool | None:
        return self._inner.reset_cache()


class KVAuditHMAConnector(KVAuditConnector, SupportsHMA):
    """`KVAuditConnector` for inner connectors that support the hybrid memory allocator."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        if not supports_hma(self._inner):
            raise ValueError(f"{type(self._inner).__name__} does not support HMA: wrap it with KVAuditConnector")

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._forget(request.request_id)
        assert isinstance(self._inner, SupportsHMA)
        return self._inner.request_finished_all_groups(request, block_ids)
