"""Clocks inside a vLLM replica around LMCache's MP server, for bench_vllm_mp: never used unless named.

The replica names this module as its connector's module path (`kv_connector_module_path`),
and one of its classes by the name vLLM and kvaudit know (so that every name-keyed path of
theirs, such as the forwarding of class-level hooks to the inner connector, is the one a
deployment takes):

- `KVAuditConnector`: kvaudit's connector around `LMCacheMPConnector`, each call of its
  halves that vLLM reaches (`calls()`, and the worker's step calls, which it exposes in
  steps with a unit) timed on the calling thread's CPU clock, and the inner connector's
  calls inside them too (`InnerClock`, with what the stand-in itself costs a call): the
  wrapper's own time is the difference. The calls kvaudit binds straight to the inner
  connector have no wrapper frame and count nothing.
- `LMCacheMPConnector`: the inner connector alone, the baseline.

Each process (the EngineCore's scheduler side, the Worker) counts its steps (the worker's
`bind_connector_metadata` calls, once a step) and writes its totals, with its pid, its
process CPU time, its kvaudit exporter threads' CPU time and the time written, to `$KVAUDIT_PROBE_OUT.<role>.json` every
`WRITE_EVERY_S` from a thread of its own: vLLM may end these processes without a
`shutdown`, and the benchmark reads the totals between its passes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector import (
    LMCacheMPConnector as _LMCacheMPConnector,
)

from bench.bench_vllm_hook import CLOCK, InnerClock
from bench.common import exporters_cpu
from kvaudit.hooks.vllm import connector

OUT_ENV = "KVAUDIT_PROBE_OUT"
WRITE_EVERY_S = 0.05


class Totals:
    """One process's figures, written by a thread of their own."""

    def __init__(self, role: KVConnectorRole) -> None:
        self.steps = 0
        self.outer_s = 0.0  # in the wrapper's calls, the inner connector's included
        self.clocks: list[InnerClock] = []
        self._stand_in_s = InnerClock.overhead_s()
        name = "worker" if role == KVConnectorRole.WORKER else "scheduler"
        path = f"{os.environ[OUT_ENV]}.{name}.json"
        threading.Thread(target=self._write, args=(path,), name="kvaudit-bench-probe", daemon=True).start()

    def _write(self, path: str) -> None:
        while True:
            calls = sum(clock.calls for clock in self.clocks)
            figures = {
                "pid": os.getpid(),
                "steps": self.steps,
                "outer_s": self.outer_s,
                "inner_s": sum(clock.seconds for clock in self.clocks) + calls * self._stand_in_s,
                "process_cpu_s": time.process_time(),
                "exporters_cpu_s": exporters_cpu(),
                "written": time.time(),
            }
            with open(f"{path}.tmp", "w") as out:
                json.dump(figures, out)
            os.replace(f"{path}.tmp", path)
            time.sleep(WRITE_EVERY_S)

    def timed(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        step = name == "bind_connector_metadata"

        def clocked(*args: Any, **kwargs: Any) -> Any:
            if step:
                self.steps += 1
            started = CLOCK()
            try:
                return call(*args, **kwargs)
            finally:
                self.outer_s += CLOCK() - started

        return clocked


class KVAuditConnector(connector.KVAuditConnector):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        totals = Totals(role)
        half = self._half
        clock = InnerClock(half._inner)
        half._inner = clock  # type: ignore[assignment]
        totals.clocks.append(clock)
        # The half's own methods that vLLM reaches; those bound straight to the inner connector stay so.
        own = {name: call for name, call in vars(self).items() if getattr(call, "__self__", None) is half}
        self._expose({name: totals.timed(name, call) for name, call in own.items()})
        step_calls = getattr(half, "_step_calls", None)  # the worker's, exposed in a step with a unit
        if step_calls is not None:
            for name, call in step_calls.items():
                step_calls[name] = totals.timed(name, call)


class LMCacheMPConnector(_LMCacheMPConnector):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._totals = Totals(role)

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        self._totals.steps += 1
        super().bind_connector_metadata(connector_metadata)
