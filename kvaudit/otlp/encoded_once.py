"""Attributes' encodings made once for the values that repeat from page to page.

A page's dtype, layout, model, shape, tier and most of the rest repeat from page to page:
each encoder (OTLP JSON in `encode`, OTLP protobuf in `encode_protobuf`) makes each one's
encoding once, not once a page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# Sized values longer than this are never kept: a page's key is its own, and whatever an
# engine sends (KV events reach `collect` from the network) stays out of memory once encoded.
LONGEST_KEPT = 48
_SIZED = frozenset({str, bytes, tuple})


class EncodedOnce(Generic[T]):
    """Each attribute's encoding by name, type and value (1, True and 1.0 are equal keys otherwise).

    Dropped whole when `most` are held; long strings, bytes and tuples and unhashable values
    (lists, mappings) are encoded every time. Shared by threads: each read and write is one
    dict operation under the GIL, and an encoding made twice by two threads is equal.

    Args:
        make: an attribute's encoding from its name and value.
        most: how many encodings are held at most.
    """

    def __init__(self, make: Callable[[str, Any], T], *, most: int = 8192) -> None:
        self._make = make
        self.most = most
        self._kept: dict[tuple[str, type, Any], T] = {}

    def all(self, attributes: Mapping[str, Any] | None) -> list[T]:
        """The encodings of `attributes`, in their order."""
        if not attributes:
            return []
        kept = self._kept
        make = self._make
        encoded = []
        for key, value in attributes.items():
            name = (key, type(value), value)
            try:
                attribute = kept.get(name)
            except TypeError:  # an unhashable value (a list, a mapping, a tuple of them)
                encoded.append(make(key, value))
                continue
            if attribute is None:
                attribute = make(key, value)
                if not (type(value) in _SIZED and len(value) > LONGEST_KEPT):
                    if len(kept) >= self.most:
                        kept.clear()
                    kept[name] = attribute
            encoded.append(attribute)
        return encoded
