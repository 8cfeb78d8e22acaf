"""Clocks inside a replica of the reference deployment, for bench_topology: never used unless named.

`ProbedLMCacheConnector` is the wrapped connector (`wrap_module_path="bench.topology_probe"`):
`CPULMCacheConnectorV1` (LMCache's connector with the CPU copy kernel), or, where
`$KVAUDIT_PROBE_CUDA` is set (`python -m bench.bench_topology --cuda`, on a machine with an
NVIDIA GPU), LMCache's own `LMCacheConnectorV1` with its CUDA copy kernel.
Imported in the vLLM worker when kvaudit's connector builds it, this module wraps, with
the CPU clock of the calling thread (what the hooks take from serving, whatever else
shares the cores) and, for the engine's transfers, the wall clock too:

- the wrapped connector's `start_load_kv`, and its `save_kv_layer` (each layer) and
  `wait_for_save`: the engine's fetch and store, LMCache's hook included;
- inside those, on the wall clock, the two parts of the transfer that another machine does at
  a speed of its own: the copy kernel (the CPU stand-in's `batched_from_gpu` and
  `batched_to_gpu`; not with `--cuda`) and the fetch's reads from the pool's server
  (`RemoteBackend.batched_get_blocking`);
- the LMCache hook's own work inside them and on LMCache's lookup thread (`fetch.finish`,
  `fetch.end_lookup`, the store plugin's `batched_submit_put_task`: each records a whole
  operation), taken off the engine's figure. The instrumentor's thin wrappers stay
  uncounted (around each wrapped method a call, a context variable, the link's lookup and
  the clock read where the operation begins, `_began`, and, where the deployment records a
  share of its requests, the sampler's choice; and a dict store per chunk LMCache hashes, in
  the wrapper of its `process_tokens`): a clock costs more than any of them;
- `KVAuditConnector`'s worker calls, every one vLLM makes at each step or layer
  (`bind_connector_metadata`, `start_load_kv`, `save_kv_layer`, `wait_for_save`, and
  those that collect results, `_COLLECT`): the vLLM layer's own work is their time
  minus the wrapped connector's call inside them, clocked where the wrapped connector's
  method begins and ends, so that none of this probe's own bookkeeping (a few µs a call
  with the caches cold) counts as the vLLM layer's. A call bound straight to the wrapped
  connector (`STRAIGHT_WORKER` in `kvaudit.hooks.vllm.worker`, `has_connector_metadata` at
  every layer among them) has no vLLM layer: nothing of it is counted. Each method's own
  time is kept too (`vllm_layer.<method>`). `handle_preemptions` (once a step) is vLLM's
  no-op in LMCache's connector, bound straight to it too.
- `KVAuditConnector`'s scheduler-side calls, in the EngineCore process (vLLM's CPU build
  runs its worker in a process of its own; on one GPU the worker shares the scheduler's
  thread): every one vLLM's scheduler makes per request or per step (`_SCHEDULER`),
  less the wrapped connector's call inside each, as for the worker; one bound straight to
  the wrapped connector (`STRAIGHT_SCHEDULER` in `kvaudit.hooks.vllm.scheduler`) has no
  wrapper frame and counts nothing.
  That process writes
  its totals to `$KVAUDIT_PROBE_OUT.scheduler` at each `build_connector_meta` and
  `request_finished` and, from the warm-up's end on, every quarter second with its
  exporter thread's CPU; and those taken at its first call after the warm-up requests
  (`first_step`), their spans exported first.
- The probe's own clock reads. A window holds the end of the read that opens it and the start
  of the one that closes it, and a window around a call to the wrapped connector the two
  marks around that call as well: measured again on an empty window right after each call
  (`_clock_read`, `_marks_read`), where the clock's code has just run (a low estimate), and
  taken off the part's figure (kept as `probe.<part>`).
- The cyclic garbage collector. A collection runs on whichever thread allocates past the
  collector's threshold and collects the whole process's young objects there: where one
  runs says little of what brought it on. Its CPU time is kept out of every clock above,
  per thread (`<clock>.gc` holds what ran inside each), and each clock counts the net
  allocations of the objects the collector tracks that its own work made
  (`<clock>.allocations`, the wrapped connector's taken off); each process writes the CPU
  of its automatic collections on all its threads (`gc`; `gc.collect()` calls, vLLM's and
  LMCache's at shutdown, apart as `gc_called`) and its net allocations (`allocations`).
  bench_topology gives each part the share of the collections its allocations make.
- The steps with nothing for kvaudit: the worker's steps in which the vLLM layer has no
  unit (decode steps, and steps that only collect finished requests) and the scheduler's
  `build_connector_meta` calls that plan no request: the vLLM layer's own time in them
  (`vllm_layer.idle`, `vllm_scheduler.idle`, counted in the totals too), their numbers
  (`idle_steps`, `idle_plans`: one process holds both sides where vLLM runs its model in
  the EngineCore, on one GPU) and the worker's wall time from `bind_connector_metadata` to
  `clear_connector_metadata`, the step's last connector call (`idle_step_wall`; the other
  steps' `step_wall`).

Off the serving thread, the CPU time of the process's exporter threads
(`kvaudit-exporter`, one per emitter: the vLLM layer's on each side, the LMCache hook's),
which build, encode and write the spans, is read from each thread's own clock.

After each save (one per engine step) the worker writes the totals so far (and the
count of engine steps), and those of its first step, to `$KVAUDIT_PROBE_OUT` (JSON; vLLM
may end a worker without a `shutdown`), inside the wrapped connector's window; from the
warm-up's end on, a thread of the probe's writes them again every quarter second, for the
exporters' time after the last step. The benchmark's warm-up requests (`WARM_UPS` in
bench/bench_topology.py; the first holds one-time costs, the LMCache hook makes its emitter at
its first operation) end where its replica creates `$KVAUDIT_PROBE_OUT` + `WARMED_UP`: at
the next step every exporter is flushed, so that the warm-up's spans are exported before
the measured requests, and the totals so far are kept as the warm-up's (`first_step`),
which the benchmark takes off.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from lmcache.v1.storage_backend.remote_backend import RemoteBackend

from bench.bench_topology import WARMED_UP
from bench.common import exporter_threads, exporters_cpu
from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.hooks.lmcache import fetch
from kvaudit.hooks.lmcache.plugin import KvauditStorePlugin
from kvaudit.hooks.vllm.scheduler import KVAuditScheduler
from kvaudit.hooks.vllm.worker import KVAuditWorker

if os.environ.get("KVAUDIT_PROBE_CUDA"):
    from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1 as Wrapped
else:
    from kvaudit.hooks.vllm.lmcache_cpu import CPULMCacheConnectorV1 as Wrapped

SECONDS: defaultdict[str, float] = defaultdict(float)
CALLS: defaultdict[str, int] = defaultdict(int)
FIRST_STEP: dict[str, float] = {}  # SECONDS when the first step after the warm-up began
FIRST_STEP_CALLS: dict[str, int] = {}  # and CALLS
# Created by the benchmark's replica when its warm-up requests are served.
_WARMED_UP = os.environ.get("KVAUDIT_PROBE_OUT", "") + WARMED_UP

# The garbage collector's CPU per thread, and the allocations that bring it on (the module
# docstring says why).
_GC_SECONDS: defaultdict[int, float] = defaultdict(float)  # per thread ident
_GC_STARTED: dict[int, tuple[float, bool]] = {}
_COLLECTED = [0]  # the young generation's count at the start of each collection, summed


def _on_collection(phase: str, info: dict[str, int]) -> None:
    ident = threading.get_ident()
    if phase == "start":
        young = gc.get_count()[0]
        _COLLECTED[0] += young
        # Past the threshold: the collector's own; below it, a `gc.collect()` call (vLLM's
        # and LMCache's at shutdown), which no allocation brought on.
        _GC_STARTED[ident] = (time.thread_time(), young > gc.get_threshold()[0])
    elif ident in _GC_STARTED:
        started, automatic = _GC_STARTED.pop(ident)
        spent = time.thread_time() - started
        _GC_SECONDS[ident] += spent
        SECONDS["gc" if automatic else "gc_called"] += spent


gc.callbacks.append(_on_collection)


def _allocations() -> int:
    """Net allocations of the objects the collector tracks, in the process so far: its young
    generation's count, which each collection resets, plus the count at each."""
    return _COLLECTED[0] + gc.get_count()[0]


