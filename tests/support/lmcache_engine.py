"""A real LMCache 0.5.6 engine in the test's own process, with the kvaudit hooks on.

The engine copies KV with the CPU copy connector of `kvaudit.hooks.lmcache.testing`
(it stands in for LMCache's CUDA copy kernel only). Its pages are CHUNK tokens of a
2-layer, 2-head model of head size 16; POOL_GB makes a local CPU pool of four pages, so
that a fifth stored page evicts one for capacity.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHUNK = 256  # LMCache stores full chunks only
GEOMETRY = {"layers": 2, "kv_heads": 2, "head_size": 16}
PAGE_BYTES = 2 * 2 * CHUNK * 2 * 16 * 2  # [2, layers, tokens, heads * head_size] in bfloat16
POOL_GB = 4.5 * PAGE_BYTES / 1024**3  # room for four pages


def sequence(seed: int, pages: int = 3) -> list[int]:
    """A prompt of `pages` full chunks, its tokens a function of the seed."""
    return [seed * 100_000 + i for i in range(pages * CHUNK)]


def kv(pages: int = 3) -> Any:
    """A KV cache of `pages` chunks, `[layers, 2, tokens, kv_heads, head_size]`."""
    import torch

    generator = torch.Generator().manual_seed(3)
    return torch.randn(2, 2, pages * CHUNK, 2, 16, generator=generator).to(torch.bfloat16)


@contextmanager
def hooked_engine(traces: Path, name: str, sample_rate: float = 1.0, **config: Any) -> Iterator[Any]:
    """A local LMCache engine with the hooks on, writing `traces/r1.jsonl`; destroyed and unhooked after."""
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    from kvaudit.hooks import lmcache as hook
    from kvaudit.hooks.lmcache.testing import cpu_engine

    os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
    assert hook.instrument(replica="r1", export=f"file:{traces}/r1.jsonl", sample_rate=sample_rate)
    try:
        plugin = {"storage_plugins": [hook.PLUGIN_NAME], "extra_config": hook.plugin_config()}
        engine = cpu_engine(name, **GEOMETRY, **plugin, **config)
        try:
            yield engine
        finally:
            LMCacheEngineBuilder.destroy(name)
    finally:
        hook.uninstrument()
