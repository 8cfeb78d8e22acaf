"""What the scheduler side knows about a request and the worker side needs to describe its pages.

The connector's scheduler side runs in the EngineCore process and its worker side in
each Worker process: page keys (vLLM's block hashes), block ids, the external request
id and the request's trace context travel to the workers inside the connector
metadata, next to the inner connector's own metadata.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Final

import msgspec
from opentelemetry.trace import SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from vllm import envs
from vllm.distributed.kv_transfer.kv_connector.utils import yield_req_data
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

# vLLM appends "-" and 8 random characters to the id a client gave (InputProcessor.
# assign_request_id); its `llm_request` span carries the client's id as gen_ai.request.id.
_RANDOM_SUFFIX_LEN: Final = 9
_PROPAGATOR: Final = TraceContextTextMapPropagator()
_REQ_ID: Final = attrgetter("req_id")


class RequestPlan(msgspec.Struct):
    """One scheduled request, as the worker side needs it (a struct: made in C, and pickled to
    the workers as its fields' values alone).

    Attributes:
        req_id: vLLM's internal request id (what connectors see).
        request_id: the id vLLM's own `llm_request` span carries as `gen_ai.request.id`.
        keys: hex block hashes of the request's full blocks, in token order.
        block_ids: the request's KV block ids (first KV cache group), in token order.
        load_tokens: tokens the inner connector was asked to load (0: not a load).
        local_tokens: prompt prefix already computed locally when it was looked up.
        trace_parent: (trace id, span id) of the context the request arrived with.
    """

    req_id: str
    request_id: str
    keys: list[str]
    block_ids: list[int]
    load_tokens: int = 0
    local_tokens: int = 0
    trace_parent: tuple[int, int] | None = None


@dataclass
class KVAuditMetadata(KVConnectorMetadata):
    """The inner connector's metadata for this step, plus the plans of the requests it covers.

    Told apart by its class alone (`type(metadata) is KVAuditMetadata`, on the serving
    threads: `isinstance` with vLLM's metadata ABC is a Python call), so it has no subclass.
    """

    inner: KVConnectorMetadata
    plans: list[RequestPlan] = field(default_factory=list)


@functools.cache
def ids_suffixed() -> bool:
    """Whether vLLM puts its random suffix on request ids: its own reading of its switch
    ("0" is off), once a process (a module attribute vLLM resolves through its module's
    `__getattr__`, a Python call with the caches cold, would cost that at every request)."""
    return not envs.VLLM_DISABLE_REQUEST_ID_RANDOMIZATION


def external_request_id(req_id: str) -> str:
    """The client's request id, as vLLM's `llm_request` span reports it."""
    if not ids_suffixed() or len(req_id) <= _RANDOM_SUFFIX_LEN:
        return req_id
    return req_id[:-_RANDOM_SUFFIX_LEN] if req_id[-_RANDOM_SUFFIX_LEN] == "-" else req_id


def trace_parent(headers: Mapping[str, str]) -> tuple[int, int] | None:
    """The W3C trace context in a request's (non-empty) `trace_headers`, so kvaudit spans
    join its trace. Callers look at the headers first: an untraced request makes no call."""
    from opentelemetry.trace import get_current_span

    span_context = get_current_span(_PROPAGATOR.extract(headers)).get_span_context()
    return (span_context.trace_id, span_context.span_id) if span_context.is_valid else None


def remote_parent(trace_parent: tuple[int, int] | None) -> SpanContext | None:
    """The span context a request's spans are children of (`trace_parent`'s), or None."""
    if trace_parent is None:
        return None
    trace_id, span_id = trace_parent
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags.SAMPLED)


def hex_keys(block_hashes: Iterable[bytes]) -> list[str]:
    """Page keys of vLLM block hashes (`BlockHash`, bytes), in their order (a loop in C)."""
    return list(map(bytes.hex, block_hashes))


def plan_for(request: Request, block_ids: list[int], load_tokens: int, local_tokens: int) -> RequestPlan:
    headers = request.trace_headers  # looked at here: an untraced request makes no call
    return RequestPlan(
        req_id=request.request_id,
        request_id=external_request_id(request.request_id),
        keys=hex_keys(request.block_hashes),  # the request's full blocks, in token order
        block_ids=list(block_ids),
        load_tokens=load_tokens,
        local_tokens=local_tokens,
        trace_parent=trace_parent(headers) if headers else None,
    )


def full_block_tables(scheduler_output: SchedulerOutput) -> list[tuple[str, list[int]]]:
    """(request id, block ids of the first KV cache group) of each request whose whole
    block table this step carries: new requests and requests resumed after preemption.

    Read through vLLM's own `yield_req_data`, as in-tree connectors do: where resumed
    requests travel changed (0.32 and 0.33: the cached requests, marked in
    `resumed_req_ids`; 0.34: the new requests, and `resumed_req_ids` is gone), and so did
    the meaning of its third value: "resumed from preemption" in 0.32 (False for new
    requests), "is the whole block table" since 0.33 (True for new requests). On every
    supported release a request carries its whole table when it is new or that value is
    set; a step with neither a new nor a resumed request (a decode step) carries none, and
    is not walked.
    """
    new_requests = scheduler_output.scheduled_new_reqs
    if not new_requests and not getattr(scheduler_output.scheduled_cached_reqs, "resumed_req_ids", None):
        return []
    new = set(map(_REQ_ID, new_requests))  # a loop in C, where a set comprehension is a call
    return [
        (req_id, list(block_id_groups[0]))
        for req_id, block_id_groups, resumed_or_whole_table in yield_req_data(scheduler_output)
        if block_id_groups and (resumed_or_whole_table or req_id in new)
    ]
