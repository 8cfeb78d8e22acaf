"""Clocks inside a replica of the reference deployment, for bench_topology: never used unless named.

`ProbedLMCacheConnector` is the wrapped connector (`wrap_module_path="bench.topology_probe"`).
Imported in the vLLM worker when kvaudit's connector builds it, this module wraps, with
the CPU clock of the calling thread (what the hooks take from serving, whatever else
shares the cores) and, for the engine's transfers, the wall clock too:

- the wrapped connector's `start_load_kv`, and its `save_kv_layer` (each layer) and
  `wait_for_save`: the engine's fetch and store, LMCache's hook included;
- the LMCache hook's own work inside them (`fetch.start`, `fetch.finish`, the store
  plugin's `batched_submit_put_task`), taken off the engine's figure;
- `KVAuditConnector`'s worker calls (`bind_connector_metadata`, `start_load_kv`,
  `save_kv_layer`, `wait_for_save`): the vLLM layer's own work is their time minus the
  wrapped connector's inside them.

After each save (one per engine step) the worker writes the totals so far, and those of
its first step, to `$KVAUDIT_PROBE_OUT` (JSON; vLLM may end a worker without a
`shutdown`), on a clock taken off the vLLM layer's figure. The first step's totals hold
the one-time costs (the LMCache hook makes its emitter at its first operation), which
the benchmark takes off with a warm-up request.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from kvaudit.hooks.lmcache import fetch
from kvaudit.hooks.lmcache.plugin import KvauditStorePlugin
from kvaudit.hooks.vllm.connector import KVAuditConnector
from kvaudit.hooks.vllm.lmcache_cpu import CPULMCacheConnectorV1

SECONDS: defaultdict[str, float] = defaultdict(float)
CALLS: defaultdict[str, int] = defaultdict(int)
FIRST_STEP: dict[str, float] = {}  # SECONDS at the end of the first engine step


Clock = Callable[[], float]


def _timed(name: str, function: Callable[..., Any], clock: Clock = time.thread_time) -> Callable[..., Any]:
    """`function`, adding the seconds of `clock` it takes to SECONDS[name]."""

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return function(*args, **kwargs)
        finally:
            SECONDS[name] += clock() - started
            CALLS[name] += 1

    return timed


def _engine(side: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` on both clocks, in one wrapper: what a clock costs outside the engine's
    window counts as the vLLM layer's, so there is one, not two nested."""

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
KvauditStorePlugin.batched_submit_put_task = _timed("lmcache_hook", KvauditStorePlugin.batched_submit_put_task)
for _name in ("bind_connector_metadata", "start_load_kv", "save_kv_layer", "wait_for_save"):
    setattr(KVAuditConnector, _name, _timed("vllm_layer_total", getattr(KVAuditConnector, _name)))


class ProbedLMCacheConnector(CPULMCacheConnectorV1):
    """`CPULMCacheConnectorV1` whose loads and saves are clocked (see the module docstring)."""

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        if CALLS["engine_store"] and not FIRST_STEP:
            # A step starts after the first one: every clock of that step has stopped.
            FIRST_STEP.update(SECONDS)
        _BIND(self, connector_metadata)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        hook_before = SECONDS["lmcache_hook"]
        _LOAD(self, forward_context, **kwargs)
        SECONDS["engine_fetch_hook"] += SECONDS["lmcache_hook"] - hook_before

    def save_kv_layer(self, *args: Any, **kwargs: Any) -> None:
        hook_before = SECONDS["lmcache_hook"]
        _SAVE_LAYER(self, *args, **kwargs)
        SECONDS["engine_store_hook"] += SECONDS["lmcache_hook"] - hook_before

    def wait_for_save(self) -> None:
        hook_before = SECONDS["lmcache_hook"]
        _SAVE(self)
        SECONDS["engine_store_hook"] += SECONDS["lmcache_hook"] - hook_before
        _WRITE()


def _write() -> None:
    out = os.environ.get("KVAUDIT_PROBE_OUT")
    if out:
        with open(out, "w") as file:
            json.dump({"seconds": SECONDS, "first_step": FIRST_STEP, "calls": CALLS}, file)


# Made once, not at each call: what a clock costs to make would count as the vLLM layer's.
_BIND = _timed("inner", CPULMCacheConnectorV1.bind_connector_metadata)
_LOAD = _engine("fetch", CPULMCacheConnectorV1.start_load_kv)
_SAVE = _engine("store", CPULMCacheConnectorV1.wait_for_save)
_SAVE_LAYER = _engine("store", CPULMCacheConnectorV1.save_kv_layer)
_WRITE = _timed("inner", _write)
