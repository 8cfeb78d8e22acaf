"""Sampled xxh3 checksums of page payloads.

Hashing every byte of a multi-MiB page costs about as much as copying it, so only a
sample of pages is hashed. The sample is chosen by key, not at random: a page whose
store was hashed is hashed again when it is fetched, so the two can be compared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_management import MemoryObj

_BUCKETS: Final = 1 << 16
PREFIX: Final = "xxh3_64:"


def sampled(key: CacheEngineKey, rate: float) -> bool:
    """Whether `key` falls in the sample taken at `rate` (0 never, 1 always)."""
    if rate <= 0.0:
        return False
    if rate >= 1.0:
        return True
    chunk_hash = key.chunk_hash
    value = int.from_bytes(chunk_hash[:8], "little") if isinstance(chunk_hash, bytes) else chunk_hash
    return (value % _BUCKETS) < rate * _BUCKETS


def payload_checksum(obj: MemoryObj) -> str:
    # Imported here: only processes that enable checksums need xxhash.
    import xxhash

    return PREFIX + xxhash.xxh3_64_hexdigest(obj.byte_array)
