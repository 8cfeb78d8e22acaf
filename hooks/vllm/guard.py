"""The in-process checks a fetched page must pass before the engine may use it.

These are the rules of DESIGN.md section 4 that need no other replica's data:
incomplete metadata (KVA001), a process-local reference (KVA002: a page in a shared
store cannot be from this process's memory), a size that does not match shape and
dtype (KVA003), and a page that differs from what this replica's connector reads
(KVA005: model, dtype, layout, shape, TP world size and rank, hash algorithm, head
geometry). Stamped producer fields take part as the page's own.
"""

from __future__ import annotations

import math
from typing import Final

from kvaudit.contract import REQUIRED_ON_FETCH, PageDescriptor, bytes_per_element
from kvaudit.hooks.vllm.formats import TRANSFER_RAW_PTR
from kvaudit.hooks.vllm.geometry import EngineGeometry

_DESCRIBED: Final = REQUIRED_ON_FETCH - {"used"}
_COMPARED: Final = ("model", "dtype", "world_size", "rank", "hash_algo", "layers", "kv_heads", "head_size")


def expected_page(geometry: EngineGeometry, layout: str | None) -> PageDescriptor:
    """What this replica's connector reads a page as: the reference the guard compares with."""
    return PageDescriptor(
        model=geometry.model,
        dtype=geometry.dtype,
        layout=layout,
        shape=(geometry.layers, geometry.block_size, geometry.kv_heads, 2 * geometry.head_size),
        world_size=geometry.world_size,
        rank=geometry.rank,
        hash_algo=geometry.hash_algo,
        layers=geometry.layers,
        kv_heads=geometry.kv_heads,
        head_size=geometry.head_size,
    )


def violations(page: PageDescriptor, expected: PageDescriptor) -> list[str]:
    """Why the page must not be used; empty when it passes."""
    problems = [f"missing {name}" for name in sorted(page.missing(_DESCRIBED))]
    if page.transfer == TRANSFER_RAW_PTR or page.address is not None:
        problems.append("process-local reference")
    if page.shape is not None and page.dtype is not None and page.bytes is not None:
        element = bytes_per_element(page.dtype)
        if element is not None and math.prod(page.shape) * element != page.bytes:
            problems.append("bytes differ from shape x dtype")
    for name in _COMPARED:
        got, want = getattr(page, name), getattr(expected, name)
        if got is not None and want is not None and got != want:
            problems.append(f"{name} {got!r} != {want!r}")
    if expected.layout is not None and page.layout is not None and page.layout != expected.layout:
        problems.append(f"layout {page.layout!r} != {expected.layout!r}")
    if expected.shape is not None and page.shape is not None and tuple(page.shape) != expected.shape:
        problems.append(f"shape {tuple(page.shape)} != {expected.shape}")
    return problems
