"""`KVAuditScheduler`: the vLLM hook's half in the EngineCore process (the scheduler's calls).

It traces a `kvaudit.lookup` span per `get_num_new_matched_tokens`, naming the prompt's
pages (docs/design.md section 3.5), and sends the workers the plans of the requests a
step schedules (page keys, block ids, request id, trace context) in the connector
metadata (`build_connector_meta`). Each observing method calls the inner connector's own
once with the same arguments and returns its answer (`build_connector_meta` wraps it
where the step plans a request). What vLLM's scheduler calls where kvaudit observes
nothing (`STRAIGHT_SCHEDULER`) is the inner connector's method itself: that thread
schedules every step, and on one GPU runs the model too.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata, SupportsHMA

from kvaudit.contract import Hook, Op, Outcome, PageDescriptor, SpanAttr, Tier
from kvaudit.hooks.vllm import lmcache_layer, lmcache_mp_layer
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
from kvaudit.hooks.vllm.role import KVAuditRole
from kvaudit.hooks.vllm.settings import AuditSettings

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)
# What vLLM's scheduler calls once a step, or once a request as it arrives, is scheduled or
# finishes, where kvaudit observes nothing: the inner connector's methods, no frame between.
STRAIGHT_SCHEDULER = (
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


class KVAuditScheduler(KVAuditRole):
    """Looks requests up and plans them; keeps the requests looked up and not finished."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        settings: AuditSettings,
        inner: KVConnectorBase_V1,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config, settings, inner, None, kv_cache_config)
        # A request not recorded is still planned where its pages are still judged (the guard)
        # or stamped for other replicas' guards: only the spans are left out.
        self._plan_all = settings.guard or settings.stamp_dir is not None
        # Requests looked up and not finished, and the loads planned.
        self._requests: dict[str, Request] = {}
        self._local_tokens: dict[str, int] = {}
        self._loads: dict[str, int] = {}
        # Block ids of the requests allocated for a load this step: an asynchronous load is
        # scheduled steps later, so its block table is not in the step's output (`plans`).
        self._allocated: dict[str, list[int]] = {}
        # With `prevent`: the tag every request's LMCache keys carry (in-process LMCache), or
        # the fingerprint its cache salt carries (LMCache's multiprocess connector).
        self._prevent_tag: dict[str, str] | None = None
        self._prevent_salt: str | None = None
        if settings.prevent:
            if self._mp is not None:
                self._prevent_salt = self._observed(
                    lmcache_mp_layer.prevent_salt_fingerprint, vllm_config, self._format.layout
                )
            else:
                self._prevent_tag = self._request_tag(vllm_config)

    def calls(self) -> dict[str, Callable[..., Any]]:
        calls = {
            **self._straight(STRAIGHT_SCHEDULER),
            "get_num_new_matched_tokens": self.get_num_new_matched_tokens,
            "update_state_after_alloc": self.update_state_after_alloc,
            "build_connector_meta": self.build_connector_meta,
            "request_finished": self.request_finished,
            "request_finished_all_groups": self.request_finished_all_groups,
        }
        if self._prevent_salt is not None and "on_new_request" in calls:
            # LMCache's eager prefetch looks a request up as it arrives: salted first.
            calls["on_new_request"] = self.on_new_request
        return calls

    def on_new_request(self, request: Request) -> Any:
        """With `prevent` around LMCache's multiprocess connector: the salt before its first lookup."""
        assert self._prevent_salt is not None
        self._observed(lmcache_mp_layer.salt_request, request, self._prevent_salt)
        return self._inner.on_new_request(request)

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

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        if self._prevent_tag is not None:
            # Before LMCache reads the request's configuration (lookup, then its tracker).
            self._observed(tag_request, request, self._prevent_tag)
        elif self._prevent_salt is not None:
            self._observed(lmcache_mp_layer.salt_request, request, self._prevent_salt)
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
            # Where a layer below knows the request by vLLM's internal id (LMCache's MP server).
            {SpanAttr.ENGINE_REQUEST_ID: request.request_id} if self._mp is not None else None,
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
                **self._geometry.group_fields,
            )
            for index, key in enumerate(hex_keys(hashes))
        ]

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> Any:
        answer = self._inner.update_state_after_alloc(request, blocks, num_external_tokens)
        if num_external_tokens > 0:
            self._loads[request.request_id] = num_external_tokens
            if request.request_id in self._requests:
                block_ids = self._observed(_first_group, blocks)
                if block_ids is not None:
                    self._allocated[request.request_id] = block_ids
        return answer

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        inner_meta = self._inner.build_connector_meta(scheduler_output)
        allocated, self._allocated = self._allocated, {}
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
                allocated.pop(req_id, None)
        # Loads allocated this step whose request the step does not run (asynchronous loads:
        # the inner connector starts them now, the request runs once they are done).
        for req_id, block_ids in allocated.items():
            request = self._requests.get(req_id)
            if request is not None:
                plans.append(
                    plan_for(request, block_ids, self._loads.pop(req_id, 0), self._local_tokens.get(req_id, 0))
                )
        # A step with no plan (a decode step, one that collects finished requests) sends the
        # inner connector's metadata as it is: where the workers run in processes of their own,
        # vLLM pickles it to them and each unpickles it on its serving thread, where a wrapper
        # around it would be one more object to copy at every step.
        return KVAuditMetadata(inner_meta, plans) if plans else inner_meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._forget(request.request_id)
        return self._inner.request_finished(request, block_ids)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """The hybrid memory allocator's `request_finished` (`KVAuditHMAConnector` only)."""
        self._forget(request.request_id)
        assert isinstance(self._inner, SupportsHMA)
        return self._inner.request_finished_all_groups(request, block_ids)

    def _forget(self, req_id: str) -> None:
        self._allocated.pop(req_id, None)
        self._requests.pop(req_id, None)
        self._local_tokens.pop(req_id, None)
        self._loads.pop(req_id, None)


def _first_group(blocks: KVCacheBlocks) -> list[int]:
    """The block ids of the first KV cache group of an allocation (as `full_block_tables` reads them)."""
    return list(blocks.get_block_ids()[0])
