"""Attributes' encodings made once for the values that repeat from page to page.

A page's dtype, layout, model, shape, tier and most of the rest repeat from page to page:
each encoder (OTLP JSON in `encode`, OTLP protobuf in `encode_protobuf`) makes each one's
encoding once, not once a page.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)

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
        """The encodings of `attributes`, in their order; one that cannot be encoded is left out and logged."""
        if not attributes:
            return []
        kept = self._kept
        make = self._make
        encoded = []
        for key, value in attributes.items():
            name = (key, type(value), value)
            try:
                attribute = kept.get(name)
                keep = True
            except TypeError:  # an unhashable value (a list, a mapping, a tuple of them)
                attribute, keep = None, False
            if attribute is None:
                try:
                    attribute = make(key, value)
                except (TypeError, ValueError) as exc:  # a None in a sequence, an int past 64 bits
                    _left_out(key, exc)
                    continue
                if keep and not (type(value) in _SIZED and len(value) > LONGEST_KEPT):
                    if len(kept) >= self.most:
                        kept.clear()
                    kept[name] = attribute
            encoded.append(attribute)
        return encoded


# Names already logged: an attribute that cannot be encoded is named once, not at every span.
_LOGGED: set[str] = set()
_LOGGED_MOST = 256


def _left_out(key: str, exc: Exception) -> None:
    name = str(key)[:100]
    if name in _LOGGED or len(_LOGGED) >= _LOGGED_MOST:
        return
    _LOGGED.add(name)
    logger.warning("kvaudit: attribute %r cannot be sent in OTLP (%s): left out, the rest of its span sent", name, exc)
