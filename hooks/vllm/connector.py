"""`KVAuditConnector`: a V1 KV connector that wraps another one and traces what it does.

How it is built, for those who build on it:

- `forward_interface` (`delegation`) forwards every member of the running vLLM's
  `KVConnectorBase_V1` that this class does not define to the wrapped connector
  (`self._inner`): instance methods and properties to the instance, class-level hooks
  to its class with the inner configuration, and `kv_cache_access` through vLLM's
  factory (its `LMCacheMPConnector` special case). Nothing is forwarded by hand, so a
  member a vLLM release adds is forwarded too; tests/test_vllm_versions.py checks each
  member of each supported release.
- The methods defined here are the ones the wrapper observes, each of which calls the
  inner connector's own exactly once with the same arguments (the wrapper's metadata
  replaced by the inner's) and returns its answer (`build_connector_meta` wraps it
  where the step plans a request, `get_block_ids_with_load_errors` adds the guard's
  rejected blocks):

  Scheduler side (EngineCore process): a `kvaudit.lookup` span per
  `get_num_new_matched_tokens`, naming the prompt's pages (docs/design.md section
  3.5), and the request plans (page keys, block ids, request
  id, trace context) added to the connector metadata (`build_connector_meta`).
  Worker side (each Worker process): a `kvaudit.fetch` span per load and a
  `kvaudit.store` span per save, with one page descriptor per block. With `guard` on,
  fetched pages that fail the in-process checks are reported through
  `get_block_ids_with_load_errors()` so vLLM recomputes them (with
  `kv_load_failure_policy="recompute"`), and say `used=false`.
- What depends on the vLLM release is read where it is used: the supported range in
  `version`, the scheduler output in `plans.full_block_tables`.
- What a fetched page is, is read from the inner connector's objects by `formats`.
"""

from __future__ import annotations

import atexit
import functools
import logging
import time
from collections.abc import Callable
from itertools import filterfalse
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import vllm
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
    supports_hma,
)

from kvaudit.contract import Hook, Op, Outcome, PageDescriptor, Tier
from kvaudit.emit.emitter import UNRECORDED, Emitter, Operation
from kvaudit.emit.setup import setup_emitter
from kvaudit.guard import violations
from kvaudit.hooks.vllm import lmcache_layer
from kvaudit.hooks.vllm.delegation import forward_interface, note_inner_class
from kvaudit.hooks.vllm.geometry import EngineGeometry, engine_geometry
from kvaudit.hooks.vllm.inner_formats import InnerFormat, Unit, format_for, page_skeletons
from kvaudit.hooks.vllm.plans import (
    KVAuditMetadata,
    RequestPlan,
    external_request_id,
    full_block_tables,
    hex_keys,
    plan_for,
    remote_parent,
    trace_parent,
)
from kvaudit.hooks.vllm.prevent import request_tag, tag_request
from kvaudit.hooks.vllm.settings import AuditSettings, inner_vllm_config
from kvaudit.hooks.vllm.stamps import apply_stamp, read_stamp, write_stamp
from kvaudit.hooks.vllm.version import check_vllm_version
from kvaudit.sampling import request_sampler

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)
_T = TypeVar("_T")
_IS_STORE = attrgetter("is_store")
# Calls kvaudit observes nothing in and that are never given its metadata, bound straight
# to the inner connector's own methods, no forwarder frame in between (docs/design.md
# section 5: what the serving thread pays). In a worker: at every layer (tens a step on a
# large model; vLLM asks `has_connector_metadata` before each layer's load and save), or
# once a step to collect the inner connector's results or to end the step (the step's
# state is reset where the next one binds its metadata).
_STRAIGHT = (
    "has_connector_metadata",
    "wait_for_layer_load",
    "save_kv_layer",
    "clear_connector_metadata",
    "get_finished",
    "get_transfer_results",
    "get_kv_connector_stats",
    "get_kv_connector_kv_cache_events",
    "build_connector_worker_meta",
)
# The worker's calls of a step that kvaudit observes only in a step with a unit to load or
# store: in any other step (a decode step, one that only collects finished requests) each is
# bound straight to the inner connector's method, from that step's `bind_connector_metadata`
# on (`_pass_step_through`); a rejected block is reported in the step that rejected it.
_STRAIGHT_WITHOUT_UNITS = ("start_load_kv", "wait_for_save", "get_block_ids_with_load_errors")
# On the scheduler side (the thread that schedules every step): once a step, or once a
# request as it arrives, is scheduled or finishes.
_STRAIGHT_SCHEDULER = (
    "get_kv_connector_stats",
    "on_new_request",
    "may_load_async",
    "get_external_cache_hit_sources",
    "get_loaded_kv_cache_group_ids",
    "update_connector_output",
    "take_events",
    "has_pending_block_frees",
    "has_pending_push_work",
    "register_finished_partial_tail",
)