def _counts() -> tuple[float, int]:
    """This thread's CPU in collections so far, and the process's allocations: what a mark
    holds besides the thread's CPU clock, which each mark reads on the clocked side of
    these, so that the probe's own work falls outside the clock."""
    return _GC_SECONDS[threading.get_ident()], _allocations()


def _add(key: str, began: tuple[float, float, int], ended: tuple[float, float, int]) -> float:
    """Count a call's own work (`began`, `ended`: its marks, CPU clock first, less any inner
    call's) under `key`: its CPU less the collections that ran in it, which go to `key.gc`,
    and its allocations, to CALLS[`key.allocations`]; returns the former."""
    collecting = ended[1] - began[1]
    own = ended[0] - began[0] - collecting
    SECONDS[key] += own
    SECONDS[f"{key}.gc"] += collecting
    CALLS[f"{key}.allocations"] += ended[2] - began[2]
    return own


def _timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, adding the CPU seconds it takes to SECONDS[name] (see `_add`), and to
    SECONDS[`name.function`]: what each function of the part takes."""
    each = f"{name}.{function.__name__}"

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        counts = _counts()
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            ended = time.thread_time()
            own = _add(name, (started, *counts), (ended, *_counts()))
            probe = _clock_read()
            SECONDS[name] -= probe
            SECONDS[f"probe.{name}"] += probe
            SECONDS[each] += own - probe
            CALLS[name] += 1
            CALLS[each] += 1

    return timed


def _engine(side: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` on both clocks, in one wrapper."""

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            cpu_end, wall_end = time.thread_time(), time.perf_counter()
            SECONDS[f"engine_{side}"] += cpu_end - cpu
            SECONDS[f"engine_{side}_wall"] += wall_end - wall
            CALLS[f"engine_{side}"] += 1

    return timed


