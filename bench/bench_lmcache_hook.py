"""Per-page cost of kvaudit's LMCache hooks against the same engine without them.

Two real LMCache engines of the same configuration in one process, one with the store
plugin, run the same work in alternation: store a sequence of fresh pages, then fetch
them back from the local CPU tier. The plain engine runs uninstrumented, the hooked
one instrumented, so both figures come from the same run and the same machine state.
Pages are 8 MiB (8 layers, 8 KV heads of 128, bf16, 256 tokens), 16 to a request
(4k tokens; a 32k-token prompt has 128): each span's fixed cost is shared by its pages.
The CPU copy connector stands in for LMCache's CUDA copy kernel.

The hook's own cost is also timed in isolation (the plugin's store recording and the
fetch description, on the same memory objects), because a few tens of microseconds
disappear in the noise of a millisecond copy; the ratio uses that figure.

    python bench/bench_lmcache_hook.py [--pages 16] [--reps 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
os.environ.setdefault("PYTHONHASHSEED", "0")

import torch
from lmcache.v1.cache_engine import LMCacheEngine, LMCacheEngineBuilder

from bench.common import sized
from kvaudit.emit.emitter import Emitter
from kvaudit.emit.setup import setup_emitter
from kvaudit.hooks import lmcache as hook
from kvaudit.hooks.lmcache import fetch, runtime
from kvaudit.hooks.lmcache.plugin import KvauditStorePlugin
from kvaudit.hooks.lmcache.testing import cpu_engine

LAYERS, HEADS, HEAD_SIZE, CHUNK = 8, 8, 128, 256
PAGE_BYTES = 2 * LAYERS * HEADS * HEAD_SIZE * 2 * CHUNK


def _engine(name: str, plugin: bool) -> LMCacheEngine:
    return cpu_engine(
        name,
        layers=LAYERS,
        kv_heads=HEADS,
        head_size=HEAD_SIZE,
        max_local_cpu_size=1.0,
        storage_plugins=[hook.PLUGIN_NAME] if plugin else [],
        extra_config=hook.plugin_config() if plugin else {},
    )


def _round(engine: LMCacheEngine, base: int, pages: int, kv: torch.Tensor) -> tuple[float, float]:
    """Store `pages` fresh pages, fetch them back; seconds per page for each."""
    tokens = list(range(base, base + pages * CHUNK))
    start = time.perf_counter()
    engine.store(tokens, kvcache=kv)
    stored = time.perf_counter()
    hit = int(engine.retrieve(tokens, kvcache=kv).sum())
    fetched = time.perf_counter()
    assert hit == len(tokens), f"fetched {hit} of {len(tokens)} tokens"
    return (stored - start) / pages, (fetched - stored) / pages


def _isolated(engine: LMCacheEngine, pages: int, reps: int) -> tuple[float, float]:
    """Seconds per page of the hooks' own work on real memory objects: store record, fetch description."""
    manager = engine.storage_manager
    plugin = next(b for b in manager.storage_backends.values() if isinstance(b, KvauditStorePlugin))
    keys = [key for _, _, key in engine.token_database.process_tokens(list(range(pages * CHUNK)))]
    objs = [manager.allocate(engine.metadata.get_shapes(CHUNK), engine.metadata.get_dtypes()) for _ in keys]
    state = runtime.current()
    assert state is not None
    store_s, fetch_s = [], []
    for _ in range(reps):
        start = time.perf_counter()
        plugin.batched_submit_put_task(keys, objs)
        store_s.append((time.perf_counter() - start) / pages)
        start = time.perf_counter()
        fetch.finish(state, manager, (time.time_ns(), None, None), keys, list(objs), "LocalCPUBackend", guard=False)
        fetch_s.append((time.perf_counter() - start) / pages)
    for obj in objs:
        obj.ref_count_down()
    return statistics.median(store_s), statistics.median(fetch_s)


def _measure(checksum_rate: float, pages: int, reps: int, emitter: Emitter) -> dict[str, float]:
    plain = _engine(f"plain-{checksum_rate}", plugin=False)
    hook.instrument(emitter=emitter, checksum_rate=checksum_rate)
    hooked = _engine(f"hooked-{checksum_rate}", plugin=True)
    hook.uninstrument()
    kv = torch.randn(LAYERS, 2, pages * CHUNK, HEADS, HEAD_SIZE).to(torch.bfloat16)
    runs: dict[str, list[float]] = {"plain_store": [], "plain_fetch": [], "hook_store": [], "hook_fetch": []}
    # Fresh token ranges each round, so every store writes new pages.
    base = 10_000_000
    for rep in range(reps + 1):
        base += pages * CHUNK
        plain_store, plain_fetch = _round(plain, base, pages, kv)
        hook.instrument(emitter=emitter, checksum_rate=checksum_rate)
        hook_store, hook_fetch = _round(hooked, base, pages, kv)
        if rep:  # the first round warms allocators and caches
            for name, value in zip(runs, (plain_store, plain_fetch, hook_store, hook_fetch), strict=True):
                runs[name].append(value)
        if rep < reps:
            hook.uninstrument()
    own_store, own_fetch = _isolated(hooked, pages, reps)
    hook.uninstrument()
    for engine in (f"plain-{checksum_rate}", f"hooked-{checksum_rate}"):
        LMCacheEngineBuilder.destroy(engine)
    result = {name: statistics.median(values) for name, values in runs.items()}
    result.update(own_store=own_store, own_fetch=own_fetch)
    return result


def _report(label: str, figures: dict[str, float], show: Callable[[str], None]) -> None:
    us = 1e6
    for side in ("store", "fetch"):
        plain, hooked, own = figures[f"plain_{side}"], figures[f"hook_{side}"], figures[f"own_{side}"]
        show(
            f"{label:<14} {side:<5} engine {plain * us:9.1f} us/page   with hooks {hooked * us:9.1f} us/page"
            f"   hook's own work {own * us:7.1f} us/page = {own / plain:7.2%} of the engine's"
        )


def main(argv: list[str] | None = None) -> None:
    """`argv` only from the command line: `python -m bench` calls this with none."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=sized(16, 2), help="pages per request (default 16)")
    parser.add_argument("--reps", type=int, default=sized(15, 1), help="measured rounds per configuration (default 15)")
    args = parser.parse_args(argv or [])
    with tempfile.TemporaryDirectory() as tmp:
        emitter = setup_emitter("bench", f"file:{tmp}/bench.jsonl", engine="lmcache")
        print(f"LMCache hook cost, pages of {PAGE_BYTES / 2**20:.0f} MiB, {args.pages} pages per request")
        for label, rate in (("checksums off", 0.0), ("checksums on", 1.0)):
            _report(label, _measure(rate, args.pages, args.reps, emitter), print)
        emitter.shutdown()
    print("goal: hook's own work under 1% of the engine's store/fetch time, checksums off")


if __name__ == "__main__":
    main(sys.argv[1:])
