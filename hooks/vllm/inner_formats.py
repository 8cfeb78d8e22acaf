"""How pages of each kind of inner connector are found and described.

A *unit* is what the inner connector loads or stores for one request in one step
(for ExampleConnector: one prompt's directory of per-layer files). A format maps the
inner connector's metadata to units and describes their pages:

- on a store, from the producing engine's own configuration and what the format
  writes (the store side always knows);
- on a fetch, only from what the fetched object carries (file headers, sizes),
  never from the consumer's configuration.

Layouts use docs/design.md's names for the axes of one layer's payload (`NB` blocks, `NT`
tokens, `BS` tokens of a block, `NH` KV heads, `2HS` K and V packed on one axis); a
page's `shape` is `(layers, *one layer's share of the page)`.
"""

from __future__ import annotations

import json
import os
import struct
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec

from kvaudit.contract import PageDescriptor, Tier, Transfer
from kvaudit.hooks.vllm.geometry import EngineGeometry
from kvaudit.hooks.vllm.plans import RequestPlan

if TYPE_CHECKING:
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata

# ExampleConnector: one file per layer holding `kv_cache` as [tokens, kv heads, 2 * head size].
EXAMPLE_LAYOUT: Final = "NT_NH_2HS"
# vLLM's CPU paged KV cache per layer: [blocks, kv heads, block size, 2 * head size].
CPU_PAGED_LAYOUT: Final = "NB_NH_BS_2HS"

_SAFETENSORS_DTYPES: Final = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I8": "int8",
    "U8": "uint8",
}


class Unit(msgspec.Struct):
    """One load or store of the inner connector for one request (a struct: made in C, one a
    unit a step, on the serving thread).

    Attributes:
        plan: the request it belongs to.
        is_store: a store (else a load).
        token_start: first token the unit covers (block aligned).
        num_tokens: tokens the unit covers (whole blocks).
        ref: the inner connector's own record of the unit.
    """

    plan: RequestPlan
    is_store: bool
    token_start: int
    num_tokens: int
    ref: Any = None


class InnerFormat(Protocol):
    backend: str
    layout: str | None
    """The page layout this format exchanges: what the replica expects to fetch."""

    def units(self, inner_meta: KVConnectorMetadata, plans: list[RequestPlan]) -> list[Unit]: ...

    def describe_fetch(self, unit: Unit) -> list[PageDescriptor]: ...

    def describe_store(self, unit: Unit, kv_caches: dict[str, torch.Tensor]) -> list[PageDescriptor]: ...


