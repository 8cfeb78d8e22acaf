"""Shared fixtures: emitters writing real trace files through the real exporter."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from kvaudit.contract import KVConfig, PageDescriptor

# Property tests draw the same examples on every run, so CI cannot fail on a draw that
# no earlier run saw; a property that breaks still breaks on every run.
settings.register_profile("kvaudit", derandomize=True)
settings.load_profile("kvaudit")

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


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    path = tmp_path / "traces"
    path.mkdir()
    return path
