"""`KVAuditWorker`: the vLLM hook's half in each Worker process (the model runner's calls).

It traces a `kvaudit.fetch` span per load and a `kvaudit.store` span per save, with one
page descriptor per block, from the plans the scheduler's half sends in the step's
metadata. With `guard` on, fetched pages that fail the in-process checks are reported
through `get_block_ids_with_load_errors()` so vLLM recomputes them (with
`kv_load_failure_policy="recompute"`), and say `used=false`. Each observing method calls
the inner connector's own once with the same arguments (the wrapper's metadata replaced
by the inner's) and returns its answer (`get_block_ids_with_load_errors` adds the
guard's rejected blocks).

What vLLM calls at every layer or step where kvaudit observes nothing (`STRAIGHT_WORKER`)
is the inner connector's method itself, with no frame of kvaudit's in between: these
calls run on the thread that serves the model. So are the step's calls that kvaudit
observes only in a step with a unit to load or store (`STRAIGHT_WHEN_IDLE`), in any
other step: each step's `bind_connector_metadata` chooses which (`_expose_step`).
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from itertools import filterfalse
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

from kvaudit.contract import Hook, Op, Outcome, PageDescriptor, SpanAttr
from kvaudit.emit.emitter import UNRECORDED, Operation
from kvaudit.guard import violations
from kvaudit.hooks.vllm import lmcache_layer
from kvaudit.hooks.vllm.inner_formats import Unit, page_skeletons
from kvaudit.hooks.vllm.plans import KVAuditMetadata, remote_parent
from kvaudit.hooks.vllm.role import KVAuditRole
from kvaudit.hooks.vllm.settings import AuditSettings
from kvaudit.hooks.vllm.stamps import apply_stamp, read_stamp, write_stamp

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = logging.getLogger(__name__)
_IS_STORE = attrgetter("is_store")
# Calls kvaudit observes nothing in and that are never given its metadata: at every layer
# (tens a step on a large model; vLLM asks `has_connector_metadata` before each layer's load
# and save), or once a step to collect the inner connector's results or to end the step (the
# step's state is reset where the next one binds its metadata).
STRAIGHT_WORKER = (
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
# The step's calls kvaudit observes only in a step with a unit to load or store; in any other
# step (a decode step, one that only collects finished requests) the inner connector's own. A
# rejected block is reported in the step that rejected it, so such a step has none to add.
STRAIGHT_WHEN_IDLE = ("start_load_kv", "wait_for_save", "get_block_ids_with_load_errors")
# Refused keys remembered so as not to stamp them (the oldest forgotten past this bound).
_MAX_REFUSED = 65536


def _tp_rank(vllm_config: VllmConfig) -> int:
    """This worker's tensor-parallel rank (0 without tensor parallelism, where no group may exist)."""
    if vllm_config.parallel_config.tensor_parallel_size == 1:
        return 0
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


class KVAuditWorker(KVAuditRole):
    """Traces and guards each step's loads and stores; keeps the step's units and stores in flight.

    `expose` makes a set of calls what vLLM reaches by their names (the connector's
    `_expose`): called where a step with a unit follows one without, or the other way round.
    """

    def __init__(
        self,
        vllm_config: VllmConfig,
        settings: AuditSettings,
        inner: KVConnectorBase_V1,
        expose: Callable[[Mapping[str, Callable[..., Any]]], None],
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config, settings, inner, _tp_rank(vllm_config), kv_cache_config)
        # What this replica reads a page as: the reference the guard compares fetched pages with
        # (LMCache's multiprocess objects hold a block in their own shape).
        shape = self._mp.page_shape if self._mp is not None else self._geometry.page_shape
        self._expected = PageDescriptor.from_config(self._kv, shape=shape)
        # Keys whose fetched block the guard refused: this replica recomputes and may store them
        # again, and must not stamp its own geometry over the producer's.
        self._refused: OrderedDict[str, None] = OrderedDict()
        # This step's units, stores in flight, rejected blocks; the KV caches.
        self._units: list[Unit] = []
        self._stores_open = False  # this step's store spans are started
        self._stores: dict[int, Operation] = {}
        self._load_errors: set[int] = set()
        self._kv_caches: dict[str, torch.Tensor] = {}
        # The step's calls in a step with nothing to observe, and in one with a unit.
        self._expose = expose
        self._idle_calls = self._straight(STRAIGHT_WHEN_IDLE)
        self._step_calls = {name: getattr(self, name) for name in STRAIGHT_WHEN_IDLE}
        self._idle = True  # until a step has a unit

    def calls(self) -> dict[str, Callable[..., Any]]:
        calls = {
            **self._straight(STRAIGHT_WORKER),
            "bind_connector_metadata": self.bind_connector_metadata,
            "register_kv_caches": self.register_kv_caches,
            **self._idle_calls,
        }
        if type(self._inner).handle_preemptions is KVConnectorBase_V1.handle_preemptions:
            # vLLM's no-op, called at every step before the step's metadata is bound: straight
            # to it (it ignores the metadata, so the wrapper's may reach it).
            calls["handle_preemptions"] = self._inner.handle_preemptions
        return calls

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
        idle = not self._units
        if idle is not self._idle:  # looked at here: a call a step costs more
            self._expose_step(idle)
        return self._inner.bind_connector_metadata(inner)

    def _expose_step(self, idle: bool) -> None:
        """Have the step's calls (`STRAIGHT_WHEN_IDLE`) reach the inner connector's methods in a
        step with nothing to observe, this half's in one with a unit; called only where a step
        differs from the one before, so that a run of decode steps pays nothing for it."""
        self._idle = idle
        self._expose(self._idle_calls if idle else self._step_calls)

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> Any:
        self._kv_caches = kv_caches
        return self._inner.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> Any:
        # A step with units (in others vLLM calls the inner connector's method: `_expose_step`).
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
            pages = page_skeletons(unit, self._geometry, {"hash_algo": self._geometry.hash_algo})
        return pages

    def _finish_fetch(self, unit: Unit, fetch: Operation, pages: list[PageDescriptor]) -> None:
        stamp = read_stamp(self._settings.stamp_dir, [page.key for page in pages if page.key])
        first_rejected: int | None = None
        for index, page in enumerate(pages):
            apply_stamp(page, stamp)
            if first_rejected is None and (
                # A page a layer below in this process served (LMCache's engine) carries that
                # layer's verdict on it; one LMCache's MP server served is judged here.
                not page.used
                if page.source_key is not None and self._mp is None
                else self._settings.guard and bool(violations(page, self._expected))
            ):
                first_rejected = index
        block_size = self._geometry.block_size
        for index, page in enumerate(pages):
            # vLLM recomputes from the first rejected block on: later pages are not used either.
            page.used = first_rejected is None or index < first_rejected
            if not page.used:
                if page.key is not None and self._settings.stamp_dir is not None:
                    self._refused[page.key] = None
                    if len(self._refused) > _MAX_REFUSED:
                        self._refused.popitem(last=False)
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
        if self._refused:
            keys = [key for key in keys if key not in self._refused]
        try:
            # A format whose objects do not say how they moved stamps it (LMCache's MP connector).
            write_stamp(self._settings.stamp_dir, keys, self._kv, getattr(self._format, "stamp_transfer", None))
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
            # Where a layer below knows the request by vLLM's internal id (LMCache's MP server).
            attributes={SpanAttr.ENGINE_REQUEST_ID: unit.plan.req_id} if self._mp is not None else None,
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