# The LMCache hook's own work (it calls these through the module: the wraps take effect).
fetch.finish = _timed("lmcache_hook", fetch.finish)
fetch.end_lookup = _timed("lmcache_hook", fetch.end_lookup)
KvauditStorePlugin.batched_submit_put_task = _timed("lmcache_hook", KvauditStorePlugin.batched_submit_put_task)
# Where the wrapped connector's method began and ended, inside the vLLM layer's current call.
_INNER: list[tuple[float, float, int]] = []  # the marks


def _clock_read() -> float:
    """What a window holds of this probe's clock reads: the end of the read that opens it and
    the start of the one that closes it, one read's CPU in all. Measured on an empty window
    right after the clocked call, where the clock's code has just run: a low estimate of what
    it took in the window, which the probe takes off (as `probe.<part>`), so that a part's
    figure stays a high estimate of its own work."""
    started = time.thread_time()
    return time.thread_time() - started


def _marks_read() -> float:
    """`_clock_read` for a window around a call to the wrapped connector: its two pairs of
    reads, and the marks around the wrapped method (`_marked`), on an empty method."""
    _INNER.clear()
    started = time.thread_time()
    _EMPTY_MARKED()
    ended = time.thread_time()
    return ended - started - (_INNER[-1][0] - _INNER[0][0])


def _inner_begins() -> None:
    _INNER.append((time.thread_time(), *_counts()))


def _inner_ends() -> None:
    counts = _counts()
    _INNER.append((time.thread_time(), *counts))


