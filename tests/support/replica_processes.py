"""Engine replicas run as OS processes for the real-engine tests: a few at a time, producers first.

Each replica is a script given its spec as one JSON argument; it prints `RESULT <json>`
as its last such line. Replicas run at most `parallel` at a time (the machine has two
cores), each once all the replicas it comes `after` have finished.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Replica:
    name: str
    script: Path
    spec: dict[str, Any]
    after: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    result: list[dict[str, Any]] = field(default_factory=list)
    log: str = ""
    seconds: float = 0.0

    @property
    def out(self) -> dict[str, Any]:
        """What it printed of its first prompt."""
        return self.result[0]

    def printed(self, tag: str) -> Any:
        """The JSON of the last line it printed as `tag <json>`; None where it printed none."""
        lines = [line for line in self.log.splitlines() if line.startswith(f"{tag} ")]
        return json.loads(lines[-1].removeprefix(f"{tag} ")) if lines else None


def run(replica: Replica, logs: Path, env: Mapping[str, str], timeout_s: float) -> Replica:
    """Run one replica to its end; its log goes to `logs`/<name>.log."""
    log = logs / f"{replica.name}.log"
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(
            [sys.executable, str(replica.script), json.dumps(replica.spec)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env, **replica.env},
            timeout=timeout_s,
            check=False,
        )
    replica.seconds = time.monotonic() - started
    replica.log = log.read_text()
    result = replica.printed("RESULT")
    if proc.returncode != 0 or result is None:
        raise AssertionError(f"replica {replica.name} failed (exit {proc.returncode}):\n{replica.log[-4000:]}")
    replica.result = result
    return replica


def run_all(
    replicas: list[Replica], logs: Path, env: Mapping[str, str], *, parallel: int = 2, timeout_s: float = 900
) -> dict[str, Replica]:
    """Run every replica once, `parallel` at a time, each after those it names; by name."""
    logs.mkdir(parents=True, exist_ok=True)
    pending, done = list(replicas), {}
    running: dict[str, Future[Replica]] = {}
    with ThreadPoolExecutor(parallel) as pool:
        while pending or running:
            for replica in [r for r in pending if all(a in done for a in r.after)]:
                if len(running) < parallel:
                    pending.remove(replica)
                    running[replica.name] = pool.submit(run, replica, logs, env, timeout_s)
            assert running, f"{[r.name for r in pending]} come after replicas that never run"
            wait(running.values(), return_when=FIRST_COMPLETED)
            for name in [name for name, future in running.items() if future.done()]:
                done[name] = running.pop(name).result()
    return done