def _tp_rank(vllm_config: VllmConfig) -> int:
    """This worker's tensor-parallel rank (0 without tensor parallelism, where no group may exist)."""
    if vllm_config.parallel_config.tensor_parallel_size == 1:
        return 0
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


def _role_mismatch(outer: KVTransferConfig, inner: KVTransferConfig) -> str | None:
    """Why vLLM's reading of the wrapper's KV roles differs from the inner connector's, or None.

    vLLM reads `is_kv_producer` / `is_kv_consumer` off the configuration it was given,
    which names KVAuditConnector and so has one `kv_role`; since 0.34 a MultiConnector's
    roles come from its children instead, which only the inner configuration shows.
    """
    roles = (outer.is_kv_producer, outer.is_kv_consumer)
    inner_roles = (inner.is_kv_producer, inner.is_kv_consumer)
    if roles == inner_roles:
        return None
    kv_role = {(True, True): "kv_both", (True, False): "kv_producer", (False, True): "kv_consumer"}.get(inner_roles)
    return (
        f"kvaudit: vLLM takes the KV roles from kv_role={outer.kv_role!r} (producer={roles[0]}, consumer={roles[1]}), "
        f"while {inner.kv_connector}'s own configuration makes it producer={inner_roles[0]}, "
        f"consumer={inner_roles[1]}; set kv_role={kv_role!r} next to kv_connector='{outer.kv_connector}'"
    )


