"""One replica of the LMCache hook tests, run as its own OS process.

    python tests/support/lmcache_replica.py '{"replica": "r1", "role": "store", "pools": [{"url": "lm://..."}], ...}'

For each pool it builds a real `LMCacheEngine` (the CPU copy connector stands in for
the CUDA kernel only) and either stores one token sequence, or looks it up and
retrieves it, "recomputing" what it could not retrieve (its own KV, as its engine
would have computed it) and, with `store_recomputed`, storing the sequence then. It
writes what it saw to `out` as JSON (one object per pool) and the KV it ended with to
`out`.<pool>.pt.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

# These replicas are LMCache engines on their own. Where vLLM is installed too, LMCache
# imports its hash functions (about 10 s of CPU per process) and seeds its prefix
# hashes from them: keep vLLM out, so that every replica starts fast and hashes alike
# whichever engines the environment holds.
sys.modules.setdefault("vllm", None)

import torch  # noqa: E402
from lmcache.v1.cache_engine import LMCacheEngineBuilder  # noqa: E402

from kvaudit.hooks import lmcache as hook  # noqa: E402
from kvaudit.hooks.lmcache.testing import cpu_engine  # noqa: E402

CHUNK = 256  # LMCache stores full chunks only


def run_pool(
    spec: dict[str, Any], index: int, pool: dict[str, Any], extra: dict[str, Any], plugins: list[str]
) -> dict[str, int]:
    name = f"{spec['replica']}-{index}"
    engine = cpu_engine(
        name,
        layers=spec["layers"],
        kv_heads=spec["kv_heads"],
        head_size=spec["head_size"],
        remote_url=pool["url"],
        remote_serde="naive",
        storage_plugins=plugins,
        extra_config={**pool.get("extra_config", {}), **extra},
    )
    # Each pool gets its own token sequence, hence its own keys.
    tokens = list(range(pool["offset"], pool["offset"] + spec["tokens"]))
    result: dict[str, int] = {}
    # The request LMCache is told it serves, where the spec names one (the hook samples by it).
    request = spec.get("request_id")
    store_id, lookup_id = ({"req_id": request}, {"lookup_id": request}) if request else ({}, {})
    try:
        if spec["role"] == "store":
            kv = own_kv(spec)
            engine.store(tokens, kvcache=kv, **store_id)
            wait_until_pooled(engine, tokens)
        else:
            result["lookup"] = engine.lookup(tokens, **lookup_id)
            kv = torch.zeros_like(own_kv(spec))
            hit = engine.retrieve(tokens, kvcache=kv, **store_id)
            kv[:, :, ~hit] = own_kv(spec)[:, :, ~hit]
            result["retrieved"] = int(hit.sum())
            result["recomputed"] = int((~hit).sum())
            if spec.get("store_recomputed") and result["recomputed"]:
                # As a serving engine does: what it recomputed goes into the pool.
                engine.store(tokens, kvcache=kv)
                wait_until_pooled(engine, tokens)
    finally:
        LMCacheEngineBuilder.destroy(name)
    torch.save(kv, f"{spec['out']}.{index}.pt")
    return result


def wait_until_pooled(engine: Any, tokens: list[int], timeout_s: float = 60.0) -> None:
    """Remote puts finish in the background: wait until the pool holds every stored page.

    Asked of the remote backend itself, so that the wait leaves no lookup in the traces.
    """
    remote = engine.storage_manager.storage_backends["RemoteBackend"]
    keys = [key for _, end, key in engine.token_database.process_tokens(tokens) if end % CHUNK == 0]
    deadline = time.monotonic() + timeout_s
    while not all(remote.contains(key) for key in keys):
        if time.monotonic() > deadline:
            raise TimeoutError("the remote pool did not receive every stored page")
        time.sleep(0.05)


def own_kv(spec: dict[str, Any]) -> torch.Tensor:
    """The KV this replica computes for the sequence: a function of its seed only."""
    generator = torch.Generator().manual_seed(spec["seed"])
    shape = (spec["layers"], 2, spec["tokens"], spec["kv_heads"], spec["head_size"])
    return torch.randn(shape, generator=generator).to(torch.bfloat16)


def main(spec: dict[str, Any]) -> None:
    extra: dict[str, Any] = {}
    plugins: list[str] = []
    if spec.get("hooks", True):
        hook.instrument(
            replica=spec["replica"],
            export=spec["export"],
            guard=spec.get("guard", False),
            checksum_rate=spec.get("checksum_rate", 0.0),
            registry=spec.get("registry"),
            prevent=spec.get("prevent", False),
            sample_rate=spec.get("sample_rate", 1.0),
        )
        extra, plugins = hook.plugin_config(), [hook.PLUGIN_NAME]
    try:
        results = [run_pool(spec, index, pool, extra, plugins) for index, pool in enumerate(spec["pools"])]
    finally:
        hook.uninstrument()
    with open(spec["out"], "w") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
