"""The model geometry the tests share and a page descriptor with every field of the contract set."""

from __future__ import annotations

from kvaudit.contract import KVConfig, PageDescriptor

KV = KVConfig(
    model="tiny-llama",
    dtype="bfloat16",
    layout="NB_NH_BS_2HS",
    block_size=32,
    world_size=1,
    rank=0,
    hash_algo="sha256_cbor",
    layers=2,
    kv_heads=2,
    head_size=32,
)


def full_page(key: str, index: int = 0, *, used: bool | None = None) -> PageDescriptor:
    """A page descriptor with every field of the contract set."""
    return PageDescriptor(
        key=key,
        hash_algo="sha256_cbor",
        token_start=index * 32,
        token_end=(index + 1) * 32,
        model="tiny-llama",
        dtype="bfloat16",
        shape=(2, 2, 32, 64),
        layout="NB_NH_BS_2HS",
        bytes=2 * 2 * 32 * 64 * 2,
        world_size=1,
        rank=0,
        layers=2,
        kv_heads=2,
        head_size=32,
        used=used,
        checksum="xxh3_64:0123456789abcdef",
        transfer="copy",
        address=140_000_000_000 + index,
        tier="cpu",
    )
