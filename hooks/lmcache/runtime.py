"""The process-wide state the LMCache hooks share: options, emitter, token ranges.

The store plugin is built by LMCache from its configuration, the instrumentor by the
caller; both reach the same `Runtime`. Its emitter is made when the first operation is
recorded, because only then is the engine's own KV configuration (its resource) known.
"""

from __future__ import annotations

import logging
import operator
import threading
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import msgspec

from kvaudit.contract import KVConfig, geometry_fingerprint
from kvaudit.emit.emitter import UNRECORDED, Emitter
from kvaudit.emit.setup import setup_emitter
from kvaudit.hooks.lmcache.registry import StoreRegistry
from kvaudit.sampling import request_sampler, sample_rate

if TYPE_CHECKING:
    from collections.abc import Sequence

    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata

    from kvaudit.hooks.lmcache.links import Link

logger = logging.getLogger(__name__)

# extra_config entries read when the plugin, not `instrument()`, configures the hooks.
CFG_REPLICA: Final = "kvaudit.replica"
CFG_EXPORT: Final = "kvaudit.export"
CFG_GUARD: Final = "kvaudit.guard"
CFG_CHECKSUM_RATE: Final = "kvaudit.checksum_rate"
CFG_REGISTRY: Final = "kvaudit.registry"
CFG_PREVENT: Final = "kvaudit.prevent"
CFG_SAMPLE_RATE: Final = "kvaudit.sample_rate"

# The request an engine call serves, set around LMCacheEngine's store/retrieve/lookup
# so the storage-level hooks below them can name it.
REQUEST_ID: ContextVar[str | None] = ContextVar("kvaudit_lmcache_request_id", default=None)

# Token ranges of recently hashed keys. A chained prefix hash fixes its position in
# the prompt, so one entry per key is enough; the bound only caps memory.
_MAX_RANGES: Final = 1 << 16
_CHUNK_HASH: Final = operator.attrgetter("chunk_hash")


@dataclass(frozen=True)
class Options:
    replica: str | None = None
    export: str | None = None
    guard: bool = False
    checksum_rate: float = 0.0
    registry: str | None = None
    prevent: bool = False
    sample_rate: float = 1.0

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> Options:
        extra = extra or {}
        return cls(
            replica=extra.get(CFG_REPLICA),
            export=extra.get(CFG_EXPORT),
            guard=_switch(extra.get(CFG_GUARD)),
            checksum_rate=float(extra.get(CFG_CHECKSUM_RATE, 0.0)),
            registry=extra.get(CFG_REGISTRY),
            prevent=_switch(extra.get(CFG_PREVENT)),
            sample_rate=sample_rate(extra.get(CFG_SAMPLE_RATE, 1.0), f'extra_config["{CFG_SAMPLE_RATE}"]'),
        )


def _switch(value: Any) -> bool:
    return str(value).lower() in ("1", "true", "yes")


