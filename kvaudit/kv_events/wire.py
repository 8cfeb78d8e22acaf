"""vLLM's KV event wire format, mirrored so that kvaudit can decode it without vLLM.

vLLM (`vllm/distributed/kv_events.py`) publishes each `KVEventBatch` as a ZMQ
multipart message `[topic, seq, payload]`: `seq` an 8-byte big-endian counter per
publisher, `payload` the batch in msgpack, an array `[ts, events, dp_rank]` whose
events are maps tagged by `type` (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`).
Only the fields kvaudit uses are declared: msgspec skips the others, so fields vLLM
adds later do not break decoding, and event types it adds later are skipped (counted).
"""

from __future__ import annotations

from typing import Final

import msgspec

# A block hash as vLLM publishes it: the raw digest, or (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1,
# vLLM's default) the digest's low 64 bits as an integer.
ExternalBlockHash = bytes | int

LOW64_SUFFIX: Final = "_low64"
_LOW64: Final = (1 << 64) - 1


class BlockStored(msgspec.Struct, tag=True, gc=False):
    # Not declared, so skipped: `lora_id`, `lora_name`, `extra_keys`, the fields after
    # `kv_cache_spec_sliding_window`, and vLLM 0.33's trailing `lookahead_token_ids` (the tokens past each
    # block that its hash covers under lookahead hashing; omitted when None). `token_ids`
    # holds the blocks' own tokens on every release, so token ranges do not depend on it.
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    medium: str | None = None
    group_idx: int | None = None
    # The group's kind (vLLM's `KVCacheSpecKind`: `full_attention`, `sliding_window`, ...) and
    # window, where the publisher fills them (vLLM 0.32's prefix cache leaves them None).
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(msgspec.Struct, tag=True, gc=False):
    block_hashes: list[ExternalBlockHash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, gc=False):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class DecodedBatch(msgspec.Struct, gc=False):
    """A batch with its known events decoded; `unknown` counts events of types kvaudit does not know."""

    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None
    unknown: int


_BATCH_DECODER: Final = msgspec.msgpack.Decoder(EventBatch)
_EVENT_DECODER: Final = msgspec.msgpack.Decoder(KVEvent)


def decode_batch(payload: bytes) -> DecodedBatch:
    """Decode one published payload.

    Raises:
        msgspec.DecodeError: the payload is not a KV event batch.
    """
    batch = _BATCH_DECODER.decode(payload)
    events: list[KVEvent] = []
    unknown = 0
    for raw in batch.events:
        try:
            events.append(_EVENT_DECODER.decode(raw))
        except msgspec.ValidationError:
            unknown += 1
    return DecodedBatch(batch.ts, events, batch.data_parallel_rank, unknown)


def decode_seq(frame: bytes) -> int:
    """The sequence number of a published message (8 bytes, big-endian, signed: -1 ends a replay)."""
    return int.from_bytes(frame, "big", signed=True)


def encode_seq(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def block_key(block_hash: ExternalBlockHash) -> str:
    """The page key of a published block hash, as hex.

    A raw digest gives the same key the connector hook reports. A 64-bit integer is
    the digest's low 64 bits, so its key is the last 16 hex digits of that key.
    """
    if isinstance(block_hash, bytes):
        return block_hash.hex()
    return f"{block_hash & _LOW64:016x}"


def key_hash_algo(block_hash: ExternalBlockHash, hash_algo: str | None) -> str | None:
    """`hash_algo` as the key of `block_hash` was computed: suffixed `_low64` when truncated."""
    if isinstance(block_hash, bytes) or hash_algo is None:
        return hash_algo
    return hash_algo + LOW64_SUFFIX
