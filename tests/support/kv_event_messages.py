"""vLLM's KV events as its `msgspec` encoder writes a `KVEventBatch`: an array
`[ts, events, dp_rank]` of `type`-tagged maps (checked against vLLM itself in
tests/kv_events/test_vllm_engine.py)."""

from __future__ import annotations

from typing import Any

import msgspec

HASHES = [bytes([i]) * 32 for i in range(1, 5)]


def stored(hashes: list[bytes | int], parent: bytes | int | None, block_size: int = 16) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": list(range(len(hashes) * block_size)),
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def removed(hashes: list[bytes | int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


CLEARED = {"type": "AllBlocksCleared"}


T0 = 1_700_000_000.0


def payload(*events: dict[str, Any], ts: float = T0) -> bytes:
    return msgspec.msgpack.encode([ts, list(events), None])
