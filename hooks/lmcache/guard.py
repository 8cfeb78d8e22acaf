"""The in-process checks of guard mode (the audit rules of DESIGN.md section 4 that a
consumer can decide on its own, while the fetch is still in its hands).

A page that fails any of them must not be used: the instrumentor turns it, and every
later page of the same prefix, into a miss, so LMCache recomputes instead of serving
it.
"""

from __future__ import annotations

import math
from typing import Final

from kvaudit.contract import REQUIRED_ON_FETCH, KVConfig, PageDescriptor, bytes_per_element

# Fields a fetched page must agree on with the consumer (KVA005) ...
_CONSUMER_FIELDS: Final = (
    "model",
    "dtype",
    "layout",
    "world_size",
    "rank",
    "hash_algo",
    "layers",
    "kv_heads",
    "head_size",
)
# ... and with the descriptor its producer stored under the same key (KVA004).
_STORED_FIELDS: Final = (
    "model",
    "dtype",
    "shape",
    "layout",
    "bytes",
    "token_start",
    "token_end",
    "world_size",
    "rank",
    "checksum",
)
_REQUIRED: Final = REQUIRED_ON_FETCH - {"used"}


def violations(
    page: PageDescriptor,
    consumer: KVConfig,
    expected_shape: tuple[int, ...] | None,
    stored: PageDescriptor | None,
) -> list[str]:
    """Why `page` must not be used (`RULE field` each); empty when it passes.

    Args:
        page: what the fetched object carried.
        consumer: the fetching engine's own configuration.
        expected_shape: the shape the consumer would give a page of this many tokens.
        stored: the producer's store descriptor of the same key, when one is known.
    """
    found = [f"KVA001 {name}" for name in sorted(page.missing(_REQUIRED))]
    if page.address is not None or page.transfer == "raw_ptr":
        found.append("KVA002 address")
    if page.shape is not None and page.dtype is not None and page.bytes is not None:
        size = bytes_per_element(page.dtype)
        if size is not None and math.prod(page.shape) * size != page.bytes:
            found.append("KVA003 bytes")
    for source in (page, stored):
        if source is None:
            continue
        for name in _CONSUMER_FIELDS:
            mine, theirs = getattr(consumer, name), getattr(source, name)
            if mine is not None and theirs is not None and mine != theirs:
                found.append(f"KVA005 {name}")
    if expected_shape is not None and page.shape is not None and page.shape != expected_shape:
        found.append("KVA005 shape")
    if stored is not None:
        for name in _STORED_FIELDS:
            mine, theirs = getattr(page, name), getattr(stored, name)
            if mine is not None and theirs is not None and mine != theirs:
                found.append(f"KVA004 {name}")
    # The page and its stored descriptor may disagree with the consumer on the same field.
    return list(dict.fromkeys(found))