class Runtime:
    def __init__(self, options: Options, emitter: Emitter | None = None) -> None:
        self.options = options
        self.registry = StoreRegistry(options.registry) if options.registry else None
        self.hash_algo: str | None = None
        self._sampler = request_sampler(options.sample_rate)
        self._emitter = emitter
        self._owns_emitter = emitter is None
        self._lock = threading.Lock()
        # By chunk hash, not by key: CacheEngineKey hashes and compares in Python, at every
        # chunk of every store and fetch; and a chunk hash, the hash of its whole prefix,
        # alone fixes the chunk's token range.
        self._ranges: dict[int | bytes, tuple[int, int]] = {}

    def emitter(self, config: LMCacheEngineConfig, metadata: LMCacheMetadata) -> Emitter:
        if self._emitter is None:
            with self._lock:
                if self._emitter is None:
                    self._emitter = self._make_emitter(config, metadata)
        return self._emitter

    def _make_emitter(self, config: LMCacheEngineConfig, metadata: LMCacheMetadata) -> Emitter:
        import lmcache

        replica = self.options.replica or config.lmcache_instance_id or "lmcache"
        return setup_emitter(
            replica,
            self.options.export,
            engine="lmcache",
            engine_version=lmcache.__version__,
            kv=self.kv_config(config, metadata),
            sample_rate=self.options.sample_rate,
        )

    def records(self, engine_request_id: str | None, link: Link | None) -> bool:
        """Whether an operation on this request is recorded (docs/design.md section 3.10): as the
        layer above chose, where a link names its operation, else as this runtime's sampler does
        (with the same request id, the same choice)."""
        if link is not None:
            return link.parent is not UNRECORDED
        sampler = self._sampler
        return sampler is None or sampler(engine_request_id)

    def kv_config(self, config: LMCacheEngineConfig, metadata: LMCacheMetadata) -> KVConfig:
        """The engine's own configuration, as its resource declares it and the guard checks it,
        with the fingerprint its keys carry under `prevent` (docs/design.md section 4.5)."""
        geometry = geometry_of(config, metadata, saves_only_first_rank(config, metadata))
        return msgspec.structs.replace(geometry_config(config, metadata), hash_algo=self.hash_algo, geometry=geometry)

    def ranges_to_fill(self) -> dict[int | bytes, tuple[int, int]]:
        """The token ranges by chunk hash, for a hashing of a prompt's chunks to add theirs to
        (`ranges[key.chunk_hash] = (start, end)`). Bounded here, before each: a hashing adds a
        prompt's chunks at most."""
        ranges = self._ranges
        if len(ranges) > _MAX_RANGES:
            # Dicts keep insertion order: drop the oldest quarter in one go.
            for old in list(ranges)[: _MAX_RANGES // 4]:
                ranges.pop(old, None)
        return ranges

    def range_of(self, key: CacheEngineKey) -> tuple[int, int] | None:
        return self._ranges.get(key.chunk_hash)

    def last_range(self, keys: Sequence[CacheEngineKey]) -> tuple[int, int] | None:
        """The token range of an operation's last key: where it ends (None without keys)."""
        return self._ranges.get(keys[-1].chunk_hash) if keys else None

    def ranges_of(self, keys: Sequence[CacheEngineKey]) -> list[tuple[int, int] | None]:
        """`range_of` each key, in one call (an operation's chunks, on the serving thread):
        a loop in C, where a list comprehension is a Python call of its own (Python 3.11)."""
        return list(map(self._ranges.get, map(_CHUNK_HASH, keys)))

    def flush(self) -> None:
        if self._emitter is not None:
            self._emitter.flush()

    def close(self) -> None:
        """Export what was recorded; shut down the emitter if this runtime made it."""
        if self._emitter is None:
            return
        if self._owns_emitter:
            self._emitter.shutdown()
        else:
            self._emitter.flush()


def geometry_config(config: LMCacheEngineConfig | None, metadata: LMCacheMetadata) -> KVConfig:
    """The engine's configuration but the hash algorithm; the layout absent when `config` is unknown."""
    layers, _, _, kv_heads, head_size = metadata.kv_shape
    return KVConfig(
        model=metadata.model_name,
        dtype=str(metadata.kv_dtype).removeprefix("torch."),
        layout=expected_format(config, metadata) if config is not None else None,
        block_size=metadata.chunk_size,
        world_size=metadata.world_size,
        rank=metadata.worker_id,
        layers=layers,
        kv_heads=kv_heads,
        head_size=head_size,
    )


def geometry_of(
    config: LMCacheEngineConfig | None, metadata: LMCacheMetadata, first_rank_only: bool, *, rank_zero: bool = False
) -> str:
    """The geometry fingerprint of an engine's pages (docs/design.md section 4.5); with
    `rank_zero`, that of the same engine's rank 0: the value a prevented key carries."""
    kv = geometry_config(config, metadata)
    if first_rank_only:
        # LMCache's MLA keys are the same on every rank (world size 1, rank 0): so is the fingerprint.
        kv = msgspec.structs.replace(kv, world_size=1, rank=0)
    elif rank_zero:
        kv = msgspec.structs.replace(kv, rank=0)
    return geometry_fingerprint(kv)


def saves_only_first_rank(config: LMCacheEngineConfig, metadata: LMCacheMetadata) -> bool:
    """Whether only the first rank stores (MLA), as LMCache's engine and token database decide it."""
    return bool(metadata.use_mla and config.get_extra_config_value("save_only_first_rank", metadata.use_mla))


def expected_format(config: LMCacheEngineConfig, metadata: LMCacheMetadata) -> str:
    """The memory format this engine allocates its pages in (as `LMCacheEngine` picks it)."""
    if metadata.use_mla:
        return "KV_MLA_FMT"
    if config.use_layerwise:
        return "KV_2TD" if config.enable_blending else "KV_T2D"
    return "KV_2LTD"


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()
_failures = 0


def failed(what: str, exc: BaseException) -> None:
    """A hook failed and LMCache carries on unobserved: say so once, then count."""
    global _failures
    _failures += 1
    if _failures == 1:
        logger.warning("kvaudit: LMCache %s not recorded (%r); further failures are logged at debug level", what, exc)
    else:
        logger.debug("kvaudit: LMCache %s not recorded (%r)", what, exc)


def failures() -> int:
    """How many operations the hooks failed to record in this process."""
    return _failures


def current() -> Runtime | None:
    return _runtime


def install(runtime: Runtime) -> Runtime:
    global _runtime
    with _runtime_lock:
        _runtime = runtime
    return runtime


def clear() -> None:
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
        _runtime = None
