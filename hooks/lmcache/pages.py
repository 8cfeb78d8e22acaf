"""Page descriptors of LMCache's stored and fetched memory objects (docs/design.md section 3).

A store descriptor is complete: the storing engine knows its own configuration. A
fetch descriptor holds only what the fetched object carried: its key (model, world
size, worker and chunk hash are part of LMCache's `CacheEngineKey`), and its shape,
dtype and memory format when the backend transmitted them. A backend that did not
(the `fs://` connector with `save_chunk_meta=False` allocates the object from the
reader's own configuration) leaves those fields absent. A fetched page never carries
a geometry fingerprint: under `prevent` its key's tag is the one the consumer itself
put there, so only the producer's store descriptor says which geometry computed it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec

from kvaudit.contract import PageDescriptor, Tier, Transfer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_management import MemoryObj
    from lmcache.v1.metadata import LMCacheMetadata

_TIER_OF_BACKEND: Final = {
    "LocalCPUBackend": Tier.CPU.value,
    "LocalDiskBackend": Tier.DISK.value,
    "RemoteBackend": Tier.REMOTE.value,
    "P2PBackend": Tier.REMOTE.value,
}
_SHORT_NAME: Final = {
    "LocalCPUBackend": "local_cpu",
    "LocalDiskBackend": "local_disk",
    "RemoteBackend": "remote",
}


def backend_label(name: str | None) -> str:
    """The contract's backend name (`lmcache.local_cpu`, `lmcache.remote`, ...)."""
    if name is None:
        return "lmcache"
    base = name.split("-", 1)[0]
    return "lmcache." + _SHORT_NAME.get(base, base)


def tier_of(name: str | None) -> str | None:
    return None if name is None else _TIER_OF_BACKEND.get(name.split("-", 1)[0])


def key_hex(key: CacheEngineKey) -> str:
    """The chunk hash as unsigned hex (Python's builtin hash, LMCache's default, is signed),
    then the key's `lmcache.tag.*` entries as LMCache writes them (`@name%value`): keys
    differing only there are different pages (the `prevent` tag, docs/design.md section 4.5).
    """
    chunk_hash = key.chunk_hash
    text = chunk_hash.hex() if isinstance(chunk_hash, bytes) else f"{chunk_hash & 0xFFFFFFFFFFFFFFFF:016x}"
    return text + "".join(f"@{name}%{value}" for name, value in getattr(key, "tags", None) or ())


def dtype_name(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


class ObjectFacts(msgspec.Struct, gc=False):
    """What a stored page's descriptor reads off its memory object, read while LMCache holds it
    (an allocator may recycle the object, and its metadata, once the store is done). A
    struct, not a named tuple: made in C, with no Python frame (one a chunk, on the
    serving thread).

    `size` is the object's `get_size()`; None where it is worked out when read (`size_of`)
    from `groups`, the shapes and dtypes of the object's metadata, or its shape and dtype.
    """

    dtype: object
    shape: tuple[int, ...]
    memory_format: object
    size: int | None
    groups: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None


# Memory object classes whose facts are read off their metadata in place, as their getters
# return them: LMCache's `TensorMemoryObj`, named by `instrument()` (this module imports
# without LMCache). Three calls fewer a chunk, on the serving thread (`get_memory_format`
# takes the object's lock to read one attribute).
READ_IN_PLACE: list[type] = []


def objects_facts(objs: Sequence[MemoryObj | None]) -> list[ObjectFacts | None]:
    """The facts of each object (None for a missing one), in one call: no Python call a chunk."""
    facts: list[ObjectFacts | None] = []
    for obj in objs:
        if obj is None:
            facts.append(None)
        elif type(obj) in READ_IN_PLACE:
            meta = obj.meta  # type: ignore[attr-defined]
            shapes, dtypes = meta.shapes, meta.dtypes
            # Its size is what its metadata is made of: worked out when read (`size_of`), not
            # here, where `get_size` is four Python calls a chunk. The lists copied (in C): a
            # recycled object's metadata may be given others.
            groups = (tuple(shapes), tuple(dtypes)) if shapes is not None and dtypes is not None else None
            facts.append(ObjectFacts(meta.dtype, meta.shape, meta.fmt, None, groups))
        else:
            facts.append(ObjectFacts(obj.get_dtype(), obj.get_shape(), obj.get_memory_format(), obj.get_size()))
    return facts


def object_facts(obj: MemoryObj) -> ObjectFacts:
    facts = objects_facts([obj])[0]
    assert facts is not None
    return facts


def size_of(facts: ObjectFacts) -> int:
    """The object's size in bytes, as LMCache's `MemoryObjMetadata.get_size` works it out."""
    if facts.size is not None:
        return facts.size
    if facts.groups is not None:
        from lmcache.utils import get_size_bytes

        return get_size_bytes(*facts.groups)
    return facts.shape.numel() * facts.dtype.itemsize  # type: ignore[attr-defined]


def store_page(
    key: CacheEngineKey,
    facts: ObjectFacts,
    metadata: LMCacheMetadata,
    hash_algo: str | None,
    token_range: tuple[int, int] | None,
    checksum: str | None,
    geometry: str | None,
) -> PageDescriptor:
    """The complete descriptor of a page this engine stores, with its engine's geometry fingerprint."""
    layers, _, _, kv_heads, head_size = metadata.kv_shape
    start, end = token_range if token_range is not None else (None, None)
    return PageDescriptor(
        key=key_hex(key),
        hash_algo=hash_algo,
        token_start=start,
        token_end=end,
        model=key.model_name,
        dtype=dtype_name(facts.dtype),
        shape=tuple(facts.shape),
        layout=facts.memory_format.name,  # type: ignore[attr-defined]
        bytes=size_of(facts),
        world_size=key.world_size,
        rank=key.worker_id,
        layers=layers,
        kv_heads=kv_heads,
        head_size=head_size,
        checksum=checksum,
        # LMCache copies every payload into a memory object of its own.
        transfer=Transfer.COPY,
        geometry=geometry,
    )


def fetch_page(
    key: CacheEngineKey,
    facts: ObjectFacts,
    *,
    carried_meta: bool,
    hash_algo: str | None,
    token_range: tuple[int, int] | None,
    tier: str | None,
    checksum: str | None,
) -> PageDescriptor:
    """What a fetched object carried; `used` is decided later (LMCache's prefix rule, the guard)."""
    start, end = token_range if token_range is not None else (None, None)
    page = PageDescriptor(
        key=key_hex(key),
        hash_algo=hash_algo,
        token_start=start,
        token_end=end,
        model=key.model_name,
        bytes=size_of(facts),
        world_size=key.world_size,
        rank=key.worker_id,
        checksum=checksum,
        transfer=Transfer.COPY,
        tier=tier,
    )
    if carried_meta:
        shape = tuple(facts.shape)
        fmt = facts.memory_format.name  # type: ignore[attr-defined]
        page.dtype = dtype_name(facts.dtype)
        page.shape = shape
        page.layout = fmt
        # KV_2LTD is [2, layers, tokens, heads*head_size]: the layer count is carried,
        # the head split is not.
        if fmt == "KV_2LTD" and len(shape) == 4:
            page.layers = shape[1]
    return page


def missing_page(key: CacheEngineKey, token_range: tuple[int, int] | None) -> PageDescriptor:
    """What a layer above is told of a requested chunk LMCache did not get."""
    start, end = token_range if token_range is not None else (None, None)
    return PageDescriptor(key=key_hex(key), token_start=start, token_end=end, used=False)
