"""The two layers of the reference deployment, hand-built (docs/design.md section 6.4): a replica's vLLM
layer records a page per block with the key of the LMCache chunk that served it (`source_key`); its
LMCache layer, a child span in the same trace, records the chunk with everything the object carried.
"""

from __future__ import annotations

import msgspec

from kvaudit.contract import Hook, Op, Outcome, PageDescriptor
from kvaudit.emit.emitter import Emitter

from .fleet import Fleet, page
from .pages import KV

BLOCK, CHUNK = 32, 256
VLLM_KV = msgspec.structs.replace(KV, layout="KV_2LTD", hash_algo="sha256")
LMCACHE_KV = msgspec.structs.replace(VLLM_KV, block_size=CHUNK, hash_algo="builtin")


def chunk_page(key: str, *, used: bool | None = None, **changes: object) -> PageDescriptor:
    """An LMCache chunk page as LMCache's hook records it from `lm://` (no head split travels)."""
    fields: dict[str, object] = {
        "hash_algo": "builtin",
        "token_end": CHUNK,
        "shape": (2, 2, CHUNK, 64),
        "layout": "KV_2LTD",
        "bytes": 2 * 2 * CHUNK * 64 * 2,
        "kv_heads": None,
        "head_size": None,
        "checksum": None,
        "used": used,
    }
    return page(key, 0, **(fields | changes))


def block_pages(chunk: str, *, used: bool | None = None, source: bool = True) -> list[PageDescriptor]:
    """The vLLM layer's pages of the chunk's blocks: key, hash algorithm, token range."""
    return [
        PageDescriptor(
            key=f"b{index}",
            hash_algo="sha256",
            token_start=index * BLOCK,
            token_end=(index + 1) * BLOCK,
            used=used,
            source_key=chunk if source else None,
        )
        for index in range(CHUNK // BLOCK)
    ]


class Layers:
    """One replica's two processes' emitters: its vLLM layer and its LMCache layer."""

    def __init__(self, fleet: Fleet, name: str, **geometry: object) -> None:
        self.fleet = fleet
        self.vllm = fleet.replica(name, msgspec.structs.replace(VLLM_KV, **geometry))
        self.lmcache = fleet.replica(name, msgspec.structs.replace(LMCACHE_KV, **geometry), engine="lmcache")

    def store(self, chunk: PageDescriptor) -> None:
        with self.vllm.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id="q") as above:
            self._below(Op.STORE, Hook.LMCACHE_BACKEND, above.context, [chunk])
            for block in block_pages(chunk.key or ""):
                above.add_page(block)
            above.end(tokens_stored=CHUNK)

    def fetch(self, chunk: PageDescriptor | None, blocks: list[PageDescriptor], *, other_trace: bool = False) -> None:
        with self.vllm.operation(Op.FETCH, hook=Hook.VLLM_CONNECTOR, request_id="q") as above:
            if chunk is not None:
                self._below(Op.FETCH, Hook.LMCACHE_ENGINE, None if other_trace else above.context, [chunk])
            for block in blocks:
                above.add_page(block)
            above.end(Outcome.HIT, tokens_hit=CHUNK)

    def _below(self, op: Op, hook: Hook, parent: object, pages: list[PageDescriptor]) -> None:
        emitter: Emitter = self.lmcache
        with emitter.operation(op, hook=hook, request_id="q", parent=parent) as below:  # type: ignore[arg-type]
            for chunk in pages:
                below.add_page(chunk)
            below.end(Outcome.HIT)