def page_skeletons(unit: Unit, geometry: EngineGeometry, fields: dict[str, Any]) -> list[PageDescriptor]:
    """One descriptor per whole block the unit covers: key, token range, its KV cache group and `fields`."""
    block_size = geometry.block_size
    first = unit.token_start // block_size
    keys = unit.plan.keys
    fields = {**geometry.group_fields, **fields}
    return [
        PageDescriptor(
            key=keys[index] if index < len(keys) else None,
            token_start=index * block_size,
            token_end=(index + 1) * block_size,
            **fields,
        )
        for index in range(first, first + unit.num_tokens // block_size)
    ]


def store_fields(geometry: EngineGeometry, shape: tuple[int, ...], layout: str, transfer: Transfer) -> dict[str, Any]:
    """What every page a producer stores shares: computed once per connector, not per page."""
    page = PageDescriptor.from_config(
        geometry.kv_config(layout), shape=shape, bytes=geometry.page_bytes, transfer=transfer, tier=Tier.DISK
    )
    return {name: value for name, value in msgspec.structs.asdict(page).items() if value is not None}


class OpaqueFormat:
    """An inner connector kvaudit cannot look into: fetches come from the scheduler's load plans
    and carry only key, hash algorithm and token range; its stores are not seen."""

    layout = None

    def __init__(self, backend: str, geometry: EngineGeometry) -> None:
        self.backend = backend
        self._geometry = geometry
        self._fetch_fields = {"hash_algo": geometry.hash_algo}

    def units(self, inner_meta: KVConnectorMetadata, plans: list[RequestPlan]) -> list[Unit]:
        return [Unit(plan, False, plan.local_tokens, plan.load_tokens) for plan in plans if plan.load_tokens > 0]

    def describe_fetch(self, unit: Unit) -> list[PageDescriptor]:
        return page_skeletons(unit, self._geometry, self._fetch_fields)

    def describe_store(self, unit: Unit, kv_caches: dict[str, torch.Tensor]) -> list[PageDescriptor]:
        return []


class ExampleFormat:
    """vLLM's ExampleConnector: `DIR/<prompt hash>/<layer>.safetensors`, whole prompts."""

    backend = "vllm.example_connector"
    layout = EXAMPLE_LAYOUT
    payload_suffix = ".safetensors"

    def __init__(self, inner: KVConnectorBase_V1, geometry: EngineGeometry) -> None:
        self._inner = inner
        self._geometry = geometry
        self._fetch_fields = {"hash_algo": geometry.hash_algo}
        self._store_fields = self.store_fields(geometry)

    @staticmethod
    def store_fields(geometry: EngineGeometry) -> dict[str, Any]:
        shape = (geometry.layers, geometry.block_size, geometry.kv_heads, 2 * geometry.head_size)
        return store_fields(geometry, shape, EXAMPLE_LAYOUT, Transfer.COPY)

    def units(self, inner_meta: KVConnectorMetadata, plans: list[RequestPlan]) -> list[Unit]:
        """Match each of the inner metadata's requests to its plan by its first block id.

        Two requests scheduled in one step can share a first block only when they share
        a cached prefix; the first unmatched plan is taken then.
        """
        block_size = self._geometry.block_size
        by_first_block: dict[int, list[RequestPlan]] = {}
        for plan in plans:
            if plan.block_ids:
                by_first_block.setdefault(plan.block_ids[0], []).append(plan)
        units = []
        for record in getattr(inner_meta, "requests", ()):
            slots = record.slot_mapping
            if len(slots) == 0:
                continue
            candidates = by_first_block.get(int(slots[0]) // block_size)
            if candidates:
                units.append(Unit(candidates.pop(0), bool(record.is_store), 0, len(slots), record))
        return units

    def folder(self, unit: Unit) -> str:
        record = unit.ref
        return self._inner._generate_foldername_debug(record.token_ids, record.mm_hashes, create_folder=False)

    def payload_files(self, unit: Unit) -> list[str]:
        folder = self.folder(unit)  # hashes the prompt's token ids: once
        try:
            names = sorted(name for name in os.listdir(folder) if name.endswith(self.payload_suffix))
        except OSError:
            return []
        return [os.path.join(folder, name) for name in names]

    def describe_fetch(self, unit: Unit) -> list[PageDescriptor]:
        pages = page_skeletons(unit, self._geometry, self._fetch_fields)
        headers = [_safetensors_header(path) for path in self.payload_files(unit)]
        tensors = [header.get("kv_cache") for header in headers if header is not None]
        if not tensors or len(tensors) != len(headers) or any(not _is_tensor_entry(t) for t in tensors):
            return pages
        dtypes = {t["dtype"] for t in tensors}
        token_shapes = {tuple(t["shape"][1:]) for t in tensors}
        if len(dtypes) != 1 or len(token_shapes) != 1:
            return pages  # layers disagree: the object does not describe one page format
        dtype = _SAFETENSORS_DTYPES.get(dtypes.pop())
        tokens = min(t["shape"][0] for t in tensors)
        token_shape = token_shapes.pop()
        token_bytes = sum((t["data_offsets"][1] - t["data_offsets"][0]) // max(t["shape"][0], 1) for t in tensors)
        block_size = self._geometry.block_size
        for page in pages:
            page.tier = Tier.DISK.value
            page.transfer = Transfer.COPY
            assert page.token_end is not None
            if page.token_end > tokens:
                continue  # the file stops short of this page: nothing to describe
            page.dtype = dtype
            page.shape = (len(tensors), block_size, *token_shape)
            page.bytes = token_bytes * block_size
            page.layers = len(tensors)
            if len(token_shape) == 2:
                page.layout = EXAMPLE_LAYOUT
                page.kv_heads = token_shape[0]
                page.head_size = token_shape[1] // 2
        return pages

    def describe_store(self, unit: Unit, kv_caches: dict[str, torch.Tensor]) -> list[PageDescriptor]:
        return page_skeletons(unit, self._geometry, self._store_fields)


class RawPointerFormat(ExampleFormat):
    """The fault connector's raw-pointer fallback: `<layer>.raw` files holding the paged
    blocks' bytes, with no dtype, shape or layout at all."""

    backend = "kvaudit.fault_raw_pointer"
    payload_suffix = ".raw"

    @staticmethod
    def store_fields(geometry: EngineGeometry) -> dict[str, Any]:
        shape = (geometry.layers, geometry.kv_heads, geometry.block_size, 2 * geometry.head_size)
        return store_fields(geometry, shape, CPU_PAGED_LAYOUT, Transfer.RAW_PTR)

    def describe_fetch(self, unit: Unit) -> list[PageDescriptor]:
        pages = page_skeletons(unit, self._geometry, self._fetch_fields)
        files = self.payload_files(unit)
        sizes = [_size(path) for path in files]
        total = sum(sizes) if files and None not in sizes else None
        for page in pages:
            page.tier = Tier.DISK.value
            page.transfer = Transfer.RAW_PTR
            if total is not None and pages:
                page.bytes = total // len(pages)
                page.layers = len(files)
        return pages

    def describe_store(self, unit: Unit, kv_caches: dict[str, torch.Tensor]) -> list[PageDescriptor]:
        pages = page_skeletons(unit, self._geometry, self._store_fields)
        first_cache = next(iter(kv_caches.values()), None)
        first_block = unit.token_start // self._geometry.block_size
        for index, page in enumerate(pages):
            block = first_block + index
            if first_cache is not None and block < len(unit.plan.block_ids):
                # The process-local address the fallback copied from: meaningless elsewhere.
                page.address = int(first_cache[unit.plan.block_ids[block]].data_ptr())
        return pages


def _safetensors_header(path: str) -> dict[str, Any] | None:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON)."""
    try:
        with open(path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
    except (OSError, ValueError, struct.error):
        return None
    return header if isinstance(header, dict) else None


def _is_tensor_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("dtype"), str)
        and isinstance(entry.get("shape"), list)
        and len(entry["shape"]) >= 1
        and isinstance(entry.get("data_offsets"), list)
        and len(entry["data_offsets"]) == 2
    )


def _size(path: str) -> int | None:
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def format_for(inner: KVConnectorBase_V1, geometry: EngineGeometry) -> InnerFormat:
    """The format of an inner connector instance; opaque unless kvaudit knows its objects."""
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

    from kvaudit.hooks.vllm.fault import RawPointerFaultConnector

    if isinstance(inner, RawPointerFaultConnector):
        return RawPointerFormat(inner, geometry)
    if isinstance(inner, ExampleConnector):
        return ExampleFormat(inner, geometry)
    return OpaqueFormat(f"vllm.{type(inner).__name__}", geometry)
