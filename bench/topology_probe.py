"""Clocks inside a replica of the reference deployment, for bench_topology: never used unless named.

`ProbedLMCacheConnector` is the wrapped connector (`wrap_module_path="bench.topology_probe"`).
Imported in the vLLM worker when kvaudit's connector builds it, this module wraps, with
the CPU clock of the calling thread (what the hooks take from serving, whatever else
shares the cores) and, for the engine's transfers, the wall clock too:

- the wrapped connector's `start_load_kv`, and its `save_kv_layer` (each layer) and
  `wait_for_save`: the engine's fetch and store, LMCache's hook included;
- the LMCache hook's own work inside them and on LMCache's lookup thread (`fetch.start`,
  `fetch.finish`, `fetch.end_lookup`, the store plugin's `batched_submit_put_task`),
  taken off the engine's figure. The instrumentor's thin wrappers stay uncounted (a
  call and a context variable around each wrapped method, and a dict store per chunk
  LMCache hashes, `Runtime.remember_range`): a clock costs more than any of them;
- `KVAuditConnector`'s worker calls, every one vLLM makes at each step or layer
  (`bind_connector_metadata`, `start_load_kv`, `save_kv_layer`, `wait_for_save`, and
  those that collect results, `_COLLECT`): the vLLM layer's own work is their time
  minus the wrapped connector's call inside them, clocked where the wrapped connector's
  method begins and ends, so that none of this probe's own bookkeeping (a few µs a call
  with the caches cold) counts as the vLLM layer's. A call bound straight to the wrapped
  connector (`_STRAIGHT` in `kvaudit.hooks.vllm.connector`, `has_connector_metadata` at
  every layer among them) has no vLLM layer: nothing of it is counted. One forwarded
  call is left uncounted, `handle_preemptions` (once a step; its forwarder costs about
  3.5 µs cold beyond the wrapped connector's own, measured apart in bench/README.md): a
  clock around it would cost as much.
- `KVAuditConnector`'s scheduler-side calls, in the EngineCore process (vLLM's CPU build
  runs its worker in a process of its own; on one GPU the worker shares the scheduler's
  thread): every one vLLM's scheduler makes per request or per step (`_SCHEDULER`),
  less the wrapped connector's call inside each, as for the worker; one bound straight to
  the wrapped connector (`_STRAIGHT_SCHEDULER`) has no wrapper frame and counts nothing.
  That process writes
  its totals to `$KVAUDIT_PROBE_OUT.scheduler` at each `build_connector_meta` and
  `request_finished` and, from the warm-up's end on, every quarter second with its
  exporter thread's CPU; and those taken when the warm-up request finished (`first_step`),
  its spans exported first.

Off the serving thread, the CPU time of the process's exporter threads
(`kvaudit-exporter`, one per emitter: the vLLM layer's on each side, the LMCache hook's),
which build, encode and write the spans, is read from each thread's own clock.

After each save (one per engine step) the worker writes the totals so far (and the
count of engine steps), and those of its first step, to `$KVAUDIT_PROBE_OUT` (JSON; vLLM
may end a worker without a `shutdown`), inside the wrapped connector's window; from the
second step on, a thread of the probe's writes them again every quarter second, for the
exporters' time after the last step. The first step's totals hold the one-time costs
(the LMCache hook makes its emitter at its first operation), which the benchmark takes
off with a warm-up request; when the second step begins, every exporter is flushed, so
that the warm-up's spans are exported before the measured requests.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from kvaudit.emit.span_batcher import SpanBatcher
from kvaudit.hooks.lmcache import fetch
from kvaudit.hooks.lmcache.plugin import KvauditStorePlugin
from kvaudit.hooks.vllm.connector import KVAuditConnector
from kvaudit.hooks.vllm.lmcache_cpu import CPULMCacheConnectorV1

SECONDS: defaultdict[str, float] = defaultdict(float)
CALLS: defaultdict[str, int] = defaultdict(int)
FIRST_STEP: dict[str, float] = {}  # SECONDS at the end of the first engine step
FIRST_STEP_CALLS: dict[str, int] = {}  # and CALLS


def _timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, adding the CPU seconds it takes to SECONDS[name]."""

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            SECONDS[name] += time.thread_time() - started
            CALLS[name] += 1

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
fetch.start = _timed("lmcache_hook", fetch.start)
fetch.finish = _timed("lmcache_hook", fetch.finish)
fetch.end_lookup = _timed("lmcache_hook", fetch.end_lookup)
KvauditStorePlugin.batched_submit_put_task = _timed("lmcache_hook", KvauditStorePlugin.batched_submit_put_task)
# Where the wrapped connector's method began and ended, inside the vLLM layer's current call.
_INNER: list[float] = []


def _less_inner(
    key: str,
    function: Callable[..., Any],
    before: Callable[[str], None] | None = None,
    after: Callable[[str, float], None] | None = None,
) -> Callable[..., Any]:
    """A `KVAuditConnector` method, adding its time less the wrapped connector's to SECONDS[key];
    `before` and `after` (given the method's name, and its own time) run outside the clock."""
    name = function.__name__

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(name)
        _INNER.clear()
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            own = time.thread_time() - started
            if len(_INNER) >= 2:
                own -= _INNER[-1] - _INNER[0]
            SECONDS[key] += own
            if after is not None:
                after(name, own)

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
for _name in ("bind_connector_metadata", "start_load_kv", "save_kv_layer", "wait_for_save", *_COLLECT):
    if hasattr(KVAuditConnector, _name):
        setattr(KVAuditConnector, _name, _less_inner("vllm_layer", getattr(KVAuditConnector, _name)))