@forward_interface(KVConnectorBase_V1)
class KVAuditConnector(KVConnectorBase_V1):
    """Wraps the connector named in `kv_connector_extra_config["kvaudit"]["wrap"]`.

    Use `KVAuditHMAConnector` to wrap a connector that supports the hybrid memory
    allocator: vLLM decides on HMA from the connector class before it exists.
    """

    UNFORWARDED: tuple[str, ...] = ()  # filled by forward_interface

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        refusal = check_vllm_version()
        if refusal is not None:
            raise RuntimeError(refusal)
        assert vllm_config.kv_transfer_config is not None
        self._settings = AuditSettings.from_extra_config(vllm_config.kv_transfer_config.kv_connector_extra_config)
        worker = role == KVConnectorRole.WORKER
        inner_config = lmcache_layer.inner_config(
            inner_vllm_config(vllm_config, self._settings), self._settings, worker
        )
        # The inner connector first: the forwarders read it from the start.
        self._inner = KVConnectorFactory.create_connector(inner_config, role, kv_cache_config)
        note_inner_class(type(self._inner))
        super().__init__(vllm_config, role, kv_cache_config)
        self._geometry: EngineGeometry = engine_geometry(vllm_config, _tp_rank(vllm_config) if worker else None)
        # LMCache's format, where it is the inner connector's (`_layer`): its units join the LMCache hook's.
        self._layer = lmcache_layer.format_for(self._inner, self._geometry)
        self._format: InnerFormat = self._layer or format_for(self._inner, self._geometry)
        self._kv = self._geometry.kv_config(self._format.layout)
        # What this replica reads a page as: the reference the guard compares fetched pages with.
        self._expected = PageDescriptor.from_config(self._kv, shape=self._geometry.page_shape)
        self._emitter: Emitter = setup_emitter(
            self._settings.replica,
            self._settings.export,
            engine="vllm",
            engine_version=vllm.__version__,
            service_name="vllm",
            kv=self._kv,
            sample_rate=self._settings.sample_rate,
        )
        atexit.register(self._emitter.shutdown)
        # Which requests are recorded (None: all), by vLLM's request id, as LMCache's hook chooses.
        self._sampler = request_sampler(self._settings.sample_rate)
        # A request not recorded is still planned where its pages are still judged (the guard)
        # or stamped for other replicas' guards: only the spans are left out.
        self._plan_all = self._settings.guard or self._settings.stamp_dir is not None
        # Scheduler side: requests looked up and not finished, and the loads planned.
        self._requests: dict[str, Request] = {}
        self._local_tokens: dict[str, int] = {}
        self._loads: dict[str, int] = {}
        # Worker side: this step's units, stores in flight, rejected blocks, KV caches.
        self._units: list[Unit] = []
        self._stores_open = False  # this step's store spans are started
        self._stores: dict[int, Operation] = {}
        self._load_errors: set[int] = set()
        self._kv_caches: dict[str, torch.Tensor] = {}
        self._observation_failed = False
        for name in _STRAIGHT if worker else _STRAIGHT_SCHEDULER:
            # Only what the running vLLM's base class declares (and so calls).
            if hasattr(KVConnectorBase_V1, name):
                setattr(self, name, getattr(self._inner, name))
        if worker and type(self._inner).handle_preemptions is KVConnectorBase_V1.handle_preemptions:
            # vLLM's no-op, called at every step before the step's metadata is bound: straight
            # to it (it ignores the metadata, so the wrapper's may reach it), no forwarder frame.
            self.handle_preemptions = self._inner.handle_preemptions  # type: ignore[method-assign]
        # Worker side: the step's calls go straight to the inner connector's until a step has a unit.
        self._without_units = {name: getattr(self._inner, name) for name in _STRAIGHT_WITHOUT_UNITS} if worker else {}
        self._passed_through = False
        if worker:
            self._pass_step_through(True)
        # Scheduler side with `prevent`: the tag every request's LMCache keys carry.
        self._prevent_tag: dict[str, str] | None = None
        if not worker:
            self._check_configuration(inner_config.kv_transfer_config)
            if self._settings.prevent:
                self._prevent_tag = self._request_tag(vllm_config)

    def _check_configuration(self, inner: KVTransferConfig) -> None:
        """Log, once per engine, settings that make the wrapped engine behave otherwise than intended."""
        outer = self._kv_transfer_config
        if self._settings.guard and outer.kv_load_failure_policy == "fail":
            logger.warning(
                "kvaudit guard is on but kv_load_failure_policy='fail': a rejected page fails its "
                "request instead of being recomputed; set kv_load_failure_policy='recompute'"
            )
        mismatch = _role_mismatch(outer, inner)
        if mismatch is not None:
            logger.warning(mismatch)

    def _request_tag(self, vllm_config: VllmConfig) -> dict[str, str] | None:
        """The geometry tag for `prevent`, or None (said once) where it cannot be had: fail open,
        the keys stay LMCache's own and the guard still applies."""
        if not lmcache_layer.wraps_lmcache(type(self._inner)):
            logger.warning(
                "kvaudit prevent puts the geometry into LMCache's keys: %s is not LMCache's connector, prevent is off",
                type(self._inner).__name__,
            )
            return None
        return self._observed(request_tag, vllm_config)

    # ---- worker side ----

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> Any:
        # The step's state starts here. The wrapper keeps no metadata of its own (vLLM's
        # base class would): `has_connector_metadata` is the inner connector's, and
        # `clear_connector_metadata` goes straight to it.
        self._stores_open = False
        if type(connector_metadata) is KVAuditMetadata:  # no subclass; an ABC's isinstance is a Python call
            inner, plans = connector_metadata.inner, connector_metadata.plans
        else:
            # A step with no plan: the scheduler sent the inner connector's metadata as it is
            # (`build_connector_meta`); a format may still follow a request planned before.
            inner, plans = connector_metadata, []
        try:  # `_observed`, written out: one call fewer at every step
            self._units = self._format.units(inner, plans)
        except Exception as exc:
            self._units = []
            self._failed(self._format.units, exc)
        through = not self._units
        if through is not self._passed_through:  # looked at here: a call a step costs more
            self._pass_step_through(through)
        return self._inner.bind_connector_metadata(inner)

    def _pass_step_through(self, through: bool) -> None:
        """Bind the step's calls (`_STRAIGHT_WITHOUT_UNITS`) straight to the inner connector's
        methods, or back to the wrapper's; called only where a step differs from the one before,
        so that a run of decode steps pays nothing for it (bench/README.md, "The steps with
        nothing to observe")."""
        self._passed_through = through
        if through:
            vars(self).update(self._without_units)
        else:
            for name in self._without_units:
                del vars(self)[name]

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> Any:
        self._kv_caches = kv_caches
        return self._inner.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> Any:
        # A step with units (others call the inner connector's method: `_pass_step_through`).
        loads = list(filterfalse(_IS_STORE, self._units))  # no Python frame, unlike a comprehension
        if not loads:
            answer = self._inner.start_load_kv(forward_context, **kwargs)
            self._open_stores()
            return answer
        fetches = [self._operation(Op.FETCH, unit) for unit in loads]
        layer = self._layer
        # Described before the load: the guard decides on what the objects say, not on
        # what the inner connector did with them. LMCache's blocks are judged by the
        # chunks its hook reports during the load instead.
        described = [] if layer is not None else [self._describe_fetch(unit) for unit in loads]
        try:
            answer = self._inner.start_load_kv(forward_context, **kwargs)
        except BaseException:
            for fetch in fetches:
                fetch.end(Outcome.ERROR)
            raise
        if layer is not None:
            for unit, fetch in zip(loads, fetches):
                self._finish_layered_fetch(layer, unit, fetch)
        for unit, fetch, pages in zip(loads, fetches, described):
            self._finish_fetch(unit, fetch, pages)
        self._open_stores()
        return answer

    def _finish_layered_fetch(self, layer: lmcache_layer.LMCacheFormat, unit: Unit, fetch: Operation) -> None:
        """End a fetch LMCache served; its blocks' descriptors are made on the exporter thread."""
        try:  # `_observed`, written out: one call fewer a fetch
            rejected: list[int] | None = layer.finish_fetch(unit, fetch, self._settings.guard)
        except Exception as exc:
            rejected = None
            self._failed(layer.finish_fetch, exc)
        if rejected is None:
            # The hook's own failure: unchecked is unused where the guard is on.
            fetch.end(Outcome.ERROR)
            first = unit.token_start // self._geometry.block_size
            blocks = unit.plan.block_ids[first : first + unit.num_tokens // self._geometry.block_size]
            rejected = blocks if self._settings.guard else []
        self._load_errors.update(rejected)

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
            self._failed(describe, exc)
            return None

    def _failed(self, describe: Callable[..., Any], exc: Exception) -> None:
        """Say once that one of the hook's observations failed."""
        if not self._observation_failed:
            self._observation_failed = True
            logger.warning("kvaudit: %s failed (%r); serving continues", describe.__name__, exc, exc_info=True)

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

    def wait_for_save(self) -> Any:
        if not self._stores_open:  # where the step's `start_load_kv` did not open them
            self._open_stores()
        try:
            answer = self._inner.wait_for_save()
        except BaseException:
            for store in self._stores.values():
                store.end(Outcome.ERROR)
            self._stores.clear()
            raise
        for unit in self._units:
            store = self._stores.pop(id(unit), None)
            if store is None:
                continue
            if self._settings.stamp_dir is None:
                # A store's pages come from its plan and the engine's configuration, which
                # do not change: they are described on the exporter thread.
                store.end(
                    tokens_stored=unit.num_tokens,
                    describe=functools.partial(self._format.describe_store, unit, self._kv_caches),
                )
                continue
            pages = self._observed(self._format.describe_store, unit, self._kv_caches) or []
            for page in pages:
                store.add_page(page)
            self._stamp([page.key for page in pages if page.key])
            store.end(tokens_stored=unit.num_tokens)
        return answer

    def _open_stores(self) -> None:
        """Start a store span for each store unit of the step, once a step: when its forward
        pass begins (the end of `start_load_kv`, before the first layer is saved), else at
        `wait_for_save`."""
        self._stores_open = True
        for unit in self._units:
            if unit.is_store and id(unit) not in self._stores:
                self._stores[id(unit)] = self._operation(Op.STORE, unit)

    def _stamp(self, keys: list[str]) -> None:
        assert self._settings.stamp_dir is not None
        try:
            write_stamp(self._settings.stamp_dir, keys, self._kv)
        except OSError as exc:
            logger.warning("kvaudit: cannot write stamp to %s: %s", self._settings.stamp_dir, exc)

    def _operation(self, op: Op, unit: Unit) -> Operation:
        sampler = self._sampler
        if sampler is not None and not sampler(unit.plan.req_id):
            # A request not recorded: the guard still judges it; a layer below records nothing for it.
            if self._layer is not None:
                self._layer.join(unit, UNRECORDED)
            return UNRECORDED
        traced = unit.plan.trace_parent
        operation = self._emitter.operation(
            op,
            hook=Hook.VLLM_CONNECTOR,
            request_id=unit.plan.request_id,
            backend=self._format.backend,
            tokens_requested=unit.num_tokens,
            parent=remote_parent(traced) if traced is not None else None,  # a call fewer for most
        )
        if self._layer is not None:
            self._layer.join(unit, operation)
        return operation

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors = self._inner.get_block_ids_with_load_errors()
        if not self._load_errors:
            return errors
        rejected, self._load_errors = self._load_errors, set()
        return set(errors) | rejected

    def shutdown(self) -> Any:
        try:
            return self._inner.shutdown()
        finally:
            self._emitter.shutdown()

    # ---- scheduler side ----

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        if self._prevent_tag is not None:
            # Before LMCache reads the request's configuration (lookup, then its tracker).
            self._observed(tag_request, request, self._prevent_tag)
        sampler = self._sampler
        if sampler is not None and not sampler(request.request_id):
            # A request not recorded (docs/design.md section 3.10): planned only where its pages
            # are judged or stamped, else left to the inner connector alone (written out here:
            # a frame fewer for each such request).
            answer = self._inner.get_num_new_matched_tokens(request, num_computed_tokens)
            if self._plan_all:
                self._requests[request.request_id] = request
                self._local_tokens[request.request_id] = num_computed_tokens
            return answer
        # A request that arrived with a W3C trace context: its lookup is a span of that trace,
        # as its loads and saves are (their plans carry the context to the workers). Its
        # headers are looked at here first, so that an untraced request makes no call.
        traced = request.trace_headers
        started = time.time_ns()
        try:
            matched, load_async = self._inner.get_num_new_matched_tokens(request, num_computed_tokens)
        except BaseException:
            self._record_lookup(request, traced, started, Outcome.ERROR, (None, None, None, None, None))
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
        # The prompt's pages are described on the exporter thread, from a copy of its block
        # hashes taken now (vLLM appends to the request's list as the request runs); read
        # directly, as `plan_for` reads them, where a function of their own was two frames.
        hashes = request.block_hashes[: reachable // block_size]
        self._record_lookup(
            request,
            traced,
            started,
            outcome,
            (matched, None, num_computed_tokens, matched // block_size, 0),
            functools.partial(self._prompt_pages, hashes, num_computed_tokens) if hashes else None,
        )
        return matched, load_async

    def _record_lookup(
        self,
        request: Request,
        traced: Any,
        started: int,
        outcome: Outcome,
        amounts: tuple[int | None, int | None, int | None, int | None, int | None],
        describe: Callable[[], list[PageDescriptor]] | None = None,
    ) -> None:
        """The request's `kvaudit.lookup` span, in one call once the lookup returned
        (`Emitter.record`); a request that arrived with a trace context is its child."""
        self._emitter.record(
            Op.LOOKUP,
            Hook.VLLM_CONNECTOR,
            external_request_id(request.request_id),
            self._format.backend,
            request.num_prompt_tokens,
            remote_parent(self._observed(trace_parent, traced)) if traced else None,
            started,
            outcome,
            amounts,
            describe,
        )

    def _prompt_pages(self, hashes: list[bytes], local_tokens: int) -> list[PageDescriptor]:
        """The prompt's blocks vLLM could reuse (`hashes`, those of its full blocks up to the
        last computed token), as a lookup names them (docs/design.md section 3.5): key, hash
        algorithm and tokens; `tier=gpu` for those already in its prefix cache."""
        size, algo = self._geometry.block_size, self._geometry.hash_algo
        return [
            PageDescriptor(
                key=key,
                hash_algo=algo,
                token_start=index * size,
                token_end=(index + 1) * size,
                tier=Tier.GPU.value if (index + 1) * size <= local_tokens else None,
            )
            for index, key in enumerate(hex_keys(hashes))
        ]

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> Any:
        answer = self._inner.update_state_after_alloc(request, blocks, num_external_tokens)
        if num_external_tokens > 0:
            self._loads[request.request_id] = num_external_tokens
        return answer

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        inner_meta = self._inner.build_connector_meta(scheduler_output)
        if not self._requests:
            # No request to plan (none looked up and unfinished is recorded, or judged): the
            # step's requests are not walked (a sampled replica's usual step).
            return inner_meta
        # The plans of the requests whose whole block table the step carries (written out
        # here: a call fewer at every step).
        plans: list[RequestPlan] = []
        for req_id, block_ids in full_block_tables(scheduler_output):
            request = self._requests.get(req_id)
            if request is not None:
                plans.append(
                    plan_for(request, block_ids, self._loads.pop(req_id, 0), self._local_tokens.get(req_id, 0))
                )
        # A step with no plan (a decode step, one that collects finished requests) sends the
        # inner connector's metadata as it is: where the workers run in processes of their own,
        # vLLM pickles it to them and each unpickles it on its serving thread, and a wrapper
        # took 8-9 µs more a step there with the caches cold (bench/README.md, "The metadata
        # kvaudit sends").
        return KVAuditMetadata(inner_meta, plans) if plans else inner_meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._forget(request.request_id)
        return self._inner.request_finished(request, block_ids)

    def _forget(self, req_id: str) -> None:
        self._requests.pop(req_id, None)
        self._local_tokens.pop(req_id, None)
        self._loads.pop(req_id, None)


@forward_interface(SupportsHMA)
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
