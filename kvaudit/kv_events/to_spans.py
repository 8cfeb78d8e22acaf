"""vLLM KV events as the trace contract: `kvaudit.store` and `kvaudit.evict` spans.

A `BlockStored` becomes one store span whose pages are its blocks; consecutive
`BlockRemoved` events of a batch become one evict span; `AllBlocksCleared` (a prefix
cache reset) becomes one evict span listing every block the stream knew to be cached.
Keys are the block hashes in hex, so the views and queries need no special case for
this source. Events say nothing of bytes or geometry, and nothing of prompt text
reaches a span: token ids serve only to count tokens.

Token ranges are not in the events: a block's range follows from its parent's (a
block without a parent starts the prompt at token 0), so the translator remembers the
range of every block it knows to be cached. Where the parent is unknown (the
subscriber started late, or batches were lost), the range stays absent.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from kvaudit.contract import EvictReason, Hook, Op, PageDescriptor, SpanAttr, Tier
from kvaudit.emit.emitter import Emitter, Operation
from kvaudit.kv_events.wire import (
    BlockRemoved,
    BlockStored,
    DecodedBatch,
    ExternalBlockHash,
    KVEvent,
    block_key,
    key_hash_algo,
)

# The `kvaudit.backend` of these spans: vLLM's own paged KV cache with its prefix cache.
BACKEND: Final = "vllm.prefix_cache"

# vLLM's `medium` names (MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE) as contract tiers.
_TIER_OF_MEDIUM: Final = {"GPU": Tier.GPU, "CPU": Tier.CPU, "STORAGE": Tier.DISK}


@dataclass(frozen=True)
class CachedBlock:
    """What the translator remembers of a block it knows to be cached."""

    token_start: int | None
    token_end: int | None
    tier: str | None
    hash_algo: str | None
    kv_group: int | None = None
    kv_group_kind: str | None = None
    sliding_window: int | None = None


def tier_of(medium: str | None) -> str | None:
    """The contract tier of a vLLM medium; an unknown medium passes through in lower case."""
    if medium is None:
        return None
    return _TIER_OF_MEDIUM.get(medium, medium.lower())


class StreamTranslator:
    """Turns the batches of one publisher into spans, in sequence order.

    Args:
        emitter: where the spans go (its resource names the replica).
        hash_algo: how vLLM computed the block hashes (its `prefix_caching_hash_algo`),
            for the pages' `hash_algo`; None leaves it absent, as the events do not say.
    """

    def __init__(self, emitter: Emitter, *, hash_algo: str | None = None) -> None:
        self._emitter = emitter
        self._hash_algo = hash_algo
        # (kv cache group, key) -> block; bounded by the engine's number of cached blocks.
        self._cached: dict[tuple[int | None, str], CachedBlock] = {}

    @property
    def cached_blocks(self) -> int:
        return len(self._cached)

    def translate(self, batch: DecodedBatch) -> None:
        # All events of a batch share its timestamp: one nanosecond apart per span keeps
        # their order visible to queries (a block removed, then stored again, in one step).
        at_ns = int(batch.ts * 1e9)
        for kind, events in _runs(batch.events):
            if kind is BlockStored:
                for event in events:
                    self._stored(event, at_ns)  # type: ignore[arg-type]
                    at_ns += 1
            elif kind is BlockRemoved:
                self._removed(events, at_ns)  # type: ignore[arg-type]
                at_ns += 1
            else:
                self.clear(at_ns)
                at_ns += 1

    def clear(self, at_ns: int) -> None:
        """Every known block left the cache (a prefix cache reset, or the engine restarted)."""
        blocks = self._cached
        self._cached = {}
        op = self._operation(Op.EVICT, at_ns, {SpanAttr.EVICT_REASON: EvictReason.CLEARED.value})
        for (_, key), block in blocks.items():
            op.add_page(_page(key, block))
        op.end()

    def _stored(self, event: BlockStored, at_ns: int) -> None:
        block_size = event.block_size
        tier = tier_of(event.medium)
        start = self._start_of(event)
        # Null or masked blocks (sliding window) have no hash: ranges then cannot be assigned.
        if len(event.token_ids) != len(event.block_hashes) * block_size:
            start = None
        op = self._operation(Op.STORE, at_ns, {SpanAttr.BLOCK_SIZE: block_size})
        for index, block_hash in enumerate(event.block_hashes):
            key = block_key(block_hash)
            token_start = None if start is None else start + index * block_size
            block = CachedBlock(
                token_start,
                None if token_start is None else token_start + block_size,
                tier,
                key_hash_algo(block_hash, self._hash_algo),
                event.group_idx,
                event.kv_cache_spec_kind,
                event.kv_cache_spec_sliding_window,
            )
            self._cached[(event.group_idx, key)] = block
            op.add_page(_page(key, block))
        op.end(tokens_stored=len(event.token_ids))

    def _start_of(self, event: BlockStored) -> int | None:
        if event.parent_block_hash is None:
            return 0
        parent = self._cached.get((event.group_idx, block_key(event.parent_block_hash)))
        return None if parent is None else parent.token_end

    def _removed(self, events: Iterable[BlockRemoved], at_ns: int) -> None:
        op = self._operation(Op.EVICT, at_ns, None)
        for event in events:
            for block_hash in event.block_hashes:
                key = block_key(block_hash)
                block = self._cached.pop((event.group_idx, key), None)
                op.add_page(_page(key, block) if block else self._unknown_page(key, block_hash, event))
        op.end()

    def _unknown_page(self, key: str, block_hash: ExternalBlockHash, event: BlockRemoved) -> PageDescriptor:
        return PageDescriptor(
            key=key,
            hash_algo=key_hash_algo(block_hash, self._hash_algo),
            tier=tier_of(event.medium),
            kv_group=event.group_idx,
        )

    def _operation(self, op: Op, at_ns: int, attributes: dict[str, object] | None) -> Operation:
        return self._emitter.operation(
            op, hook=Hook.VLLM_KV_EVENTS, backend=BACKEND, attributes=attributes, at_ns=at_ns
        )


def _page(key: str, block: CachedBlock) -> PageDescriptor:
    return PageDescriptor(
        key=key,
        hash_algo=block.hash_algo,
        token_start=block.token_start,
        token_end=block.token_end,
        tier=block.tier,
        kv_group=block.kv_group,
        kv_group_kind=block.kv_group_kind,
        sliding_window=block.sliding_window,
    )


def _runs(events: list[KVEvent]) -> Iterator[tuple[type, list[KVEvent]]]:
    """Consecutive events grouped by type, so that a run of removals makes one evict span."""
    run: list[KVEvent] = []
    for event in events:
        if run and type(event) is not type(run[0]):
            yield type(run[0]), run
            run = []
        run.append(event)
    if run:
        yield type(run[0]), run