def _marked(function: Callable[..., Any]) -> Callable[..., Any]:
    """A wrapped connector's method, marking where it begins and ends in `_INNER`."""

    @functools.wraps(function)
    def marked(*args: Any, **kwargs: Any) -> Any:
        _INNER.append(time.thread_time())
        try:
            return function(*args, **kwargs)
        finally:
            _INNER.append(time.thread_time())

    return marked


class ProbedLMCacheConnector(CPULMCacheConnectorV1):
    """`CPULMCacheConnectorV1` whose loads and saves are clocked (see the module docstring)."""

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        _INNER.append(time.thread_time())
        if CALLS["engine_store"] and not FIRST_STEP:
            # A step starts after the first one: every clock of that step has stopped.
            _flush_exporters()
            SECONDS["exporters"] = _exporters_cpu()
            FIRST_STEP.update(SECONDS)
            FIRST_STEP_CALLS.update(CALLS)
            threading.Thread(target=_sample_exporters, name="kvaudit-probe", daemon=True).start()
        CALLS["steps"] += 1
        super().bind_connector_metadata(connector_metadata)
        _INNER.append(time.thread_time())

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        _INNER.append(time.thread_time())
        hook_before = SECONDS["lmcache_hook"]
        _LOAD(self, forward_context, **kwargs)
        SECONDS["engine_fetch_hook"] += SECONDS["lmcache_hook"] - hook_before
        _INNER.append(time.thread_time())

    def save_kv_layer(self, *args: Any, **kwargs: Any) -> None:
        _INNER.append(time.thread_time())
        hook_before = SECONDS["lmcache_hook"]
        _SAVE_LAYER(self, *args, **kwargs)
        SECONDS["engine_store_hook"] += SECONDS["lmcache_hook"] - hook_before
        _INNER.append(time.thread_time())

    def wait_for_save(self) -> None:
        _INNER.append(time.thread_time())
        hook_before = SECONDS["lmcache_hook"]
        _SAVE(self)
        SECONDS["engine_store_hook"] += SECONDS["lmcache_hook"] - hook_before
        _write()
        _INNER.append(time.thread_time())


_WRITING = threading.Lock()


def _write() -> None:
    out = os.environ.get("KVAUDIT_PROBE_OUT")
    if out:
        # Copies (each made in one step under the GIL): the serving thread may add a clock
        # while the probe's thread writes.
        totals = {"seconds": dict(SECONDS), "first_step": FIRST_STEP, "calls": dict(CALLS)}
        with _WRITING, open(out, "w") as file:
            json.dump({**totals, "first_step_calls": FIRST_STEP_CALLS}, file)


def _exporter_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "kvaudit-exporter"]


# The last CPU seconds read of each exporter thread: a thread that has ended (its emitter
# shut down with the engine) keeps what it took.
_EXPORTERS: dict[int, float] = {}


def _exporters_cpu() -> float:
    """CPU seconds the process's exporter threads have taken so far."""
    for thread in _exporter_threads():
        try:
            _EXPORTERS[thread.ident or 0] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident or 0))
        except OSError:  # the thread ended meanwhile
            continue
    return sum(_EXPORTERS.values())


def _flush_exporters() -> None:
    """Export what every emitter of the process has queued (each exporter thread runs its batcher's loop)."""
    for thread in _exporter_threads():
        batcher = getattr(getattr(thread, "_target", None), "__self__", None)
        if isinstance(batcher, SpanBatcher):
            batcher.flush()


def _sample_exporters(write: Callable[[], None] = _write) -> None:
    while True:
        time.sleep(0.25)
        SECONDS["exporters"] = _exporters_cpu()
        write()


for _name in _COLLECT:
    if hasattr(CPULMCacheConnectorV1, _name):
        setattr(ProbedLMCacheConnector, _name, _marked(getattr(CPULMCacheConnectorV1, _name)))

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
SCHEDULER_FIRST: dict[str, float] = {}  # SECONDS when the warm-up request finished


def _scheduler_first_step(name: str) -> None:
    if name == "request_finished" and not SCHEDULER_FIRST:
        # The warm-up request, alone, is the first to finish: what it took is one-time.
        _flush_exporters()
        SECONDS["exporters"] = _exporters_cpu()
        SCHEDULER_FIRST.update(SECONDS)
        threading.Thread(target=_sample_exporters, args=(_write_scheduler,), daemon=True).start()


def _scheduler_call(name: str, own: float) -> None:
    SECONDS[f"vllm_scheduler.{name}"] += own
    CALLS[f"vllm_scheduler.{name}"] += 1
    if name in ("build_connector_meta", "request_finished"):
        _write_scheduler()


def _write_scheduler() -> None:
    out = os.environ.get("KVAUDIT_PROBE_OUT")
    if out:
        totals = {"seconds": dict(SECONDS), "first_step": SCHEDULER_FIRST, "calls": dict(CALLS)}
        with _WRITING, open(f"{out}.scheduler", "w") as file:
            json.dump(totals, file)


for _name in _SCHEDULER:
    if hasattr(KVAuditConnector, _name):
        method = getattr(KVAuditConnector, _name)
        setattr(KVAuditConnector, _name, _less_inner("vllm_scheduler", method, _scheduler_first_step, _scheduler_call))
    if hasattr(CPULMCacheConnectorV1, _name):
        setattr(ProbedLMCacheConnector, _name, _marked(getattr(CPULMCacheConnectorV1, _name)))
# Made once, not at each call.
_LOAD = _engine("fetch", CPULMCacheConnectorV1.start_load_kv)
_SAVE = _engine("store", CPULMCacheConnectorV1.wait_for_save)
_SAVE_LAYER = _engine("store", CPULMCacheConnectorV1.save_kv_layer)
