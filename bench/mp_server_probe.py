"""kvaudit's MP server hook with its own time measured, for `bench_mp_server` (loaded inside `lmcache server`).

    --server-module '{"module_path": "bench.mp_server_probe",
                      "config": {"replica": "pool", "export": "file:...", "timings": PATH}}'

Installs `kvaudit.hooks.lmcache.mp_server` as LMCache loads it, with each of the
subscriber's callbacks timed (`perf_counter` around the call, on the bus's drain thread);
as the bus stops, writes to PATH the events handled, the seconds spent in them, and the
server process's CPU seconds.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from typing import Any


def build_server_modules(context: Any) -> None:
    from kvaudit.hooks.lmcache import mp_events, mp_server

    config = dict(context.config)
    path = config.pop("timings")
    totals = {"events": 0, "seconds": 0.0}

    def timed(callback: Callable[[Any], None]) -> Callable[[Any], None]:
        @functools.wraps(callback)
        def call(event: Any) -> None:
            started = time.perf_counter()
            try:
                callback(event)
            finally:
                totals["seconds"] += time.perf_counter() - started
                totals["events"] += 1

        return call

    subscriptions = mp_events.MPServerSubscriber.get_subscriptions
    shutdown = mp_events.MPServerSubscriber.shutdown

    def timed_subscriptions(self: Any) -> dict[Any, Any]:
        return {kind: timed(callback) for kind, callback in subscriptions(self).items()}

    def written_shutdown(self: Any) -> None:
        shutdown(self)
        with open(path, "w") as out:
            json.dump({**totals, "process_cpu_s": time.process_time()}, out)

    mp_events.MPServerSubscriber.get_subscriptions = timed_subscriptions  # type: ignore[method-assign]
    mp_events.MPServerSubscriber.shutdown = written_shutdown  # type: ignore[method-assign]
    return mp_server.build_server_modules(dataclasses.replace(context, config=config))
