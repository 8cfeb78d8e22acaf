"""What the benchmarks share: a realistic 27B page descriptor, a timer, a results table, a receiver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kvaudit.contract import KVConfig, PageDescriptor, Tier
from kvaudit.present.rows import write_rows
from kvaudit.simulator.model import LAYOUT_SPLIT, PRESETS

MODEL = PRESETS["gemma-2-27b"]
PAGE_TOKENS = 256
KV: KVConfig = MODEL.kv_config(LAYOUT_SPLIT, PAGE_TOKENS)
PAGE_BYTES = MODEL.page_bytes(PAGE_TOKENS)


# Set by `python -m bench --smoke` (and so inherited by the benchmarks' child processes):
# every benchmark at its smallest sizes, to show it still runs; its figures mean nothing.
SMOKE_ENV = "KVAUDIT_BENCH_SMOKE"


def smoke() -> bool:
    return os.environ.get(SMOKE_ENV) == "1"


def sized(default: int, smoke_size: int) -> int:
    """`default`, or `smoke_size` in a smoke run."""
    return smoke_size if smoke() else default


def env_int(name: str, default: int, smoke_size: int) -> int:
    """A size from the environment (`KVAUDIT_BENCH_*`), for quick runs; else `sized(default, smoke_size)`."""
    return int(os.environ.get(name, sized(default, smoke_size)))


def page(index: int, *, used: bool | None = True) -> PageDescriptor:
    """A fetched 27B page with every field a hook fills in (19 attributes)."""
    return PageDescriptor(
        key=f"{index:064x}",
        hash_algo=KV.hash_algo,
        token_start=index * PAGE_TOKENS,
        token_end=(index + 1) * PAGE_TOKENS,
        model=KV.model,
        dtype=KV.dtype,
        shape=MODEL.page_shape(LAYOUT_SPLIT, PAGE_TOKENS),
        layout=KV.layout,
        bytes=PAGE_BYTES,
        world_size=1,
        rank=0,
        layers=MODEL.layers,
        kv_heads=MODEL.kv_heads,
        head_size=MODEL.head_size,
        used=used,
        checksum=f"xxh3_64:{index:016x}",
        transfer="copy",
        tier=Tier.REMOTE.value,
    )


def exporter_threads() -> list[threading.Thread]:
    """This process's kvaudit exporter threads (one per emitter), which build, encode and write
    the spans off the serving thread."""
    return [thread for thread in threading.enumerate() if thread.name == "kvaudit-exporter"]


# The last CPU seconds read of each exporter thread: a thread that has ended (its emitter
# shut down with the engine) keeps what it took.
_EXPORTERS: dict[int, float] = {}


def exporters_cpu() -> float:
    """CPU seconds this process's exporter threads have taken so far, each read from its own clock."""
    for thread in exporter_threads():
        try:
            _EXPORTERS[thread.ident or 0] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident or 0))
        except OSError:  # the thread ended meanwhile
            continue
    return sum(_EXPORTERS.values())


def best_of(repeats: int, run: Callable[[], None]) -> float:
    """The shortest of `repeats` timed runs, in seconds (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def machine() -> str:
    """The machine and how busy it was: figures from a shared machine need that context."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPUs, load average {load} at start"


def report(rows: Sequence[Sequence[object]]) -> None:
    write_rows(["measure", "kvaudit", "baseline", "ratio", "goal"], rows)


class Receiver:
    """`kvaudit collect` in its own process, as an operator starts it."""

    def __init__(self, out: Path, port: int, *flags: str) -> None:
        command = [sys.executable, "-m", "kvaudit", "collect", "--out", str(out), f"127.0.0.1:{port}", *flags]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.process.stdout is not None
        self.process.stdout.readline()  # "listening on ..."
        self.port = port

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)
