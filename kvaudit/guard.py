"""The guard's checks: the audit rules a consumer can decide alone, while a fetched page is still in its hands.

Both hooks (`kvaudit.hooks.vllm`, `kvaudit.hooks.lmcache`) and the simulator ask this
module whether a fetched page may be used (docs/design.md section 4.4). A page that
fails becomes a safe miss: the engine recomputes it. The checks are the rules of
docs/design.md section 4 that need no other replica's data, plus KVA004 where the
producer's stored descriptor is known:

- KVA001: a field required on a fetch is absent;
- KVA002: the payload is a process-local reference (`address`, or `transfer=raw_ptr`);
- KVA003: `bytes` differs from `shape` times the size of `dtype`;
- KVA005: the page, or its producer's stored descriptor, differs from what the consumer
  reads (`CONSUMER_FIELDS`, and the shape where the consumer knows what to expect);
- KVA004: the page differs from its producer's stored descriptor (`STORED_FIELDS`).

Fields absent on either side are not compared: an absent field is KVA001's.
"""

from __future__ import annotations

import math
from typing import Final

from kvaudit.contract import (
    CONSUMER_FIELDS,
    REQUIRED_ON_FETCH,
    STORED_FIELDS,
    PageDescriptor,
    Transfer,
    bytes_per_element,
)

_DESCRIBED: Final = REQUIRED_ON_FETCH - {"used"}  # `used` is what the guard decides


def violations(page: PageDescriptor, consumer: PageDescriptor, stored: PageDescriptor | None = None) -> list[str]:
    """Why `page` must not be used, as `CODE field` each (`KVA005 layout`); empty when it passes.

    Args:
        page: what the fetched object carried.
        consumer: what the consumer reads a page as: its own configuration
            (`PageDescriptor.from_config`) and the shape it expects, where it knows one.
        stored: the producer's store descriptor of the same key, when one is known.
    """
    found = [f"KVA001 {name}" for name in sorted(page.missing(_DESCRIBED))]
    if page.address is not None or page.transfer == Transfer.RAW_PTR:
        found.append("KVA002 address")
    if page.shape is not None and page.dtype is not None and page.bytes is not None:
        size = bytes_per_element(page.dtype)
        if size is not None and math.prod(page.shape) * size != page.bytes:
            found.append("KVA003 bytes")
    for source in (page, stored):
        if source is not None:
            found += [f"KVA005 {name}" for name in _differing(source, consumer, CONSUMER_FIELDS)]
    if consumer.shape is not None and page.shape is not None and tuple(page.shape) != tuple(consumer.shape):
        found.append("KVA005 shape")
    if stored is not None:
        found += [f"KVA004 {name}" for name in _differing(page, stored, STORED_FIELDS)]
    # The page and its stored descriptor may disagree with the consumer on the same field.
    return list(dict.fromkeys(found))


def _differing(one: PageDescriptor, other: PageDescriptor, fields: tuple[str, ...]) -> list[str]:
    return [
        name
        for name in fields
        if (a := getattr(one, name)) is not None and (b := getattr(other, name)) is not None and a != b
    ]