def _less_inner(
    key: str,
    function: Callable[..., Any],
    before: Callable[[str], None] | None = None,
    after: Callable[[str, float, Any, Any], None] | None = None,
) -> Callable[..., Any]:
    """A method of a `KVAuditConnector` half (`KVAuditWorker`, `KVAuditScheduler`), adding its
    time less the wrapped connector's to SECONDS[key]; `before` (given the method's name) and
    `after` (given the name, its own time, the half and the method's answer) run outside the clock."""
    name = function.__name__

    @functools.wraps(function)
    def timed(connector: Any, *args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(name)
        _INNER.clear()
        answer = None
        counts = _counts()
        started = time.thread_time()
        try:
            answer = function(connector, *args, **kwargs)
            return answer
        finally:
            ended = (time.thread_time(), *_counts())
            if len(_INNER) >= 2:
                inner = zip(_INNER[-1], _INNER[0], strict=True)
                ended = tuple(end - (out - in_) for end, (out, in_) in zip(ended, inner, strict=True))
            probe = _marks_read() if len(_INNER) >= 2 else _clock_read()
            own = _add(key, (started, *counts), ended) - probe
            SECONDS[key] -= probe
            SECONDS[f"probe.{key}"] += probe
            if after is not None:
                after(name, own, connector, answer)

    return timed


# The worker's calls at each step that collect the wrapped connector's results.
_COLLECT = (
    "get_finished",
    "get_transfer_results",
    "get_block_ids_with_load_errors",
    "get_kv_connector_stats",
    "get_kv_connector_kv_cache_events",
    "build_connector_worker_meta",
    "clear_connector_metadata",
)
# Whether the worker's current step has nothing for kvaudit (no unit: a decode step, or one
# that collects finished requests), and when the step began (wall clock).
_STEP: dict[str, Any] = {"idle": False, "began": 0.0}


def _worker_call(name: str, own: float, worker: Any, answer: Any) -> None:
    SECONDS[f"vllm_layer.{name}"] += own
    CALLS[f"vllm_layer.{name}"] += 1
    if name == "bind_connector_metadata":
        _STEP["idle"] = not worker._units
    if _STEP["idle"]:
        SECONDS["vllm_layer.idle"] += own


# The worker's half's own methods (the others vLLM calls are the wrapped connector's).
for _name in ("bind_connector_metadata", "start_load_kv", "save_kv_layer", "wait_for_save", *_COLLECT):
    if _name in vars(KVAuditWorker):
        setattr(KVAuditWorker, _name, _less_inner("vllm_layer", getattr(KVAuditWorker, _name), after=_worker_call))


def _hook_seconds() -> float:
    """The LMCache hook's CPU so far, with the collections that ran in it."""
    return SECONDS["lmcache_hook"] + SECONDS["lmcache_hook.gc"]


def _marked(function: Callable[..., Any]) -> Callable[..., Any]:
    """A wrapped connector's method, marking where it begins and ends in `_INNER`."""

    @functools.wraps(function)
    def marked(*args: Any, **kwargs: Any) -> Any:
        _inner_begins()
        try:
            return function(*args, **kwargs)
        finally:
            _inner_ends()

    return marked


def _empty() -> None:
    """The wrapped method of `_marks_read`'s empty window."""


_EMPTY_MARKED = _marked(_empty)


class ProbedLMCacheConnector(Wrapped):  # type: ignore[valid-type,misc]
    """LMCache's connector (`Wrapped`) whose loads and saves are clocked (see the module docstring)."""

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        _STEP["began"] = time.perf_counter()
        _inner_begins()
        if not FIRST_STEP and os.path.exists(_WARMED_UP):
            # The first step after the warm-up requests: every clock of theirs has stopped.
            _warmed_up(FIRST_STEP, FIRST_STEP_CALLS, _write)
        CALLS["steps"] += 1
        super().bind_connector_metadata(connector_metadata)
        _inner_ends()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        _inner_begins()
        hook_before = _hook_seconds()
        _LOAD(self, forward_context, **kwargs)
        SECONDS["engine_fetch_hook"] += _hook_seconds() - hook_before
        _inner_ends()

    def save_kv_layer(self, *args: Any, **kwargs: Any) -> None:
        _inner_begins()
        hook_before = _hook_seconds()
        _SAVE_LAYER(self, *args, **kwargs)
        SECONDS["engine_store_hook"] += _hook_seconds() - hook_before
        _inner_ends()

    def wait_for_save(self) -> None:
        _inner_begins()
        hook_before = _hook_seconds()
        _SAVE(self)
        SECONDS["engine_store_hook"] += _hook_seconds() - hook_before
        _write()
        _inner_ends()

    def clear_connector_metadata(self) -> None:
        # The step's last connector call: its wall time since `bind_connector_metadata`.
        _inner_begins()
        super().clear_connector_metadata()
        idle = _STEP["idle"]
        SECONDS["idle_step_wall" if idle else "step_wall"] += time.perf_counter() - _STEP["began"]
        CALLS["idle_steps"] += idle
        _inner_ends()


_WRITING = threading.Lock()


def _write_totals(path: str, first: dict[str, float], first_calls: dict[str, int]) -> None:
    """The process's totals so far, and those at the end of its warm-up (`first`, `first_calls`)."""
    CALLS["allocations"] = _allocations()
    # Copies (each made in one step under the GIL): the serving thread may add a clock
    # while the probe's thread writes.
    totals = {
        "pid": os.getpid(),  # one process writes both sides' files where the model runs in the EngineCore
        "seconds": dict(SECONDS),
        "first_step": first,
        "calls": dict(CALLS),
        "first_step_calls": first_calls,
    }
    # Written whole, then renamed: the bench may read the file at any moment after the run.
    partial = f"{path}.{os.getpid()}.tmp"
    with _WRITING:
        with open(partial, "w") as file:
            json.dump(totals, file)
        os.replace(partial, path)


def _write() -> None:
    out = os.environ.get("KVAUDIT_PROBE_OUT")
    if out:
        _write_totals(out, FIRST_STEP, FIRST_STEP_CALLS)


def _warmed_up(first: dict[str, float], first_calls: dict[str, int], write: Callable[[], None]) -> None:
    """The warm-up is over: its spans exported, the totals so far kept as its own (`first`,
    `first_calls`), and from now on the totals written every quarter second (`write`)."""
    _flush_exporters()
    SECONDS["exporters"] = exporters_cpu()
    CALLS["allocations"] = _allocations()
    first.update(SECONDS)
    first_calls.update(CALLS)
    threading.Thread(target=_sample_exporters, args=(write,), name="kvaudit-probe", daemon=True).start()


def _flush_exporters() -> None:
    """Export what every emitter of the process has queued (each exporter thread runs its batcher's loop)."""
    for thread in exporter_threads():
        batcher = getattr(getattr(thread, "_target", None), "__self__", None)
        if isinstance(batcher, SpanBatcher):
            batcher.flush()


def _sample_exporters(write: Callable[[], None]) -> None:
    while True:
        time.sleep(0.25)
        SECONDS["exporters"] = exporters_cpu()
        write()


for _name in _COLLECT:
    if hasattr(Wrapped, _name) and _name not in vars(ProbedLMCacheConnector):
        setattr(ProbedLMCacheConnector, _name, _marked(getattr(Wrapped, _name)))

# The scheduler side, in the EngineCore process: the calls vLLM's scheduler makes into the
# connector, per request or per step, on the thread that schedules every step.
_SCHEDULER = (
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
    "request_finished",
    "take_events",
    "has_pending_block_frees",
    "has_pending_push_work",
    "on_new_request",
    "get_loaded_kv_cache_group_ids",
)
SCHEDULER_FIRST: dict[str, float] = {}  # SECONDS at the first call after the warm-up
SCHEDULER_FIRST_CALLS: dict[str, int] = {}  # and CALLS


def _scheduler_first_step(name: str) -> None:
    if not SCHEDULER_FIRST and os.path.exists(_WARMED_UP):
        # The warm-up requests are served: what they took is left out.
        _warmed_up(SCHEDULER_FIRST, SCHEDULER_FIRST_CALLS, _write_scheduler)


def _scheduler_call(name: str, own: float, connector: Any, answer: Any) -> None:
    SECONDS[f"vllm_scheduler.{name}"] += own
    CALLS[f"vllm_scheduler.{name}"] += 1
    if name == "build_connector_meta" and not getattr(answer, "plans", None):
        # A step with no request whose blocks kvaudit follows.
        SECONDS["vllm_scheduler.idle"] += own
        CALLS["idle_plans"] += 1
    if name in ("build_connector_meta", "request_finished"):
        _write_scheduler()


def _write_scheduler() -> None:
    out = os.environ.get("KVAUDIT_PROBE_OUT")
    if out:
        _write_totals(f"{out}.scheduler", SCHEDULER_FIRST, SCHEDULER_FIRST_CALLS)


for _name in _SCHEDULER:
    if _name in vars(KVAuditScheduler):
        method = getattr(KVAuditScheduler, _name)
        setattr(KVAuditScheduler, _name, _less_inner("vllm_scheduler", method, _scheduler_first_step, _scheduler_call))
    if hasattr(Wrapped, _name):
        setattr(ProbedLMCacheConnector, _name, _marked(getattr(Wrapped, _name)))
# Made once, not at each call.
_LOAD = _engine("fetch", Wrapped.start_load_kv)
_SAVE = _engine("store", Wrapped.wait_for_save)
_SAVE_LAYER = _engine("store", Wrapped.save_kv_layer)


def _engine_part(key: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, a part of the engine's transfer, on the wall clock (`engine_<side>_<part>_wall`,
    inside `engine_<side>_wall`): what a GPU engine, or a pool across a network, does at a speed
    of its own."""

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            SECONDS[key] += time.perf_counter() - started

    return timed


# LMCache's engine copies each request's chunks in one batched call, a store's out of vLLM's
# paged KV cache and a fetch's into it (non-layerwise, as here): the CPU stand-in for its CUDA
# kernel. With `--cuda` the kernel is LMCache's own and the engine's time a GPU's: not split.
if not os.environ.get("KVAUDIT_PROBE_CUDA"):
    _KERNEL = Wrapped.copy_kernel
    _KERNEL.batched_from_gpu = _engine_part("engine_store_copy_wall", _KERNEL.batched_from_gpu)
    _KERNEL.batched_to_gpu = _engine_part("engine_fetch_copy_wall", _KERNEL.batched_to_gpu)
# A fetch's chunks read from the pool's server, on the serving thread (a store's are sent by
# LMCache's own thread): the transfer and its decoding.
RemoteBackend.batched_get_blocking = _engine_part("engine_fetch_pool_wall", RemoteBackend.batched_get_blocking)
